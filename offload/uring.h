/* uring.h - the NVMe reader: large aligned reads of a file with io_uring and O_DIRECT
 * (Axboe, "Efficient IO with io_uring", 2019; liburing), chunks kept in flight up to a queue
 * depth; where io_uring or O_DIRECT is unavailable (tmpfs, an old kernel, seccomp, a build
 * without liburing) it falls back to pread and says why (ft_reader_mode).
 *
 * Two ways to read: ft_reader_read (one range, returns when it is all there) and a queue of
 * ranges ("extents": ft_reader_queue, ft_reader_poll) whose chunks are submitted in order
 * ACROSS extents, so the ring stays full at the boundary between two of them (the disk
 * read-ahead of the streamed tiers, offload/prefetch.h, queues block after block).
 *
 * O_DIRECT reads need the buffer, the file offset and the length aligned to the device's
 * logical block (4096 covers every device ftune meets); the aligned part is read directly
 * and any unaligned head or tail through the page cache. Buffers registered with the ring
 * (ft_reader_register) are read into with fixed-buffer ops (IORING_OP_READ_FIXED: the kernel
 * skips pinning the pages at every request).
 *
 * A reader is used by one thread at a time. */
#ifndef FT_URING_H
#define FT_URING_H

#include <stddef.h>
#include <stdint.h>

#define FT_READER_ALIGN 4096
#define FT_READER_MAX_QUEUED 16 /* extents queued at once */
#define FT_READER_MAX_FIXED 64  /* registered buffer pieces (each at most 1 GiB) */

typedef struct ft_reader ft_reader;

/* Opens path for reading. queue_depth: chunks in flight (1..256, 0 = 8); chunk_bytes: bytes
 * per request (rounded up to a multiple of 4096, 0 = 1 MiB). want_direct = 0 forces the
 * page-cache path (pread), for comparisons. Returns 0 or -errno (the file cannot be opened). */
int ft_reader_open(ft_reader **out, const char *path, int queue_depth, size_t chunk_bytes,
                   int want_direct);
/* Waits for reads still in flight (ft_reader_cancel), then closes. NULL-safe. */
void ft_reader_close(ft_reader *r);

/* Reads len bytes at offset off into buf. Returns 0, -errno (an I/O error, naming the file and
 * offset), FT_E_CORRUPT for a short read (the file ends before off + len), or FT_E_INVALID
 * while queued extents are pending (finish or cancel them first). */
int ft_reader_read(ft_reader *r, void *buf, size_t len, uint64_t off);

/* Queues a read of len bytes at off into buf under `tag` (the caller's id). Its chunks go out
 * after those of the extents queued before it, up to the queue depth in all; nothing waits
 * here except, in the pread fallback and for an unaligned head or tail, the synchronous part.
 * buf must stay valid until the extent is returned by ft_reader_poll or cancelled. Returns 0,
 * FT_E_RANGE (FT_READER_MAX_QUEUED extents pending), or a read error (pread path: as
 * ft_reader_read's, the extent is then not queued). */
int ft_reader_queue(ft_reader *r, void *buf, size_t len, uint64_t off, uint64_t tag);

/* Moves the queued reads along: submits chunks up to the queue depth, then handles
 * completions, waiting for at least one when wait != 0 and chunks are in flight. Returns 1
 * with *tag set when the oldest queued extent is complete (it is removed: extents come out
 * in the order they were queued), 0 when it is not (yet), or a read error: -errno (naming the
 * file and offset) or FT_E_CORRUPT (the file ends before the extent does); after an error
 * every read in flight has finished and the queue is empty. */
int ft_reader_poll(ft_reader *r, int wait, uint64_t *tag);

/* Extents queued and not yet returned by ft_reader_poll. */
int ft_reader_queued(const ft_reader *r);
/* Bytes of queued extents not yet submitted to the ring (0: everything queued is in flight
 * or done, so the next extent should be queued now to keep the ring full). */
uint64_t ft_reader_unsubmitted(const ft_reader *r);

/* Waits until no read is in flight and drops every queued extent (their buffers are then
 * free). NULL-safe. */
void ft_reader_cancel(ft_reader *r);

/* Registers n buffers (bufs[i], lens[i] bytes; pieces of up to 1 GiB each, at most
 * FT_READER_MAX_FIXED pieces in all) with the ring, replacing any registered before: direct
 * reads whose chunk lies inside one of them then use fixed-buffer ops. Returns 0, or, leaving
 * the reader working with plain reads: FT_E_UNSUPPORTED (no ring: the pread path, or built
 * without liburing), FT_E_RANGE (too many pieces) or -errno from the kernel (-ENOMEM when the
 * pages exceed RLIMIT_MEMLOCK, -EFAULT for memory that cannot be pinned), with a message. */
int ft_reader_register(ft_reader *r, void *const *bufs, const size_t *lens, int n);

/* "io_uring + O_DIRECT (queue depth 8, 1024 KiB chunks)" with ", N registered buffers" when
 * registered, or "pread (reason)". */
const char *ft_reader_mode(const ft_reader *r);

/* The chunk and depth in use (as opened, after rounding). */
int ft_reader_depth(const ft_reader *r);
size_t ft_reader_chunk(const ft_reader *r);

/* Bytes read since open (test and bench hook; queued extents count when queued). */
uint64_t ft_reader_bytes(const ft_reader *r);
/* Chunks read with fixed-buffer ops since open (test hook). */
uint64_t ft_reader_fixed_reads(const ft_reader *r);

#endif
