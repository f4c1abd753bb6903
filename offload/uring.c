/* uring.c - the NVMe reader (see uring.h). */
#include "offload/uring.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "src/core/err.h"

#ifdef FT_HAVE_URING
#include <liburing.h>
#endif

#define FIXED_PIECE ((size_t)1 << 30) /* the kernel's limit on one registered buffer */
#define TAG_SHIFT 56                  /* user_data: extent slot << 56 | chunk start */

/* One queued extent: its direct-read part [off, off + len) into buf, chunks submitted up to
 * `next`, completed bytes `done` (chunks complete in any order; the extent is complete when
 * done == len). */
typedef struct rd_ext {
    char *buf;
    size_t len, next, done;
    uint64_t off, tag;
} rd_ext;

struct ft_reader {
    char path[4096];
    int fd;          /* page-cache descriptor: head/tail bytes and the pread fallback */
    int dfd;         /* O_DIRECT descriptor, -1 when not in use */
    int depth;
    size_t chunk;
    uint64_t bytes, fixed_reads;
    char mode[320], base_mode[256];
    rd_ext q[FT_READER_MAX_QUEUED]; /* a ring: q_n extents from q_head */
    int q_head, q_n, inflight;
    int fixed_n, fixed_bufs;        /* registered pieces, and the buffers they came from */
    struct iovec fixed[FT_READER_MAX_FIXED];
#ifdef FT_HAVE_URING
    struct io_uring ring;
    int ring_ok;
#endif
};

const char *ft_reader_mode(const ft_reader *r) { return r->mode; }
uint64_t ft_reader_bytes(const ft_reader *r) { return r->bytes; }
uint64_t ft_reader_fixed_reads(const ft_reader *r) { return r->fixed_reads; }
int ft_reader_depth(const ft_reader *r) { return r->depth; }
size_t ft_reader_chunk(const ft_reader *r) { return r->chunk; }
int ft_reader_queued(const ft_reader *r) { return r->q_n; }

uint64_t ft_reader_unsubmitted(const ft_reader *r)
{
    uint64_t n = 0;
    for (int i = 0; i < r->q_n; i++) {
        const rd_ext *x = &r->q[(r->q_head + i) % FT_READER_MAX_QUEUED];
        n += x->len - x->next;
    }
    return n;
}

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

static void set_mode(ft_reader *r)
{
    if (r->fixed_n)
        snprintf(r->mode, sizeof r->mode, "%s, %d registered buffer%s", r->base_mode, r->fixed_bufs,
                 r->fixed_bufs == 1 ? "" : "s");
    else
        snprintf(r->mode, sizeof r->mode, "%s", r->base_mode);
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
        snprintf(r->base_mode, sizeof r->base_mode, "io_uring + O_DIRECT (queue depth %d, %zu KiB chunks)",
                 r->depth, r->chunk / 1024);
    else
        snprintf(r->base_mode, sizeof r->base_mode, "pread (%s)", why);
    set_mode(r);
    *out = r;
    return 0;
}

void ft_reader_close(ft_reader *r)
{
    if (!r) return;
    ft_reader_cancel(r);
#ifdef FT_HAVE_URING
    if (r->ring_ok) io_uring_queue_exit(&r->ring);
#endif
    if (r->dfd >= 0) close(r->dfd);
    close(r->fd);
    free(r);
}

/* ---- the ring ------------------------------------------------------------------------- */

#ifdef FT_HAVE_URING
/* The registered piece holding [p, p + n), or -1. */
static int fixed_index(const ft_reader *r, const char *p, size_t n)
{
    for (int i = 0; i < r->fixed_n; i++) {
        const char *b = r->fixed[i].iov_base;
        if (p >= b && p + n <= b + r->fixed[i].iov_len) return i;
    }
    return -1;
}

/* Submits the queued extents' next chunks, in order, until depth chunks are in flight. */
static int ring_fill(ft_reader *r)
{
    int added = 0;
    for (int i = 0; i < r->q_n && r->inflight < r->depth; i++) {
        int slot = (r->q_head + i) % FT_READER_MAX_QUEUED;
        rd_ext *x = &r->q[slot];
        while (x->next < x->len && r->inflight < r->depth) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
            if (!sqe) break;
            size_t n = x->len - x->next < r->chunk ? x->len - x->next : r->chunk;
            char *p = x->buf + x->next;
            int fi = fixed_index(r, p, n);
            if (fi >= 0) {
                io_uring_prep_read_fixed(sqe, r->dfd, p, (unsigned)n, x->off + x->next, fi);
                r->fixed_reads++;
            } else {
                io_uring_prep_read(sqe, r->dfd, p, (unsigned)n, x->off + x->next);
            }
            io_uring_sqe_set_data64(sqe, (uint64_t)slot << TAG_SHIFT | x->next);
            x->next += n;
            r->inflight++;
            added++;
        }
    }
    if (!added) return 0;
    int rc = io_uring_submit(&r->ring);
    if (rc < 0) return ft_err(rc, "%s: io_uring submit: %s", r->path, strerror(-rc));
    return 0;
}

/* Handles one completion (waiting for it when wait != 0). Returns 1 (handled), 0 (none
 * ready, wait == 0) or an error for the chunk. */
static int ring_reap(ft_reader *r, int wait)
{
    struct io_uring_cqe *cqe;
    int rc;
    do {
        rc = wait ? io_uring_wait_cqe(&r->ring, &cqe) : io_uring_peek_cqe(&r->ring, &cqe);
    } while (rc == -EINTR);
    if (rc == -EAGAIN && !wait) return 0;
    if (rc < 0) return ft_err(rc, "%s: io_uring wait: %s", r->path, strerror(-rc));
    uint64_t ud = io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&r->ring, cqe);
    r->inflight--;
    rd_ext *x = &r->q[ud >> TAG_SHIFT];
    size_t start = (size_t)(ud & (((uint64_t)1 << TAG_SHIFT) - 1));
    size_t want = x->len - start < r->chunk ? x->len - start : r->chunk;
    if (res < 0)
        return ft_err(res, "%s: read at offset %llu: %s", r->path,
                      (unsigned long long)(x->off + start), strerror(-res));
    if ((size_t)res < want) {
        if (res == 0)
            return ft_err(FT_E_CORRUPT, "%s: the file ends before offset %llu", r->path,
                          (unsigned long long)(x->off + start + want));
        /* finish this chunk synchronously through the page cache (rare: end of file) */
        FT_TRY(pread_all(r, r->fd, x->buf + start + res, want - (size_t)res,
                         x->off + start + (size_t)res));
    }
    x->done += want;
    return 1;
}
#endif

void ft_reader_cancel(ft_reader *r)
{
    if (!r) return;
#ifdef FT_HAVE_URING
    while (r->inflight > 0) { /* the kernel still writes into the buffers: let it finish */
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&r->ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0) break; /* the ring is unusable: nothing more will complete */
        io_uring_cqe_seen(&r->ring, cqe);
        r->inflight--;
    }
#endif
    r->inflight = 0;
    r->q_n = 0;
    r->q_head = 0;
}

/* After a failed chunk: everything in flight finishes, the queue is dropped, the message of
 * the failure is kept. */
static int fail(ft_reader *r, int rc)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ft_errmsg());
    ft_reader_cancel(r);
    return ft_err(rc, "%s", msg);
}

/* ---- reading -------------------------------------------------------------------------- */

int ft_reader_queue(ft_reader *r, void *buf, size_t len, uint64_t off, uint64_t tag)
{
    if (r->q_n >= FT_READER_MAX_QUEUED)
        return ft_err(FT_E_RANGE, "%s: %d reads queued already", r->path, r->q_n);
    char *p = buf;
    size_t head = 0, mid = 0, tail = len;
#ifdef FT_HAVE_URING
    if (r->dfd >= 0 && ((uintptr_t)p % FT_READER_ALIGN) == off % FT_READER_ALIGN) {
        /* head up to the first aligned offset and tail after the last through the page cache */
        head = (size_t)((FT_READER_ALIGN - off % FT_READER_ALIGN) % FT_READER_ALIGN);
        if (head > len) head = len;
        mid = (len - head) / FT_READER_ALIGN * FT_READER_ALIGN;
        tail = len - head - mid;
    }
#endif
    if (mid == 0) { /* the pread path (or a range too small for a direct read) */
        head = 0;
        tail = len;
    }
    if (head) FT_TRY(pread_all(r, r->fd, p, head, off));
    if (tail) FT_TRY(pread_all(r, r->fd, p + head + mid, tail, off + head + mid));
    rd_ext *x = &r->q[(r->q_head + r->q_n) % FT_READER_MAX_QUEUED];
    memset(x, 0, sizeof *x);
    x->buf = p + head;
    x->len = mid;
    x->off = off + head;
    x->tag = tag;
    r->q_n++;
    r->bytes += len;
    return 0;
}

int ft_reader_poll(ft_reader *r, int wait, uint64_t *tag)
{
    if (r->q_n == 0) return 0;
    rd_ext *x = &r->q[r->q_head];
#ifdef FT_HAVE_URING
    if (r->ring_ok) {
        int rc = ring_fill(r);
        while (rc >= 0 && (rc = ring_reap(r, 0)) > 0) {
        }
        if (rc >= 0 && wait && x->done < x->len && r->inflight > 0) {
            rc = ring_reap(r, 1);
            while (rc >= 0 && (rc = ring_reap(r, 0)) > 0) {
            }
        }
        if (rc >= 0) rc = ring_fill(r); /* keep the ring full while the caller works */
        if (rc < 0) return fail(r, rc);
    }
#else
    (void)wait;
#endif
    if (x->done < x->len) return 0;
    *tag = x->tag;
    r->q_head = (r->q_head + 1) % FT_READER_MAX_QUEUED;
    r->q_n--;
    return 1;
}

int ft_reader_read(ft_reader *r, void *buf, size_t len, uint64_t off)
{
    if (r->q_n)
        return ft_err(FT_E_INVALID, "%s: ft_reader_read with %d queued reads pending", r->path, r->q_n);
    FT_TRY(ft_reader_queue(r, buf, len, off, 0));
    uint64_t tag;
    int rc;
    while ((rc = ft_reader_poll(r, 1, &tag)) == 0) {
    }
    return rc < 0 ? rc : 0;
}

int ft_reader_register(ft_reader *r, void *const *bufs, const size_t *lens, int n)
{
#ifdef FT_HAVE_URING
    if (!r->ring_ok)
        return ft_err(FT_E_UNSUPPORTED, "%s: no io_uring ring (%s): buffers not registered",
                      r->path, r->base_mode);
    if (r->q_n) return ft_err(FT_E_INVALID, "%s: register with reads queued", r->path);
    if (r->fixed_n) {
        io_uring_unregister_buffers(&r->ring);
        r->fixed_n = 0;
        set_mode(r);
    }
    struct iovec iov[FT_READER_MAX_FIXED];
    int k = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        for (size_t o = 0; o < lens[i]; o += FIXED_PIECE) {
            if (k == FT_READER_MAX_FIXED)
                return ft_err(FT_E_RANGE, "%s: more than %d buffer pieces of up to 1 GiB to register",
                              r->path, FT_READER_MAX_FIXED);
            iov[k].iov_base = (char *)bufs[i] + o;
            iov[k].iov_len = lens[i] - o < FIXED_PIECE ? lens[i] - o : FIXED_PIECE;
            total += iov[k].iov_len;
            k++;
        }
    int rc = io_uring_register_buffers(&r->ring, iov, (unsigned)k);
    if (rc < 0)
        return ft_err(rc, "%s: io_uring cannot register %d buffers (%.1f MiB): %s%s", r->path, n,
                      total / 1048576.0, strerror(-rc),
                      rc == -ENOMEM ? " (locked-memory limit: ulimit -l, or CAP_IPC_LOCK)" : "");
    memcpy(r->fixed, iov, (size_t)k * sizeof iov[0]);
    r->fixed_n = k;
    r->fixed_bufs = n;
    set_mode(r);
    return 0;
#else
    (void)bufs, (void)lens, (void)n;
    return ft_err(FT_E_UNSUPPORTED, "%s: built without liburing: buffers not registered", r->path);
#endif
}
