/* probe.h - what the offload tiers can move on this machine: the disk read rate through the
 * NVMe reader (offload/uring.h) at its best queue depth and chunk size, and the pinned
 * host <-> device copy rates over PCIe (the backend's transfer ops, kernels/kernels.h).
 * `ftune bench io` prints them; the planner can use them to predict a step's I/O time. */
#ifndef FT_PROBE_H
#define FT_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define FT_PROBE_DISK_DEFAULT_BYTES ((uint64_t)2 << 30) /* 2 GiB */
#define FT_PROBE_GRID_QD 4                              /* queue depths 4, 8, 16, 32 */
#define FT_PROBE_GRID_CHUNK 3                           /* chunks 256 KiB, 1 MiB, 4 MiB */
#define FT_PROBE_PCIE_DEFAULT_BYTES ((size_t)256 << 20) /* 256 MiB per copy */

/* One point of the queue-depth x chunk grid, measured on a short slice of the file. */
typedef struct ft_probe_disk_point {
    int queue_depth;
    size_t chunk_bytes;
    uint64_t bytes;       /* the slice's length */
    double bytes_per_s;
} ft_probe_disk_point;

typedef struct ft_probe_disk_result {
    double bytes_per_s;   /* the chosen setting over the whole range (decimal: / 1e9 = GB/s) */
    double seconds;       /* of that measurement */
    uint64_t bytes;       /* bytes read by it: min(max_bytes, file size) */
    uint64_t file_bytes;  /* the file's size */
    uint64_t total_bytes; /* everything read, grid slices included */
    int queue_depth;      /* chosen; 1 in pread mode */
    size_t chunk_bytes;   /* chosen; the read call's length in pread mode */
    int page_cache;       /* 1: the rate may be memory's, not the disk's (see note) */
    char note[128];       /* why page_cache is set: the pread fallback or a memory file system */
    int n_grid;           /* grid points measured (0 in pread mode, where they do not matter) */
    ft_probe_disk_point grid[FT_PROBE_GRID_QD * FT_PROBE_GRID_CHUNK];
    char mode[256];       /* ft_reader_mode of the chosen reader */
} ft_probe_disk_result;

/* Measures reading path: the grid {4, 8, 16, 32} queue depths x {256 KiB, 1 MiB, 4 MiB}
 * chunks on short slices (max(64 MiB, 2 x depth x chunk), at rotating offsets, capped by the
 * range), then the chosen point (of those within 8% of the fastest, the one with the most
 * bytes in flight, depth x chunk: single slices vary by +-15% on virtual disks) over the first
 * min(max_bytes, file size) bytes (max_bytes 0: FT_PROBE_DISK_DEFAULT_BYTES), in reads of
 * max(64 MiB, 2 x depth x chunk) into one 2 MiB-aligned buffer advised to use huge pages
 * (MADV_HUGEPAGE: fewer segments per request; on the CPU VM's virtio disk scattered 4 KiB
 * pages read 25-40% slower). O_DIRECT reads bypass the page cache; in the pread fallback (no
 * liburing, no O_DIRECT) the grid is skipped (depth and chunk have no effect there), the
 * file's clean cached pages are dropped first (posix_fadvise DONTNEED) and r->page_cache is
 * set, as it is for a file on tmpfs/ramfs (whose O_DIRECT reads are memory copies).
 * Returns 0, -errno (cannot open or read, naming the path), FT_E_INVALID (an empty file) or
 * -ENOMEM. */
int ft_probe_disk(const char *path, uint64_t max_bytes, ft_probe_disk_result *r);

struct ft_pack_file;
/* ft_probe_disk on a pack's layer blocks (from layer 0's block to the end of the last layer's:
 * what the disk tier streams), then the best grid point becomes the pack's reader setting
 * (ft_pack_set_reader), which the disk read-ahead opened later takes too (offload/prefetch.h).
 * r as ft_probe_disk's (r->bytes: min(max_bytes, the layer blocks' span)); in the pread
 * fallback the reader is left as it is. Call before ft_exec_use_pack_tiers. Returns 0 or
 * ft_probe_disk's and ft_pack_set_reader's errors. */
int ft_probe_pack_reader(struct ft_pack_file *pack, uint64_t max_bytes, ft_probe_disk_result *r);

/* Pinned host -> device and device -> host copy rates in bytes/s (decimal) of copies of
 * `bytes` (0: FT_PROBE_PCIE_DEFAULT_BYTES): one buffer from be->ops->alloc, one from
 * be->ops->host_alloc, one warm-up copy each way, then 5 timings of 4 back-to-back copies
 * per direction on lanes FT_STREAM_H2D / FT_STREAM_D2H, each timed by two events (ids
 * FT_MAX_EVENTS - 2 and - 1), the median kept. Returns 0, FT_E_UNSUPPORTED (a host-memory
 * backend such as the CPU: there is no bus to measure; or the transfer ops are missing),
 * -ENOMEM (an allocation failed) or the backend's error (-EIO). */
int ft_probe_pcie(ft_backend *be, size_t bytes, double *h2d, double *d2h);

#endif
