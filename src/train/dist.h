/* dist.h - data-parallel training over the ranks of a communicator (src/comm/comm.h): the
 * parts of a run that know there are several processes, so that the trainer holds one call
 * at each place.
 *
 * The scheme (docs/distributed.md): every rank loads the same model and data with the same
 * seed, so every rank packs the same micro-batches and knows the whole step; an optimizer
 * step takes size x grad_accum micro-batches (the global batch), rank r runs its share
 * [r * grad_accum, (r + 1) * grad_accum) of them (ft_train_dist_share), the gradients are
 * scaled by the whole step's target tokens as in one process, then summed over the ranks in
 * rank order (ft_train_dist_reduce) with the loss and token counts, so that every rank holds
 * the same gradient and takes the same AdamW step: N ranks of grad-accum 1 give the bits of
 * one process of grad-accum N. Only rank 0 writes (ft_train_dist_writer). */
#ifndef FT_TRAIN_DIST_H
#define FT_TRAIN_DIST_H

#include <stdint.h>

#include "offload/session.h"
#include "src/comm/comm.h"
#include "src/data/dataset.h"
#include "src/model/lora.h"
#include "src/train/events.h"
#include "src/train/trainer.h"

/* 1 when this process writes the run's outputs (metrics, checkpoints, the adapter, the
 * summary and report): rank 0 of c->comm, or a single process. */
int ft_train_dist_writer(const ft_train_cfg *c);

/* The micro-batches per optimizer step over all ranks: size x c->grad_accum. */
int64_t ft_train_dist_global_accum(const ft_train_cfg *c);

/* The set-up check, the run's first collective (after tokenization, packing and placement,
 * so that no rank waits in a collective through them): every rank has the same number of
 * training micro-batches, data fingerprint (fp) and grad_accum (the planner's choice may
 * differ with the GPU budget), and the method is supported over several ranks (not DPO yet).
 * FT_E_INVALID naming the rank that differs; the communicator's error when a rank is gone. */
int ft_train_dist_check(const ft_train_cfg *c, int64_t n_train_b, uint64_t fp);

/* This rank's share of the step's micro-batches mbs[0..n): *mine = mbs + *first, *n_mine of
 * them (0 when the step's last micro-batches do not reach this rank), *first the index of the
 * first in the step (the executor's mb_base, for the dropout masks). */
void ft_train_dist_share(const ft_train_cfg *c, const ft_batch *mbs, int64_t n,
                         const ft_batch **mine, int64_t *n_mine, int64_t *first);

/* Sums l's gradients (backend memory, l->n_params fp32) over the ranks in rank order, and
 * *loss_sum / *n_tokens with them: in place on a host-memory backend, through l->host on a
 * device (or NCCL's device all-reduce when the communicator has it, even with one rank). A
 * no-op in a single process. The stop request (c->stop) is summed with them: when any rank has one, every
 * rank's is set (SIGTERM where it had none), so all ranks stop after the same step. Returns 0
 * or the communicator's / backend's error. */
int ft_train_dist_reduce(const ft_train_cfg *c, ft_lora *l, double *loss_sum, int64_t *n_tokens);

/* `ftune plan` over several ranks (a no-op in one process): rank 0 gathers each rank's
 * placement (backend, base layers on the GPU / pinned host / pack file, micro-batches, the
 * planner's predicted step time) and reports one line per rank, then the all-reduce: the LoRA
 * gradients' bytes (fp32, l->n_params x 4), its time on a ring at c->bus_gbps
 * (2 (size - 1) / size x bytes / busbw, nccl-tests' bus-bandwidth convention) and the
 * predicted step (the slowest rank's step plus the all-reduce, which follows the backward,
 * not overlapped). Returns 0 or the communicator's error. */
int ft_train_dist_plan(const ft_train_cfg *c, const ft_session *s, const ft_lora *l,
                       const ft_train_sink *k);

#endif
