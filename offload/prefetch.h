/* prefetch.h - disk read-ahead for the streamed tiers (offload/tiers.c, issue 6): a
 * background thread reads the blocks an operation will need from the pack file, in the
 * order it will need them, into a ring of n_stage pinned staging buffers, each as soon as
 * the buffer is free again (its previous copy to the device done). Its reader keeps the
 * io_uring queue full ACROSS block boundaries (the next block's chunks are queued while the
 * current one's last chunks are in flight, offload/uring.h ft_reader_queue), so the disk does
 * not idle between blocks, nor while the host thread is busy queueing compute.
 *
 * The protocol (one consumer thread, the executor's):
 *   ft_disk_prefetch_start(list)      the blocks to read, in order (a new operation). A list
 *                                     that continues what is already read ahead keeps it.
 *   ft_disk_prefetch_take(id) -> h    waits until the next block is in buffer h;
 *   ... queue the copy out of h, mark it (the buffer_wait callback will wait for it) ...
 *   ft_disk_prefetch_release(h)       buffer h may be read into again (after buffer_wait).
 * Buffers are used in ring order (block k of the stream goes into buffer k % n_stage), so at
 * most n_stage blocks are read ahead of the consumer. The thread calls buffer_wait(h) before
 * writing into buffer h again (tiers.c: a sync on the event recorded after its H2D copy); it
 * does so once the blocks before are all submitted, so the wait overlaps reads in flight.
 * Read errors are kept and returned, with their message (file and offset), by the next take.
 * The data read do not depend on the timing: only when they are read does.
 */
#ifndef FT_PREFETCH_H
#define FT_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

struct ft_exec;
typedef struct ft_disk_prefetch ft_disk_prefetch;

/* A block to read: `bytes` at file offset `off`, known to the consumer as `id` (tiers.c: the
 * layer). off, bytes and the staging buffers should be multiples of 4096 for O_DIRECT. */
typedef struct ft_dpf_block {
    int64_t id;
    uint64_t off;
    uint64_t bytes;
} ft_dpf_block;

typedef struct ft_dpf_cfg {
    const char *path;            /* the file (the pack) */
    int queue_depth;             /* reader setting (ft_reader_open; 0: its defaults) */
    size_t chunk_bytes;
    uint8_t *stage;              /* n_stage buffers of stage_bytes, back to back, 4096-aligned */
    size_t stage_bytes;
    int n_stage;                 /* 1..8 */
    int max_blocks;              /* the longest list ft_disk_prefetch_start is given */
    /* Called on the read-ahead thread before buffer h is written again; blocks until the
     * consumer's last use of h (e.g. its device copy) is done; returns 0 or an error. NULL:
     * nothing to wait for. */
    int (*buffer_wait)(void *user, int h);
    void *user;
    int register_buffers;        /* 1: register the staging buffers with io_uring (fixed reads) */
} ft_dpf_cfg;

/* Times of one block's read (CLOCK_MONOTONIC seconds, as the executor's clock) */
typedef struct ft_dpf_read {
    double t0, t1;               /* queued (its chunks submitted from then on), complete */
    double busy;                 /* t1 - max(t0, the previous block's t1): disk time it alone took */
} ft_dpf_read;

/* Opens the reader (its own, O_DIRECT + io_uring where possible), registers the buffers when
 * asked (a failure is not an error: the reads are then plain, and ft_disk_prefetch_mode says
 * why) and starts the thread, idle until a list is given. Returns 0, -errno (the file cannot
 * be opened, the thread cannot start), -ENOMEM or FT_E_INVALID (n_stage, max_blocks). */
int ft_disk_prefetch_init(ft_disk_prefetch **out, const ft_dpf_cfg *cfg);
/* Stops the thread (reads in flight finish first) and closes the reader. NULL-safe. Call
 * before the staging buffers are freed. */
void ft_disk_prefetch_free(ft_disk_prefetch *p);

/* The next blocks to read, in order (n <= max_blocks), replacing what was left to read. When
 * the blocks already read ahead and not taken are the first of the new list (same ids and
 * offsets), they are kept (a speculative read-ahead of an operation's start); otherwise they
 * are dropped (the thread lets their reads finish first). A kept error is cleared. The
 * consumer must not hold a buffer (take without release). Returns the number of blocks kept,
 * or FT_E_INVALID (n outside 0..max_blocks). */
int ft_disk_prefetch_start(ft_disk_prefetch *p, const ft_dpf_block *b, int n);

/* An array of max_blocks entries owned by p for the consumer to fill and pass to
 * ft_disk_prefetch_start (so starting an operation allocates nothing). */
ft_dpf_block *ft_disk_prefetch_scratch(ft_disk_prefetch *p);

/* Waits until block `id` (it must be the next in the stream) is read, then hands over its
 * buffer: *h (0..n_stage-1), and the read's times in *rd (may be NULL). Returns 1; 0 when the
 * next block of the stream is not `id` (or there is none: nothing done, the caller reads it
 * itself); or the thread's read error (-errno, FT_E_CORRUPT), its message naming the file
 * and offset, until the next start. */
int ft_disk_prefetch_take(ft_disk_prefetch *p, int64_t id, int *h, ft_dpf_read *rd);
/* The consumer is done with buffer h (taken last) as far as the host is concerned: the
 * thread may reuse it after buffer_wait(h). */
void ft_disk_prefetch_release(ft_disk_prefetch *p, int h);

/* Drops the list and every block read ahead and not taken, after their reads in flight have
 * finished; returns when the thread touches no buffer. The consumer must not hold one. */
void ft_disk_prefetch_cancel(ft_disk_prefetch *p);

/* The reader's mode ("io_uring + O_DIRECT (queue depth 16, 1024 KiB chunks), 2 registered
 * buffers"), and why the buffers are not registered when they are not. */
const char *ft_disk_prefetch_mode(const ft_disk_prefetch *p);

/* Counters (test hook): blocks read completely and not dropped (taken, or staged for the
 * consumer), and blocks dropped (read or being read when a start or cancel dropped them). */
void ft_disk_prefetch_counts(ft_disk_prefetch *p, int64_t *reads, int64_t *dropped);

/* One line on where the executor's streamed-tier host memory went and how the disk tier is
 * read, for the run's log: "pinned pool: 48.0 GiB on NUMA node 0 (GPU's node); staging:
 * 2 x 480.0 MiB on NUMA node 0; disk read-ahead: io_uring + O_DIRECT (...)". Empty when the
 * executor streams nothing. Implemented in tiers.c. */
void ft_exec_io_describe(const struct ft_exec *e, char *buf, size_t n);

#endif
