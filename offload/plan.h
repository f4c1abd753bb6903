/* plan.h - the offload planner: where the base weights and activation checkpoints live, how
 * many micro-batches run per layer visit, and the predicted step time with its bound.
 *
 * A pure function of sizes, budgets and measured rates (no I/O, no backend): the trainer and
 * `ftune plan` fill ft_plan_in from the model, the pack and short probes, then print the plan.
 * The cost model follows FlexGen's (Sheng et al. 2023, a linear program over tiers, here solved
 * greedily) and the vertical schedule of GreedySnake/Fuyou (every micro-batch of a layer runs
 * while its weights are resident, so a streamed layer is fetched twice per optimizer step):
 *   per layer visit  t = max(compute(visit), transfer(layer)) once the pipeline is full,
 *   transfer         bytes / h2d for the pinned-host tier, bytes / min(disk, h2d) for NVMe
 *                    (disk reads and H2D copies overlap each other through pinned staging),
 *   checkpoints      on the GPU, or in pinned host memory: stored D2H after the forward visit
 *                    that computes them, loaded H2D ahead of the backward visit that needs
 *                    them (offload/actckpt.h), both overlapped with compute,
 *   step             sum over the forward and backward visits + head + the pipeline fill.
 * Units: bytes, seconds, FLOP/s, bytes/s.
 */
#ifndef FT_PLAN_H
#define FT_PLAN_H

#include <stddef.h>
#include <stdint.h>

enum ft_tier { FT_TIER_GPU = 0, FT_TIER_HOST = 1, FT_TIER_DISK = 2 };

#define FT_PLAN_MAX_LAYERS 1024

typedef struct ft_plan_rates {
    double h2d;                 /* pinned host -> device copy, bytes/s (0: unknown) */
    double d2h;                 /* device -> pinned host, bytes/s */
    double disk;                /* raw io_uring O_DIRECT read of the pack's file, bytes/s */
    double flops;               /* sustained FLOP/s of the step's math, used only when the
                                 * measured per-layer times below are 0 */
} ft_plan_rates;

typedef struct ft_plan_in {
    int64_t n_layers;           /* num_hidden_layers, <= FT_PLAN_MAX_LAYERS */
    uint64_t layer_bytes;       /* one layer's base weights as stored and moved (the largest
                                 * pack block; bf16 projections when not packed) */
    int packed;                 /* 1: the base is in a pack file (the NVMe tier is possible) */
    int device;                 /* 1: a device backend (GPU tiers and PCIe); 0: a host backend,
                                 * where the "GPU" tier is host memory and nothing crosses PCIe */
    /* Device memory (bytes) that does not depend on the tiers or the micro-batch count: the
     * global tensors, the LoRA parameters with gradients and AdamW state, one micro-batch's
     * working set, dequantization staging, library workspaces, a reserve for the context. */
    uint64_t gpu_fixed;
    uint64_t slot_bytes;        /* one device slot for a streamed layer (== layer_bytes, rounded) */
    uint64_t ckpt_bytes;        /* one layer-input checkpoint of one micro-batch */
    uint64_t per_micro_bytes;   /* per micro-batch besides checkpoints (input ids, dx) */
    uint64_t kept_bytes;        /* one layer's forward activations of one micro-batch (kept
                                 * instead of recomputed when they fit; 0 = never keep) */
    uint64_t host_fixed;        /* host memory outside the pool: process, dataset, tokenizer */
    /* Measured (or 0 = estimated from flops_* / rates.flops) seconds for one micro-batch: */
    double t_fwd_layer;         /* one layer's forward */
    double t_bwd_layer;         /* one layer's backward, without the recompute */
    double t_head;              /* final norm + LM head + loss, forward and backward */
    double t_visit;             /* per layer visit, whatever the micro-batch count: binding the
                                 * layer's weights (NF4 dequantized into the bf16 staging), paid
                                 * by the forward and by the backward visit; 0 = none */
    double flops_fwd_layer, flops_bwd_layer, flops_head; /* FLOPs of the same, one micro-batch */
    int64_t tokens_per_micro;   /* rows * seq_len */
    int64_t micro_batches;      /* gradient accumulation fixed by the user; 0 = the planner
                                 * picks the smallest count that reaches >= 0.9 of the
                                 * compute-bound rate, up to max_micro_batches */
    int64_t max_micro_batches;  /* 0 = 16 */
    int ckpt_host_only;         /* 1: only plans with the checkpoints in host memory (a device
                                 * backend with a d2h rate; FTUNE_CKPT_HOST=1 in place.c) */
    int ckpt_host_last_resort;  /* 1: host checkpoints only when no plan with them on the device
                                 * fits the budgets (place.c's default while the CUDA checkpoint
                                 * offload awaits its first GPU run); 0: chosen by predicted time */
    uint64_t gpu_budget;        /* bytes the run may use on the device */
    uint64_t host_budget;       /* bytes of host memory for the pinned pool (and staging) */
    int forward_only;           /* 1: eval, logits, generation: a pass is the forward visits and
                                 * the head's forward (t_head), each streamed layer fetched once;
                                 * no backward (t_bwd_layer unused), checkpoints on the device */
    ft_plan_rates rates;
} ft_plan_in;

typedef struct ft_plan {
    int64_t n_layers;
    uint8_t tier[FT_PLAN_MAX_LAYERS]; /* enum ft_tier of each layer's base weights */
    int64_t n_tier[3];          /* layers per tier */
    int prefetch_depth;         /* device slots for streamed layers: 2 whenever a layer streams
                                 * (the executor takes 2..8), 0 when all are resident */
    int host_slots;             /* pinned staging buffers for NVMe reads (0 without NVMe layers) */
    int64_t micro_batches;      /* per optimizer step, all run per layer visit */
    int ckpt_tier;              /* FT_TIER_GPU or FT_TIER_HOST: where layer-input checkpoints live */
    /* With ckpt_tier == FT_TIER_HOST (ft_exec_init_ckpt_host): the last ckpt_dev_layers layers
     * keep their input checkpoints on the device, ckpt_sets (2..4) device sets of
     * micro_batches buffers carry the others; the first ckpt_host_layers =
     * max(0, L - ckpt_dev_layers - (ckpt_sets - 1)) layers' checkpoints have a home in pinned
     * host memory (the rest stay in their sets from the forward to the backward). */
    int64_t ckpt_dev_layers;
    int ckpt_sets;
    int64_t ckpt_host_layers;
    uint64_t ckpt_gpu_bytes;    /* device bytes of the checkpoints (either tier) */
    uint64_t ckpt_host_bytes;   /* pinned host bytes of the checkpoints */
    uint64_t ckpt_freed_bytes;  /* device bytes the host tier frees against all on the GPU */
    int keep_acts;              /* 1: forward activations kept, no recompute in the backward */
    uint64_t gpu_bytes;         /* predicted device use, <= gpu_budget */
    uint64_t host_bytes;        /* predicted pinned pool + staging, <= host_budget */
    double t_compute;           /* seconds of compute per optimizer step */
    double t_h2d;               /* seconds of host->device traffic per step (weights + ckpts) */
    double t_d2h;               /* seconds of device->host traffic per step (checkpoint stores) */
    double t_disk;              /* seconds of disk reads per step */
    double t_step;              /* predicted seconds per optimizer step */
    double tokens_per_s;        /* micro_batches * tokens_per_micro / t_step */
    const char *bound;          /* "compute", "PCIe" or "disk" */
} ft_plan;

/* Decides the plan. Greedy: layers go to the GPU tier while the device budget holds them
 * (after gpu_fixed, the checkpoints and prefetch slots; the last layers first), then to the
 * pinned-host pool while the host budget holds them, then to NVMe (packed bases only, spread
 * evenly among the streamed layers). Checkpoints on the GPU with activations kept, on the GPU
 * recomputed, or on the host are compared by predicted time (ties: fewer bytes moved);
 * rates.d2h == 0 keeps checkpoints on the device. With host checkpoints, the device memory
 * left after the layers goes to keeping the last layers' checkpoints on the device.
 * Returns 0, or FT_E_RANGE when nothing fits, with a message naming the smallest --gpu-mem and
 * --host-mem that would work (ft_plan_min_budgets). */
int ft_plan_make(const ft_plan_in *in, ft_plan *out);

/* The smallest device and host budgets (bytes) under which ft_plan_make succeeds (the smallest
 * device budget over the options, then the smallest host budget with it; for a tiny model
 * that can be everything resident). */
void ft_plan_min_budgets(const ft_plan_in *in, uint64_t *gpu_bytes, uint64_t *host_bytes);

/* Predicted seconds of one optimizer step for a given plan (the model above); ft_plan_make
 * fills t_* with it. */
double ft_plan_step_seconds(const ft_plan_in *in, const ft_plan *p);

/* K adapters per pass (offload/exec.h ft_exec_train_step_multi): *out = the inputs of a
 * one-adapter plan (*one) for passes of K adapters. A pass micro-batch holds K adapters'
 * micro-batches, so ckpt_bytes, per_micro_bytes, kept_bytes, tokens_per_micro and the
 * per-micro-batch times and FLOPs (t_fwd_layer, t_bwd_layer, t_head, flops_*) are K times
 * one's (the times: an estimate from K times the rows; a probe of one layer at K T tokens,
 * ft_exec_probe_layer, measures it), and gpu_fixed grows by (K - 1) adapter_bytes: each
 * further adapter's LoRA state (src/model/lora.h ft_lora_bytes) and its share of the
 * executor's one-micro-batch working set (offload/exec.h ft_exec_adapter_sizes.work). The
 * base weights (layer_bytes, slots) and t_visit (binding a layer's weights, once per visit
 * whatever K) stay. K < 1 is taken as 1. */
void ft_plan_in_adapters(const ft_plan_in *one, int64_t K, uint64_t adapter_bytes, ft_plan_in *out);

/* The most adapters per pass, 1..k_max, that ft_plan_make finds a plan for (memory grows with
 * K, so the search stops at the first K that does not fit), with that plan in *plan (its
 * tokens_per_s: all K adapters together). Returns K >= 1, or ft_plan_make's error for one
 * adapter. */
int64_t ft_plan_max_adapters(const ft_plan_in *one, uint64_t adapter_bytes, int64_t k_max,
                             ft_plan *plan);

/* A few human lines: tiers (with layer ranges), prefetch depth, micro-batches, checkpoint
 * tier, memory against budgets, predicted step time and tokens/s, the bound. Returns the
 * length written (truncated to n - 1). */
int ft_plan_format(const ft_plan_in *in, const ft_plan *p, char *buf, size_t n);

#endif
