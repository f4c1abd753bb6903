/* ckpt.h - the executor's layer-input checkpoints in pinned host memory (offload/actckpt.c).
 *
 * Checkpoint j of micro-batch mb is the input of layer j (j = 0..L-1; j = L is the final
 * hidden state), T_max * C fp32 on the device while it is written or read. With this tier
 * (ft_exec_init_ckpt_host, ft_exec_ckpt_to_host) only these device buffers exist:
 *   dev_layers * n_micro  the inputs of the LAST dev_layers layers (h = L - dev_layers .. L-1),
 *                         which stay on the device: the backward needs them first;
 *   n_sets * n_micro      a ring of n_sets sets, one buffer per micro-batch each, carrying
 *                         checkpoints 0..h-1 and L (vertical schedule: a set holds one
 *                         checkpoint index for all micro-batches of a layer visit).
 * The inputs of layers 0 .. n_stored - 1 (n_stored = max(0, h - (n_sets - 1))) have a home in
 * one pinned host allocation, n_stored * n_micro buffers. The last n_sets - 1 ring entries of a
 * forward (checkpoints h - n_sets + 1 .. h - 1) are still in their sets at the turn and are
 * used there, never copied.
 *
 * All checkpoint traffic is on the checkpoint lane, FT_STREAM_D2H (device -> host stores in the
 * forward, host -> device loads in the backward, when the lane is otherwise idle), so it
 * never queues behind the weight copies of the H2D lane. Ordering is by device events
 * 24..31 (two per set; tiers.c owns 0..23 and 32+):
 *   forward, layer l:  compute waits COPY[s] (the set's last store or load has finished),
 *                      writes checkpoint l+1 into set s, records COMP[s]; if l+1 < n_stored
 *                      (and training) the lane waits COMP[s], copies the n_mb buffers to the
 *                      host and records COPY[s]. A reader of a set records COMP[s] after it.
 *   backward:          a load of checkpoint l into a free set s (one whose checkpoint is no
 *                      longer needed: its layer's backward is queued, or the head's) waits
 *                      COMP[s] on the lane, copies, records COPY[s]; the compute of layer l
 *                      waits COPY[s]; after it, COMP[s]. Loads are issued as soon as a set is
 *                      free: n_sets - 1 layers ahead of compute.
 * The backward's recompute writes its block output (unused) to the final norm's scratch
 * (ft_exec.xf), not to checkpoint l+1, whose set may be loading already.
 * On a host-memory backend (CPU) host_alloc is plain memory, copies happen at once and events
 * are no-ops, so the same code runs in CI.
 */
#ifndef FT_CKPT_H
#define FT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "offload/exec.h"

#define FT_CKPT_MAX_SETS 4
#define FT_CKPT_EV0 24              /* device events FT_CKPT_EV0 .. FT_CKPT_EV0 + 7 */

typedef struct ft_actckpt {
    int64_t L, n_micro, T_max, C;   /* the executor's sizes */
    int64_t dev_layers;             /* layers h .. L-1 keep their inputs on the device */
    int64_t h;                      /* L - dev_layers */
    int64_t n_stored;               /* checkpoints 0 .. n_stored-1 have a host home */
    int n_sets;                     /* 2 .. FT_CKPT_MAX_SETS */
    float *dev_keep;                /* device (in the arena): dev_layers * n_micro buffers */
    float *sets;                    /* device (in the arena): n_sets * n_micro buffers */
    float *host;                    /* pinned host: n_stored * n_micro buffers, or NULL */
    size_t host_bytes;
    /* the current operation */
    int64_t hold[FT_CKPT_MAX_SETS]; /* checkpoint index each set holds, -1: none */
    int64_t ring;                   /* sets handed out by the forward */
    int64_t cur;                    /* backward: next layer to compute; sets holding more are free */
    int64_t next_load;              /* backward: next checkpoint to load, -1: none left */
    int64_t n_mb;                   /* micro-batches of the operation */
    int64_t *rows;                  /* n_micro: rows of each micro-batch (bytes copied) */
    uint8_t *stored;                /* L + 1 flags: stored by this operation's forward */
    int train;                      /* the forward stores (a backward follows) */
    /* counters since init (test hooks, `ftune bench step`) */
    uint64_t d2h_bytes, h2d_bytes;
    int64_t d2h_copies, h2d_copies; /* buffers (one micro-batch's checkpoint) copied */
} ft_actckpt;

/* Device buffers of T_max * C floats the tier needs: (dev_layers + n_sets) * n_micro. */
int64_t ft_actckpt_dev_buffers(int64_t n_micro, int64_t dev_layers, int n_sets);
/* Host bytes of the tier: max(0, L - dev_layers - (n_sets - 1)) * n_micro * T_max * C * 4. */
size_t ft_actckpt_host_bytes(int64_t L, int64_t n_micro, int64_t T_max, int64_t C,
                               int64_t dev_layers, int n_sets);
/* FT_E_INVALID (with a message) unless 0 <= dev_layers <= L and 2 <= n_sets <= 4. */
int ft_actckpt_check(int64_t L, int64_t dev_layers, int n_sets);

/* Sets up e->ckt over e->ckpt, which must hold ft_actckpt_dev_buffers buffers, and makes the
 * pinned host allocation. Returns 0, -ENOMEM (naming the bytes), FT_E_INVALID,
 * FT_E_UNSUPPORTED (a backend without host_alloc/copy_async/events). */
int ft_actckpt_init(ft_exec *e, int64_t dev_layers, int n_sets);
void ft_actckpt_free(ft_exec *e); /* NULL-safe; e->ckt = NULL */

/* ---- the executor's hooks (exec_step.c), in schedule order -------------------------------- */

/* An operation starts: n_mb micro-batches of rows[mb] tokens (a pass micro-batch's: every
 * adapter's rows); train = 1: a backward follows (the forward stores its checkpoints), 0:
 * forward only (nothing is copied). */
void ft_actckpt_begin(ft_exec *e, const int64_t *rows, int64_t n_mb, int train);
/* Forward: device buffers (micro-batch mb at + mb * T_max * C) where checkpoint j is written;
 * the compute lane waits until the set is free. */
int ft_actckpt_write(ft_exec *e, int64_t j, float **out);
/* Forward and head: where checkpoint j is. FT_E_INVALID if it is not on the device. */
int ft_actckpt_read(ft_exec *e, int64_t j, float **at);
/* The compute writing checkpoint j is queued: store it to the host when it has a home there. */
int ft_actckpt_written(ft_exec *e, int64_t j);
/* A compute reading checkpoint j (a forward layer, the head) is queued. */
int ft_actckpt_used(ft_exec *e, int64_t j);
/* The backward starts (after the head): loads are issued as sets free up. */
int ft_actckpt_bwd_begin(ft_exec *e);
/* Backward of layer l: its input checkpoint on the device, the compute lane waiting for its
 * load. */
int ft_actckpt_bwd_in(ft_exec *e, int64_t l, float **at);
/* The backward of layer l is queued: its set is free; further loads are issued. */
int ft_actckpt_bwd_done(ft_exec *e, int64_t l);

#endif
