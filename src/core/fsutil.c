/* fsutil.c - file helpers (see fsutil.h). */
#include "src/core/fsutil.h"

#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/err.h"

/* Opens path read-only and checks that it is a regular file; *fd and *size on success. */
static int open_regular(const char *path, const char *what, int *fd_out, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ft_err(-errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return ft_err(-e, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ft_err(S_ISDIR(st.st_mode) ? -EISDIR : FT_E_INVALID, "%s: %s, expected %s", path,
                      S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file", what);
    }
    *fd_out = fd;
    *size = (size_t)st.st_size;
    return 0;
}

int ft_map_file(const char *path, const char *what, const void **map, size_t *size)
{
    int fd;
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

int ft_read_file(const char *path, char **data, size_t *len)
{
    int fd;
    size_t n;
    FT_TRY(open_regular(path, "a file", &fd, &n));
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return ft_err(-ENOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return ft_err(-e, "%s: read failed at offset %zu: %s", path, got, strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *data = buf;
    if (len) *len = n;
    return 0;
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

int ft_write_file_atomic(const char *path, const void *data, size_t len)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return ft_err(FT_E_RANGE, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return ft_err(-errno, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(fd);
            unlink(tmp);
            return ft_err(-e, "%s: write failed at offset %zu: %s", path, len - left, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) < 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return ft_err(-e, "%s: fsync failed: %s", path, strerror(e));
    }
    if (close(fd) < 0) {
        int e = errno;
        unlink(tmp);
        return ft_err(-e, "%s: close failed: %s", path, strerror(e));
    }
    if (rename(tmp, path) < 0) {
        int e = errno;
        unlink(tmp);
        return ft_err(-e, "%s: rename failed: %s", path, strerror(e));
    }
    ft_fsync_parent(path);
    return 0;
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
