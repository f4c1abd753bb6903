/* uring.c - the NVMe reader (see uring.h). */
#include "offload/uring.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/core/err.h"

#ifdef FT_HAVE_URING
#include <liburing.h>
#endif

struct ft_reader {
    char path[4096];
    int fd;          /* page-cache descriptor: head/tail bytes and the pread fallback */
    int dfd;         /* O_DIRECT descriptor, -1 when not in use */
    int depth;
    size_t chunk;
    uint64_t bytes;
    char mode[256];
#ifdef FT_HAVE_URING
    struct io_uring ring;
    int ring_ok;
#endif
};

const char *ft_reader_mode(const ft_reader *r) { return r->mode; }
uint64_t ft_reader_bytes(const ft_reader *r) { return r->bytes; }

static int pread_all(ft_reader *r, int fd, void *buf, size_t len, uint64_t off)
{
    char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return ft_err(-errno, "%s: read at offset %llu: %s", r->path, (unsigned long long)off,
                                 strerror(errno));
        if (n == 0)
            return ft_err(FT_E_CORRUPT, "%s: the file ends before offset %llu (%zu bytes short)",
                          r->path, (unsigned long long)off, len);
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

int ft_reader_open(ft_reader **out, const char *path, int queue_depth, size_t chunk_bytes,
                   int want_direct)
{
    *out = NULL;
    ft_reader *r = calloc(1, sizeof *r);
    if (!r) return ft_err(-ENOMEM, "%s: out of memory", path);
    snprintf(r->path, sizeof r->path, "%s", path);
    r->depth = queue_depth > 0 ? (queue_depth > 256 ? 256 : queue_depth) : 8;
    r->chunk = chunk_bytes ? (chunk_bytes + FT_READER_ALIGN - 1) / FT_READER_ALIGN * FT_READER_ALIGN
                           : (size_t)1 << 20;
    r->dfd = -1;
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        int e = errno;
        free(r);
        return ft_err(-e, "%s: cannot open: %s", path, strerror(e));
    }
    const char *why = "page cache requested";
    if (want_direct) {
#ifdef FT_HAVE_URING
        r->dfd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (r->dfd < 0) {
            why = errno == EINVAL ? "O_DIRECT is not supported by this file system" : strerror(errno);
        } else {
            int rc = io_uring_queue_init((unsigned)r->depth, &r->ring, 0);
            if (rc < 0) {
                why = rc == -ENOSYS ? "io_uring is not available (kernel or seccomp)" : strerror(-rc);
                close(r->dfd);
                r->dfd = -1;
            } else {
                r->ring_ok = 1;
            }
        }
#else
        why = "built without liburing";
#endif
    }
    if (r->dfd >= 0)
        snprintf(r->mode, sizeof r->mode, "io_uring + O_DIRECT (queue depth %d, %zu KiB chunks)",
                 r->depth, r->chunk / 1024);
    else
        snprintf(r->mode, sizeof r->mode, "pread (%s)", why);
    *out = r;
    return 0;
}

void ft_reader_close(ft_reader *r)
{
    if (!r) return;
#ifdef FT_HAVE_URING
    if (r->ring_ok) io_uring_queue_exit(&r->ring);
#endif
    if (r->dfd >= 0) close(r->dfd);
    close(r->fd);
    free(r);
}

#ifdef FT_HAVE_URING
/* The aligned middle [off, off + len) with O_DIRECT through the ring, up to depth chunks in
 * flight; a short completion is resubmitted for the rest of its chunk. */
static int uring_read(ft_reader *r, char *buf, size_t len, uint64_t off)
{
    size_t next = 0, done = 0;
    int inflight = 0;
    while (done < len) {
        while (inflight < r->depth && next < len) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
            if (!sqe) break;
            size_t n = len - next < r->chunk ? len - next : r->chunk;
            io_uring_prep_read(sqe, r->dfd, buf + next, (unsigned)n, off + next);
            io_uring_sqe_set_data64(sqe, next); /* the chunk's start; its length is recomputed */
            next += n;
            inflight++;
        }
        int rc = io_uring_submit(&r->ring);
        if (rc < 0) return ft_err(rc, "%s: io_uring submit: %s", r->path, strerror(-rc));
        struct io_uring_cqe *cqe;
        rc = io_uring_wait_cqe(&r->ring, &cqe);
        if (rc < 0) return ft_err(rc, "%s: io_uring wait: %s", r->path, strerror(-rc));
        size_t start = (size_t)cqe->user_data;
        int res = cqe->res;
        io_uring_cqe_seen(&r->ring, cqe);
        inflight--;
        size_t want = len - start < r->chunk ? len - start : r->chunk;
        if (res < 0)
            return ft_err(res, "%s: read at offset %llu: %s", r->path,
                          (unsigned long long)(off + start), strerror(-res));
        if ((size_t)res < want) {
            if (res == 0)
                return ft_err(FT_E_CORRUPT, "%s: the file ends before offset %llu", r->path,
                              (unsigned long long)(off + start + want));
            /* finish this chunk synchronously through the page cache (rare: end of file) */
            FT_TRY(pread_all(r, r->fd, buf + start + res, want - (size_t)res, off + start + (size_t)res));
        }
        done += want;
    }
    return 0;
}
#endif

int ft_reader_read(ft_reader *r, void *buf, size_t len, uint64_t off)
{
    char *p = buf;
    r->bytes += len;
#ifdef FT_HAVE_URING
    if (r->dfd >= 0 && ((uintptr_t)p % FT_READER_ALIGN) == off % FT_READER_ALIGN) {
        /* head up to the first aligned offset and tail after the last through the page cache */
        size_t head = (size_t)((FT_READER_ALIGN - off % FT_READER_ALIGN) % FT_READER_ALIGN);
        if (head > len) head = len;
        size_t mid = (len - head) / FT_READER_ALIGN * FT_READER_ALIGN, tail = len - head - mid;
        if (head) FT_TRY(pread_all(r, r->fd, p, head, off));
        if (mid) FT_TRY(uring_read(r, p + head, mid, off + head));
        if (tail) FT_TRY(pread_all(r, r->fd, p + head + mid, tail, off + head + mid));
        return 0;
    }
#endif
    return pread_all(r, r->fd, p, len, off);
}
