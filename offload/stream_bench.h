/* stream_bench.h - the disk tier's read-ahead measured alone (issue 6: in a disk-bound
 * training step the disk should read at >= 90% of the raw O_DIRECT rate of the same file).
 * `ftune bench io --path PACK --stream` prints it.
 *
 * One call probes the pack's reader (offload/probe.h ft_probe_pack_reader: the raw rate of its
 * layer blocks, and the queue depth x chunk the read-ahead then takes), drives the disk
 * read-ahead (offload/prefetch.h) as offload/tiers.c does for a base whose layers are ALL on
 * the disk tier, for `steps` training steps, with no compute:
 *   - staging: n_stage buffers of ft_pack_max_layer_bytes from ft_pinned_alloc on the
 *     backend's NUMA node, registered with io_uring; the reader at the pack's setting;
 *     max_blocks 4 L + 4;
 *   - the lists of ft_exec_begin_op and dpf_start: a step visits layers 0..L-1 then L-1..0,
 *     less the block kept in its slot at the turn (L-1) and the one kept from the previous
 *     step (layer 0), so step 1 reads 2 L - 1 blocks and each later step 2 L - 2; each list
 *     goes on with the next step's forward (speculative, kept when the step comes), and the
 *     first is given before step 1, as at the end of ft_exec_use_pack_tiers;
 *   - the host side of tiers.c's issue/pump/fetch: blocks are taken n_slots - 1 visits ahead
 *     of the layer computed, as device slots free up, and released at once.
 * The device is modelled on the host clock (CLOCK_MONOTONIC): each taken block is copied to
 * its slot at h2d_bytes_per_s (0: instantly) once the H2D lane and the slot are free (the
 * slot's last compute done), each layer pass computes for compute_s after its copy and the
 * previous pass, and the host waits for the compute at the forward/backward turn (the LM
 * head reads the loss) and at the step's end (the gradient norm). The read-ahead's
 * buffer_wait sleeps until the modelled end of the buffer's last copy, as tiers.c's event
 * sync waits for the real one. With compute_s = 0 and no copy time, nothing throttles the
 * reads but the staging ring: the rate is the I/O engine's own. Then it probes the raw rate
 * again: the steps' rate is compared with the mean of the two probes, since the virtual disks
 * of the CPU VM and the lent GPU machines drift by 15% and more between samples.
 */
#ifndef FT_STREAM_BENCH_H
#define FT_STREAM_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "offload/probe.h"

struct ft_pack_file;

typedef struct ft_stream_bench_opts {
    int steps;                  /* training steps to drive, >= 1 */
    int n_stage;                /* staging buffers, 1..8; 0: min(L, 3), the planner's
                                 * host_slots for a base all on disk (offload/plan.c) */
    int n_slots;                /* device slots modelled, 2..8; 0: 2 (the planner's depth) */
    double compute_s;           /* modelled compute per layer pass (each forward and each
                                 * backward of a layer), seconds, >= 0 */
    double h2d_bytes_per_s;     /* modelled staging -> slot copy rate, bytes/s; 0: instant */
    uint64_t probe_bytes;       /* range of the raw probe (0: FT_PROBE_DISK_DEFAULT_BYTES) */
} ft_stream_bench_opts;

/* Figures over a run of steps. */
typedef struct ft_stream_bench_span {
    int64_t steps;
    int64_t blocks;             /* blocks taken from the read-ahead */
    uint64_t bytes;             /* their bytes (ft_pack_block_extent) */
    double seconds;             /* wall: from the start of the first step (for step 1: from the
                                 * read-ahead's first list) to the end of the last */
    double busy_seconds;        /* disk busy: the sum of each block's ft_dpf_read.busy */
    double wait_seconds;        /* the host blocked in ft_disk_prefetch_take */
    double stall_seconds;       /* the modelled compute lane idle between passes (waiting for
                                 * a block's read or copy; all of the time with no compute) */
} ft_stream_bench_span;

typedef struct ft_stream_bench_result {
    ft_probe_disk_result probe; /* the raw rate of the pack's layer blocks, before the steps */
    ft_probe_disk_result probe_after; /* ... and after them (its grid may move the reader's setting) */
    double raw_bytes_per_s;     /* the mean of the two: what the steps' rate is compared with */
    int64_t layers;
    int n_stage, n_slots;
    size_t stage_bytes;         /* each staging buffer: the largest layer block */
    int queue_depth;            /* the read-ahead's reader (the pack's, after the probe) */
    size_t chunk_bytes;
    double compute_s, h2d_bytes_per_s; /* the model's, as used */
    char mode[1536];            /* ft_disk_prefetch_mode: reader, registered buffers */
    char staging[256];          /* ft_pinned_describe of the staging buffers */
    ft_stream_bench_span all;   /* steps 1..steps */
    ft_stream_bench_span steady;/* steps 2..steps (all zero with one step) */
    int64_t reads;              /* blocks read and handed over (ft_disk_prefetch_counts after
                                 * the final cancel): equals all.blocks */
    int64_t dropped_in_run;     /* blocks dropped during the steps: a list the read-ahead did
                                 * not keep (0 when tiers.c's predictions hold) */
    int64_t dropped_at_end;     /* the next step's speculative blocks, dropped at the end */
} ft_stream_bench_result;

/* Runs the measurement above on pack (opened by the caller; its reader is set to the probe's
 * best point, as ft_place_packed does). be gives the staging memory (ft_pinned_alloc; the CPU
 * backend's is plain page-aligned memory). Returns 0, FT_E_INVALID (an option out of range,
 * a pack without layers, or a block the read-ahead does not have next: a visit list that
 * disagrees with its stream), -ENOMEM, or the probe's, the pinned allocation's or a read's
 * error (-errno, FT_E_CORRUPT, naming the file and offset). *r is filled on success; the
 * pack's reader is left at the second probe's best point. */
int ft_stream_bench(ft_backend *be, struct ft_pack_file *pack, const ft_stream_bench_opts *o,
                    ft_stream_bench_result *r);

#endif
