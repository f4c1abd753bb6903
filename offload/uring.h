/* uring.h - the NVMe reader: large aligned reads of a file with io_uring and O_DIRECT
 * (Axboe, "Efficient IO with io_uring", 2019; liburing), chunks kept in flight up to a queue
 * depth; where io_uring or O_DIRECT is unavailable (tmpfs, an old kernel, seccomp, a build
 * without liburing) it falls back to pread and says why (ft_reader_mode).
 *
 * O_DIRECT reads need the buffer, the file offset and the length aligned to the device's
 * logical block (4096 covers every device ftune meets); ft_reader_read reads the aligned
 * part directly and any unaligned head or tail through the page cache. */
#ifndef FT_URING_H
#define FT_URING_H

#include <stddef.h>
#include <stdint.h>

#define FT_READER_ALIGN 4096

typedef struct ft_reader ft_reader;

/* Opens path for reading. queue_depth: chunks in flight (1..256, 0 = 8); chunk_bytes: bytes
 * per request (a multiple of 4096, 0 = 1 MiB). want_direct = 0 forces the page-cache path
 * (pread), for comparisons. Returns 0 or -errno (the file cannot be opened). */
int ft_reader_open(ft_reader **out, const char *path, int queue_depth, size_t chunk_bytes,
                   int want_direct);
void ft_reader_close(ft_reader *r); /* NULL-safe */

/* Reads len bytes at offset off into buf. Returns 0, -errno (an I/O error, naming the file and
 * offset), or FT_E_CORRUPT for a short read (the file ends before off + len). */
int ft_reader_read(ft_reader *r, void *buf, size_t len, uint64_t off);

/* "io_uring + O_DIRECT (queue depth 8, 1 MiB chunks)" or "pread (reason)". */
const char *ft_reader_mode(const ft_reader *r);

/* Bytes read since open (test and bench hook). */
uint64_t ft_reader_bytes(const ft_reader *r);

#endif
