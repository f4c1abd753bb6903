/* probe.c - disk and PCIe rate probes (see probe.h). */
#include "offload/probe.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "offload/pack.h"
#include "offload/uring.h"
#include "src/core/err.h"

#define TMPFS_MAGIC_ 0x01021994 /* linux/magic.h */
#define RAMFS_MAGIC_ 0x858458f6

#define SLICE_MIN ((uint64_t)64 << 20) /* shortest grid slice and read call */
#define PROBE_BUF_ALIGN ((size_t)2 << 20)   /* the read buffer: a huge page boundary */
#define PROBE_BAND 0.92 /* grid rates within 8% of the best count as equal (see probe_range) */

static const int grid_qd[FT_PROBE_GRID_QD] = {4, 8, 16, 32};
static const size_t grid_chunk[FT_PROBE_GRID_CHUNK] = {(size_t)256 << 10, (size_t)1 << 20, (size_t)4 << 20};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The length of a read call (and of a grid slice) for a setting: two full queues, at least
 * SLICE_MIN, so the ring stays full for most of the call. */
static uint64_t call_bytes(int qd, size_t chunk)
{
    uint64_t q = 2 * (uint64_t)qd * chunk;
    return q > SLICE_MIN ? q : SLICE_MIN;
}

static int file_size(const char *path, uint64_t *size)
{
    struct stat st;
    if (stat(path, &st) < 0) return ft_err(-errno, "%s: cannot stat: %s", path, strerror(errno));
    if (S_ISREG(st.st_mode)) {
        *size = (uint64_t)st.st_size;
        return 0;
    }
    if (S_ISBLK(st.st_mode)) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return ft_err(-errno, "%s: cannot open: %s", path, strerror(errno));
        uint64_t n = 0;
        int rc = ioctl(fd, BLKGETSIZE64, &n);
        int e = errno;
        close(fd);
        if (rc < 0) return ft_err(-e, "%s: cannot get the device size: %s", path, strerror(e));
        *size = n;
        return 0;
    }
    return ft_err(S_ISDIR(st.st_mode) ? -EISDIR : FT_E_INVALID,
                  "%s: expected a regular file or a block device", path);
}

/* Reads [off, off + len) in calls of `call` bytes into buf; *sec gets the wall time. */
static int timed_read(ft_reader *rd, char *buf, uint64_t off, uint64_t len, uint64_t call,
                      double *sec)
{
    double t0 = now_s();
    for (uint64_t done = 0; done < len;) {
        uint64_t n = len - done < call ? len - done : call;
        FT_TRY(ft_reader_read(rd, buf, (size_t)n, off + done));
        done += n;
    }
    *sec = now_s() - t0;
    return 0;
}

/* ft_probe_disk over [base, end) of the file (end <= its size): the grid's slices and the
 * final measurement read only there. */
static int probe_range(const char *path, uint64_t base, uint64_t end, uint64_t max_bytes,
                       ft_probe_disk_result *r)
{
    memset(r, 0, sizeof *r);
    uint64_t size = 0;
    FT_TRY(file_size(path, &size));
    if (end > size) end = size;
    uint64_t avail = base < end ? end - base : 0;
    uint64_t range = max_bytes ? max_bytes : FT_PROBE_DISK_DEFAULT_BYTES;
    if (range > avail) range = avail;
    if (range == 0) return ft_err(FT_E_INVALID, "%s: the file is empty: nothing to read", path);
    r->file_bytes = size;

    /* Which path will the reader take? */
    ft_reader *rd;
    FT_TRY(ft_reader_open(&rd, path, grid_qd[0], grid_chunk[0], 1));
    int direct = strncmp(ft_reader_mode(rd), "pread", 5) != 0;

    uint64_t buf_n = direct ? call_bytes(grid_qd[FT_PROBE_GRID_QD - 1], grid_chunk[FT_PROBE_GRID_CHUNK - 1])
                            : SLICE_MIN;
    if (buf_n > range) buf_n = range;
    buf_n = (buf_n + FT_READER_ALIGN - 1) / FT_READER_ALIGN * FT_READER_ALIGN;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, PROBE_BUF_ALIGN, (size_t)buf_n) != 0) {
        ft_reader_close(rd);
        return ft_err(-ENOMEM, "%s: cannot allocate a %llu-byte read buffer", path,
                      (unsigned long long)buf_n);
    }
    /* huge pages where the kernel gives them (THP "madvise"): a buffer of 4 KiB pages faulted
     * in by memset is physically scattered, so each large read becomes many segments, which
     * would make the raw rate too low a reference (bench/results/code-measurements.md) */
    (void)madvise(buf, (size_t)buf_n, MADV_HUGEPAGE);
    memset(buf, 0, (size_t)buf_n); /* fault the pages in before any timing */

    int rc = 0;
    int best_qd = 1;
    size_t best_chunk = (size_t)buf_n;
    if (direct) {
        ft_reader_close(rd);
        rd = NULL;
        double best = -1;
        uint64_t cursor = 0;
        for (int qi = 0; qi < FT_PROBE_GRID_QD; qi++)
            for (int ci = 0; ci < FT_PROBE_GRID_CHUNK; ci++) {
                int qd = grid_qd[qi];
                size_t ch = grid_chunk[ci];
                uint64_t slice = call_bytes(qd, ch);
                if (slice > range) slice = range;
                if (cursor + slice > range) cursor = 0;
                ft_reader *g;
                rc = ft_reader_open(&g, path, qd, ch, 1);
                if (rc < 0) goto out;
                double sec;
                rc = timed_read(g, buf, base + cursor, slice, slice, &sec);
                ft_reader_close(g);
                if (rc < 0) goto out;
                ft_probe_disk_point *p = &r->grid[r->n_grid++];
                p->queue_depth = qd;
                p->chunk_bytes = ch;
                p->bytes = slice;
                p->bytes_per_s = sec > 0 ? slice / sec : 0;
                r->total_bytes += slice;
                if (p->bytes_per_s > best) best = p->bytes_per_s;
                cursor += slice;
            }
        /* Each grid point is one read of 64-256 MiB, and a virtual disk's rate varies between
         * such reads (bench/results/code-measurements.md), so the fastest sample is partly
         * luck: of the settings within PROBE_BAND of it, take the one that moves the most
         * bytes per request round (qd x chunk; then the larger chunk), which costs the fewest
         * submissions. */
        double best_q = 0;
        for (int i = 0; i < r->n_grid; i++) {
            const ft_probe_disk_point *p = &r->grid[i];
            double q = (double)p->queue_depth * (double)p->chunk_bytes +
                       (double)p->chunk_bytes * 1e-3; /* ties: the larger chunk */
            if (p->bytes_per_s >= PROBE_BAND * best && q > best_q) {
                best_q = q;
                best_qd = p->queue_depth;
                best_chunk = p->chunk_bytes;
            }
        }
        rc = ft_reader_open(&rd, path, best_qd, best_chunk, 1);
        if (rc < 0) goto out;
    } else {
        /* depth and chunk do not apply to pread; drop what the page cache holds of the file
         * (clean pages only: a file written moments ago may still be cached) */
        r->page_cache = 1;
        snprintf(r->note, sizeof r->note, "pread fallback: the rate may be the page cache's");
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }

    uint64_t call = direct ? call_bytes(best_qd, best_chunk) : buf_n;
    if (call > buf_n) call = buf_n;
    double sec;
    rc = timed_read(rd, buf, base, range, call, &sec);
    if (rc < 0) goto out;
    r->bytes = range;
    r->total_bytes += range;
    r->seconds = sec;
    r->bytes_per_s = sec > 0 ? range / sec : 0;
    r->queue_depth = best_qd;
    r->chunk_bytes = best_chunk;
    snprintf(r->mode, sizeof r->mode, "%s", ft_reader_mode(rd));
    struct statfs sf;
    if (direct && statfs(path, &sf) == 0 &&
        ((unsigned long)sf.f_type == TMPFS_MAGIC_ || (unsigned long)sf.f_type == RAMFS_MAGIC_)) {
        r->page_cache = 1;
        snprintf(r->note, sizeof r->note, "the file is on tmpfs/ramfs: the rate is memory's, not a disk's");
    }
out:
    ft_reader_close(rd);
    free(buf);
    return rc;
}

int ft_probe_disk(const char *path, uint64_t max_bytes, ft_probe_disk_result *r)
{
    return probe_range(path, 0, UINT64_MAX, max_bytes, r);
}

int ft_probe_pack_reader(ft_pack_file *pack, uint64_t max_bytes, ft_probe_disk_result *r)
{
    int64_t L = ft_pack_config(pack)->num_hidden_layers;
    uint64_t off0 = 0, n0 = 0, off1 = 0, n1 = 0;
    FT_TRY(ft_pack_block_extent(pack, 0, &off0, &n0));
    FT_TRY(ft_pack_block_extent(pack, L - 1, &off1, &n1));
    FT_TRY(probe_range(ft_pack_path(pack), off0, off1 + n1, max_bytes, r));
    if (r->n_grid == 0) return 0; /* pread: depth and chunk do not apply */
    return ft_pack_set_reader(pack, r->queue_depth, r->chunk_bytes);
}

/* ---- PCIe ------------------------------------------------------------------------------ */

#define PCIE_REPS 5
#define PCIE_COPIES 4

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median over PCIE_REPS timings of PCIE_COPIES copies on `lane`, in bytes/s. */
static int time_copies(ft_backend *be, int lane, void *dst, const void *src, size_t bytes,
                       double *rate)
{
    const ft_backend_ops *o = be->ops;
    const int e0 = FT_MAX_EVENTS - 2, e1 = FT_MAX_EVENTS - 1;
    double r[PCIE_REPS];
    for (int rep = 0; rep < PCIE_REPS; rep++) {
        FT_TRY(o->event_record(be, e0, lane));
        for (int c = 0; c < PCIE_COPIES; c++) FT_TRY(o->copy_async(be, lane, dst, src, bytes));
        FT_TRY(o->event_record(be, e1, lane));
        FT_TRY(o->event_sync(be, e1));
        float ms = 0;
        FT_TRY(o->event_elapsed(be, e0, e1, &ms));
        if (!(ms > 0))
            return ft_err(FT_E_NUMERIC, "%s backend: %d copies of %zu bytes timed at %g ms",
                          o->name, PCIE_COPIES, bytes, (double)ms);
        r[rep] = (double)PCIE_COPIES * (double)bytes / (ms * 1e-3);
    }
    qsort(r, PCIE_REPS, sizeof r[0], dbl_cmp);
    *rate = r[PCIE_REPS / 2];
    return 0;
}

int ft_probe_pcie(ft_backend *be, size_t bytes, double *h2d, double *d2h)
{
    const ft_backend_ops *o = be->ops;
    *h2d = *d2h = 0;
    if (o->host_memory)
        return ft_err(FT_E_UNSUPPORTED, "no PCIe on the %s backend (its buffers are host memory)",
                      !strcmp(o->name, "cpu") ? "CPU" : o->name);
    if (!o->alloc || !o->host_alloc || !o->host_free || !o->copy_async || !o->event_record ||
        !o->event_sync || !o->event_elapsed)
        return ft_err(FT_E_UNSUPPORTED, "the %s backend has no asynchronous copies or events",
                      o->name);
    if (!bytes) bytes = FT_PROBE_PCIE_DEFAULT_BYTES;
    void *dev = o->alloc(be, bytes);
    if (!dev) return ft_err(-ENOMEM, "%s backend: cannot allocate %zu bytes", o->name, bytes);
    void *host = o->host_alloc(be, bytes);
    if (!host) {
        o->free(be, dev);
        return ft_err(-ENOMEM, "%s backend: cannot allocate %zu bytes of pinned host memory",
                      o->name, bytes);
    }
    memset(host, 0x5a, bytes);
    const int ev = FT_MAX_EVENTS - 1;
    int rc;
    /* warm-up: first-touch costs, lazy stream and DMA setup */
    if ((rc = o->copy_async(be, FT_STREAM_H2D, dev, host, bytes)) < 0 ||
        (rc = o->event_record(be, ev, FT_STREAM_H2D)) < 0 || (rc = o->event_sync(be, ev)) < 0 ||
        (rc = o->copy_async(be, FT_STREAM_D2H, host, dev, bytes)) < 0 ||
        (rc = o->event_record(be, ev, FT_STREAM_D2H)) < 0 || (rc = o->event_sync(be, ev)) < 0)
        goto out;
    if ((rc = time_copies(be, FT_STREAM_H2D, dev, host, bytes, h2d)) < 0) goto out;
    rc = time_copies(be, FT_STREAM_D2H, host, dev, bytes, d2h);
out:
    o->host_free(be, host);
    o->free(be, dev);
    return rc;
}
