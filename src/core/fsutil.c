/* fsutil.c - file helpers (see fsutil.h); gzip through zlib (inflate, RFC 1952). */
#include "src/core/fsutil.h"

#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <zlib.h>

#include "src/core/err.h"

/* Opens path read-only with O_NONBLOCK, so that a FIFO without a writer (or a device that
 * waits for a carrier) never blocks in open(); *st gets its fstat. The caller decides what
 * kinds it takes and clears O_NONBLOCK (clear_nonblock) before reading a stream. */
static int open_nonblock(const char *path, int *fd_out, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return ft_err(-errno, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, st) < 0) {
        int e = errno;
        close(fd);
        return ft_err(-e, "%s: cannot stat: %s", path, strerror(e));
    }
    *fd_out = fd;
    return 0;
}

static int clear_nonblock(int fd, const char *name)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || (fl & O_NONBLOCK && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0))
        return ft_err(-errno, "%s: fcntl: %s", name, strerror(errno));
    return 0;
}

/* Opens path read-only and checks that it is a regular file; *fd and *size on success.
 * Never blocks in open() (a FIFO there is refused at once). */
static int open_regular(const char *path, const char *what, int *fd_out, size_t *size)
{
    int fd = -1;
    struct stat st;
    FT_TRY(open_nonblock(path, &fd, &st));
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ft_err(S_ISDIR(st.st_mode) ? -EISDIR : FT_E_INVALID, "%s: %s, expected %s", path,
                      S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file", what);
    }
    int rc = clear_nonblock(fd, path);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    *size = (size_t)st.st_size;
    return 0;
}

int ft_map_file(const char *path, const char *what, const void **map, size_t *size)
{
    int fd = -1;
    *map = NULL;
    FT_TRY(open_regular(path, what, &fd, size));
    if (*size == 0) {
        close(fd);
        return 0;
    }
    void *m = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return ft_err(-e, "%s: mmap of %zu bytes failed: %s", path, *size, strerror(e));
    *map = m;
    return 0;
}

void ft_unmap_file(const void *map, size_t size)
{
    if (map && size) munmap((void *)map, size);
}


/* ---- whole-file and data readers -------------------------------------------------------- */

/* Reads exactly n bytes of a regular file into buf (its size from fstat). */
static int read_exact(int fd, const char *name, char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            return ft_err(-e, "%s: read failed at offset %zu: %s", name, got, strerror(e));
        }
        got += (size_t)r;
    }
    return 0;
}

/* Grows *buf (capacity *cap, holding `used` bytes) to at least used + want bytes plus a NUL,
 * doubling, never beyond max + 1. -ENOMEM when full at max or when malloc fails. */
static int grow(char **buf, size_t *cap, size_t used, size_t max, const char *name,
                const char *what, const char *why)
{
    if (used < *cap) return 0;
    if (*cap > max)
        return ft_err(-ENOMEM, "%s: %s more than %zu bytes, the limit of one input (%s)", name,
                      what, max, why);
    size_t nc = *cap ? *cap * 2 : (size_t)64 << 10;
    if (nc < *cap || nc > max + 1) nc = max + 1; /* the last byte is only there to see EOF */
    char *p = realloc(*buf, nc + 1);
    if (!p) return ft_err(-ENOMEM, "%s: out of memory (%zu bytes)", name, nc + 1);
    *buf = p;
    *cap = nc;
    return 0;
}

/* Reads a stream (pipe, FIFO, terminal, device, socket) to EOF into a growing buffer that
 * starts with head[0..head_n) (bytes already taken from it). A descriptor left non-blocking
 * by someone else (stdin) is waited on with poll. More than max bytes: -ENOMEM. */
static int read_stream(int fd, const char *name, size_t max, const char *why, const char *head,
                       size_t head_n, char **data, size_t *len)
{
    char *buf = NULL;
    size_t cap = 0, used = 0;
    int rc = 0;
    while (used < head_n && !(rc = grow(&buf, &cap, used, max, name, "reading", why))) {
        size_t k = head_n - used < cap - used ? head_n - used : cap - used;
        memcpy(buf + used, head + used, k);
        used += k;
    }
    for (;;) {
        if (rc < 0 || (rc = grow(&buf, &cap, used, max, name, "reading", why)) < 0) {
            free(buf);
            return rc;
        }
        ssize_t r = read(fd, buf + used, cap - used);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, -1) >= 0 || errno == EINTR) continue;
        }
        if (r < 0) {
            int e = errno;
            free(buf);
            return ft_err(-e, "%s: read failed at offset %zu: %s", name, used, strerror(e));
        }
        if (r == 0) break;
        used += (size_t)r;
    }
    if (used > max) {
        free(buf);
        return ft_err(-ENOMEM, "%s: reading more than %zu bytes, the limit of one input (%s)", name,
                      max, why);
    }
    buf[used] = 0;
    *data = buf;
    *len = used;
    return 0;
}

/* 1 when fd is an anonymous pipe (pipe(2), a shell's `a | b` or `<(cmd)` seen through
 * /dev/fd/N), 0 for a named FIFO. */
static int is_anon_pipe(int fd)
{
#ifdef __linux__
    struct statfs sf;
    return fstatfs(fd, &sf) == 0 && sf.f_type == 0x50495045; /* PIPEFS_MAGIC, linux/magic.h */
#else
    (void)fd;
    return 0;
#endif
}

/* Decompresses the gzip data in[0..n) (RFC 1952; every member of a concatenation, as gzip -d
 * does; zero bytes after the last member, tar's padding, are ignored) with zlib into a
 * malloc'ed NUL-terminated buffer of at most max bytes. */
static int gunzip(const char *name, const unsigned char *in, size_t n, size_t max, const char *why, char **out,
                  size_t *out_n)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) /* 16: gzip wrapper only */
        return ft_err(-ENOMEM, "%s: out of memory starting zlib", name);
    char *buf = NULL;
    size_t cap = 0, used = 0, off = 0; /* off: compressed bytes given to zlib so far */
    int rc = 0;
    for (;;) {
        if ((rc = grow(&buf, &cap, used, max, name, "decompresses to", why)) < 0) break;
        if (zs.avail_in == 0 && off < n) { /* avail_in is 32-bit: at most 1 GiB at a time */
            size_t k = n - off < ((size_t)1 << 30) ? n - off : (size_t)1 << 30;
            zs.next_in = (unsigned char *)in + off;
            zs.avail_in = (uInt)k;
            off += k;
        }
        size_t room = cap - used < ((size_t)1 << 30) ? cap - used : (size_t)1 << 30;
        zs.next_out = (unsigned char *)buf + used;
        zs.avail_out = (uInt)room;
        int z = inflate(&zs, Z_NO_FLUSH);
        used += room - zs.avail_out;
        size_t at = off - zs.avail_in; /* compressed offset zlib has reached */
        if (z == Z_STREAM_END) {
            if (at == n) break;
            if (n - at >= 2 && in[at] == 0x1f && in[at + 1] == 0x8b) { /* the next member */
                inflateReset(&zs);
                continue;
            }
            size_t z0 = at;
            while (z0 < n && in[z0] == 0) z0++;
            if (z0 == n) break;
            rc = ft_err(FT_E_CORRUPT, "%s: gzip data corrupt at byte %zu: %zu bytes after the "
                        "end of a member that are not another gzip member", name, at, n - at);
            break;
        }
        if (z == Z_MEM_ERROR) {
            rc = ft_err(-ENOMEM, "%s: out of memory in zlib", name);
            break;
        }
        if (z == Z_DATA_ERROR || z == Z_NEED_DICT || z == Z_STREAM_ERROR) {
            rc = ft_err(FT_E_CORRUPT, "%s: gzip data corrupt at byte %zu (%s)", name, at,
                        zs.msg ? zs.msg : "invalid data");
            break;
        }
        /* Z_OK or Z_BUF_ERROR: zlib wants more input or more room */
        if (zs.avail_in == 0 && off == n && zs.avail_out > 0) {
            rc = ft_err(FT_E_CORRUPT, "%s: gzip data truncated at byte %zu (the data ends inside "
                        "a gzip member)", name, n);
            break;
        }
    }
    inflateEnd(&zs);
    if (!rc && used > max)
        rc = ft_err(-ENOMEM, "%s: decompresses to more than %zu bytes, the limit of one input",
                    name, max);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    if (!buf && (buf = malloc(1)) == NULL) return ft_err(-ENOMEM, "%s: out of memory", name);
    buf[used] = 0;
    *out = buf;
    *out_n = used;
    return 0;
}

/* Set once standard input has been read by ft_read_input("-"): it can be read once. */
static int g_stdin_taken;

int ft_input_is_stdin(const char *path)
{
    return path && !strcmp(path, "-");
}

const char *ft_input_name(const char *path)
{
    return ft_input_is_stdin(path) ? "<stdin>" : path;
}

size_t ft_input_mem_bound(int stream)
{
    uint64_t mem = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < mem)
        mem = rl.rlim_cur;
    uint64_t b = stream ? mem / 4 : mem / 2;
    if (b == 0 || b > FT_INPUT_MAX_BYTES) b = FT_INPUT_MAX_BYTES;
    return (size_t)b;
}

int ft_read_input_max(const char *path, const char *what, char **data, size_t *len,
                      unsigned flags, size_t max_bytes)
{
    const char *name = ft_input_name(path);
    if (max_bytes > SIZE_MAX / 4) max_bytes = SIZE_MAX / 4; /* grow()'s max + 1 and doubling stay in range */
    /* a stream (and what gzip expands to) is bounded by the memory there is, so that an
     * endless one (/dev/zero, `yes |`) ends with a message, not with the OOM killer */
    size_t stream_max = ft_input_mem_bound(1), file_max = ft_input_mem_bound(0);
    if (stream_max > max_bytes) stream_max = max_bytes;
    if (file_max > max_bytes) file_max = max_bytes;
    const char *why = stream_max < max_bytes ? "a quarter of the memory: physical, or `ulimit -v`"
                                             : "of this reader";
    char *raw = NULL;
    size_t n = 0;
    int rc;
    if ((flags & FT_INPUT_STREAM) && ft_input_is_stdin(path)) {
        /* a terminal is refused before standard input is marked read: nothing was read */
        if (isatty(STDIN_FILENO))
            return ft_err(FT_E_INVALID, "%s: standard input is a terminal: pipe %s into it "
                          "(cmd | ftune ... -) or name a file", name, what);
        if (__atomic_exchange_n(&g_stdin_taken, 1, __ATOMIC_SEQ_CST))
            return ft_err(FT_E_INVALID, "%s: standard input was already read by another input "
                          "named '-' (one input at most can be '-')", name);
        FT_TRY(read_stream(STDIN_FILENO, name, stream_max, why, NULL, 0, &raw, &n));
    } else {
        int fd = -1;
        struct stat st;
        FT_TRY(open_nonblock(path, &fd, &st));
        int stream = !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
        if (!S_ISREG(st.st_mode) && !(stream && (flags & FT_INPUT_STREAM))) {
            close(fd);
            return ft_err(S_ISDIR(st.st_mode) ? -EISDIR : FT_E_INVALID, "%s: %s, expected %s",
                          path, S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file", what);
        }
        /* standard input under another name (/dev/stdin, /dev/fd/0) when it is a pipe or a
         * socket, which can be read once (a device such as /dev/null can be read again) */
        struct stat si;
        if ((S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) && fstat(STDIN_FILENO, &si) == 0 && si.st_dev == st.st_dev &&
            si.st_ino == st.st_ino && __atomic_exchange_n(&g_stdin_taken, 1, __ATOMIC_SEQ_CST)) {
            close(fd);
            return ft_err(FT_E_INVALID, "%s: this is standard input, already read by another "
                          "input (one input at most can be standard input)", path);
        }
        char head[1];
        size_t head_n = 0;
        if (S_ISFIFO(st.st_mode) && !is_anon_pipe(fd)) {
            /* a named FIFO opened without waiting: a read that returns 0 bytes while still
             * non-blocking means that no writer has it open (with one, it says EAGAIN) */
            ssize_t r;
            do r = read(fd, head, 1); while (r < 0 && errno == EINTR);
            if (r == 0) {
                close(fd);
                return ft_err(FT_E_INVALID, "%s: a FIFO with no writer: nothing to read (start "
                              "the program that writes it first, or pass a pipe: <(cmd), or "
                              "cmd | ftune ... -)", path);
            }
            if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                int e = errno;
                close(fd);
                return ft_err(-e, "%s: read failed at offset 0: %s", path, strerror(e));
            }
            if (r == 1) head_n = 1;
        }
        rc = clear_nonblock(fd, path);
        if (rc < 0) {
            close(fd);
            return rc;
        }
        if (stream) {
            rc = read_stream(fd, path, stream_max, why, head, head_n, &raw, &n);
        } else if ((size_t)st.st_size > file_max) {
            rc = ft_err(-ENOMEM, "%s: %lld bytes, more than %zu, the limit of one input here (%s)", path,
                        (long long)st.st_size, file_max, file_max < max_bytes ? "half of the memory: physical, or `ulimit -v`" : "of this reader");
        } else {
            n = (size_t)st.st_size;
            raw = malloc(n + 1);
            if (!raw) rc = ft_err(-ENOMEM, "%s: out of memory reading %zu bytes", path, n);
            else if ((rc = read_exact(fd, path, raw, n)) < 0) free(raw);
            else raw[n] = 0;
        }
        close(fd);
        if (rc < 0) return rc;
    }
    if ((flags & FT_INPUT_GZIP) && n >= 2 && (unsigned char)raw[0] == 0x1f &&
        (unsigned char)raw[1] == 0x8b) {
        char *plain = NULL;
        size_t m = 0;
        rc = gunzip(name, (const unsigned char *)raw, n, stream_max, why, &plain, &m);
        free(raw);
        if (rc < 0) return rc;
        raw = plain;
        n = m;
    }
    *data = raw;
    if (len) *len = n;
    return 0;
}

int ft_read_input(const char *path, const char *what, char **data, size_t *len, unsigned flags)
{
    return ft_read_input_max(path, what, data, len, flags, FT_INPUT_MAX_BYTES);
}

int ft_read_file(const char *path, char **data, size_t *len)
{
    return ft_read_input(path, "a file", data, len, 0);
}

void ft_fsync_parent(const char *path)
{
    char *tmp = strdup(path);
    if (!tmp) return;
    int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(tmp);
}

int ft_tmp_open(const char *path, char *tmp, size_t tmp_n)
{
    if (snprintf(tmp, tmp_n, "%s.tmp.%d", path, (int)getpid()) >= (int)tmp_n)
        return ft_err(FT_E_RANGE, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ft_err(-errno, "%s: cannot create: %s", tmp, strerror(errno));
    return fd;
}

int ft_tmp_commit(int fd, const char *tmp, const char *path, int rc)
{
    if (fd >= 0) {
        if (!rc && fsync(fd) < 0) rc = ft_err(-errno, "%s: fsync failed: %s", tmp, strerror(errno));
        if (close(fd) < 0 && !rc) rc = ft_err(-errno, "%s: close failed: %s", tmp, strerror(errno));
    }
    if (!rc && rename(tmp, path) < 0)
        rc = ft_err(-errno, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
    if (rc) {
        unlink(tmp);
        return rc;
    }
    ft_fsync_parent(path);
    return 0;
}

int ft_write_file_atomic(const char *path, const void *data, size_t len)
{
    char tmp[4200];
    int fd = ft_tmp_open(path, tmp, sizeof tmp);
    if (fd < 0) return fd;
    const char *p = data;
    size_t left = len;
    int rc = 0;
    while (left && !rc) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            rc = ft_err(-e, "%s: write failed at offset %zu: %s", path, len - left, strerror(e));
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    return ft_tmp_commit(fd, tmp, path, rc);
}

int ft_mkdir_p(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return ft_err(FT_E_RANGE, "%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return ft_err(-errno, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return ft_err(-errno, "%s: cannot create directory: %s", buf, strerror(errno));
    return 0;
}

int ft_path_exists(const char *path)
{
    struct stat st;
    return path && stat(path, &st) == 0;
}

int ft_is_dir(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0) return -errno;
    return S_ISDIR(st.st_mode) ? 1 : 0;
}

int ft_path_join(char *out, size_t out_n, const char *a, const char *b)
{
    int n = snprintf(out, out_n, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= out_n)
        return ft_err(FT_E_RANGE, "path too long: %s/%s", a, b);
    return 0;
}
