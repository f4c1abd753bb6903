/* place.h - a packed base on a device backend: measure, plan, place (offload/plan.h,
 * offload/probe.h, exec.h ft_exec_use_pack_tiers).
 *
 * Measures what the planner needs on this machine (one layer's dequantization, forward and
 * backward on the device; pinned PCIe copy rates, both ways; the pack file's raw read rate
 * when some layers may have to stay on disk), fills ft_plan_in from the model, the pack and the
 * budgets, asks ft_plan_make, and (apply = 1) creates the executor with the planned tiers.
 */
#ifndef FT_PLACE_H
#define FT_PLACE_H

#include <stdint.h>

#include "offload/exec.h"
#include "offload/plan.h"

typedef struct ft_place_opts {
    int64_t T;                  /* tokens per micro-batch (rows * seq_len) */
    int64_t rope_seq_len;       /* for the executor (ft_exec_init) */
    int64_t grad_accum;         /* micro-batches per step; 0: the planner picks */
    uint64_t gpu_budget;        /* device bytes the process may hold in all (0: the GPU's total) */
    uint64_t host_budget;       /* host bytes for the pinned pool and staging (0: available
                                 * physical memory less 4 GiB) */
    const int32_t *pos, *seq_start; /* a real micro-batch's layout (T each) for the probe, or NULL */
    int forward_only;           /* 1: eval, logits, generation (ft_plan_in.forward_only): the
                                 * plan predicts a forward pass of T tokens, no backward */
    /* Several adapters per pass (exec.h ft_exec_init_multi; T is then one adapter's
     * micro-batch): n_adapters >= 2 plans for that many (ft_plan_in_adapters); k_max >= 1 with
     * n_adapters 0 picks the most that fit, up to k_max (ft_plan_max_adapters); both 0: one
     * adapter, the executor made for lora. r_max: the largest rank of the pass's adapters;
     * adapter_bytes: what each further adapter adds (LoRA state, ft_lora_bytes, plus its
     * working set, ft_exec_adapter_sizes.work). */
    int64_t n_adapters, k_max, r_max;
    uint64_t adapter_bytes;
} ft_place_opts;

/* MemAvailable of /proc/meminfo in bytes (0 if unreadable). */
uint64_t ft_place_mem_available(void);

#define FT_PLACE_NF4_MAX_ERR 1e-2 /* the same bf16 operands; only the fp32 summation order differs */

typedef struct ft_place_result {
    ft_plan_in in;
    ft_plan plan;
    double t_dequant;           /* seconds: one layer's NF4 -> bf16 (probe; ~0 when fused) */
    /* How NF4 projections are multiplied (exec.h enum ft_nf4_gemm): nf4_fused is what the
     * executor does; with FTUNE_NF4_GEMM=auto (nf4_probed = 1) the probe timed one layer's
     * forward + backward both ways (seconds, dequantization included) and compared their
     * outputs (nf4_err: the larger of max |difference| / max |value| over the block's output
     * and its input gradient); the fused GEMM is kept when it is faster and nf4_err <=
     * FT_PLACE_NF4_MAX_ERR. */
    int nf4_fused, nf4_probed;
    double nf4_t_dequant_path, nf4_t_fused_path, nf4_err;
    double disk_rate;           /* bytes/s of the probe (0: not measured) */
    char disk_mode[256];
    /* ft_place_preview: what disk_rate stands on ("" with a pack: its own blocks were read) */
    char disk_source[768];
    uint64_t pack_bytes;        /* all layer blocks */
    char text[2048];            /* ft_plan_format's lines */
    int64_t n_adapters;         /* adapters per pass planned (1 without ft_place_opts'
                                 * n_adapters / k_max) */
} ft_place_result;

/* Measures (with FTUNE_NF4_GEMM=auto, also the fused NF4 GEMM against dequantization),
 * plans and (apply != 0) builds *ex (ft_exec_init_ex, or ft_exec_init_ckpt_host when
 * the plan puts the activation checkpoints in pinned host memory, + ft_exec_use_pack_tiers with
 * the plan's tiers, slots and micro-batches). The probed D2H rate lets the planner choose host
 * checkpoints; FTUNE_CKPT_HOST=1 in the environment makes it (ft_plan_in.ckpt_host_only).
 * lora must be allocated on be. With apply == 0 *ex is untouched (`ftune plan`). Returns 0,
 * FT_E_RANGE when no plan fits the budgets (the message names the smallest --gpu-mem and
 * --host-mem), or a probe/executor error. The caller owns *ex (ft_exec_free) only after 0:
 * on an error nothing is left to free (a failure during or after the executor's init frees
 * it and zeroes *ex), and ft_errmsg() is the first failure's message, not the cleanup's. */
int ft_place_packed(ft_backend *be, const ft_model *m, ft_lora *lora, ft_pack_file *pack,
                    const ft_place_opts *o, int apply, ft_exec *ex, ft_place_result *res);

/* A pack that is not built yet, as ft_place_preview takes it (offload/pack.h ft_pack_preview). */
typedef struct ft_place_nopack {
    ft_pack_file *probe;        /* a partial pack holding layer 0's block (ft_pack_open_partial):
                                 * the probe's layer, and the header's quantization */
    const uint64_t *block_bytes; /* each layer's block size in the pack to be built
                                 * (ft_pack_layout; n_layers entries are read) */
    const char *disk_file;      /* a file read for the disk rate when the disk tier may be
                                 * needed (NULL: none; FT_PLACE_DISK_ASSUMED is taken) */
    int disk_same_device;       /* 1: disk_file is on the pack's file system, 0: on another,
                                 * -1: unknown (only said in disk_source) */
} ft_place_nopack;

/* The disk rate assumed when there is nothing to read (bytes/s): the lent GPU machine's
 * virtual disk read the pack at 1.44-1.82 GB/s in 2 GiB samples. */
#define FT_PLACE_DISK_ASSUMED 1.5e9

/* ft_place_packed(apply = 0) for a pack not built yet (`ftune plan`): the same probe, sizes
 * and plan, with the probe's layer from np->probe, the layer blocks' sizes from
 * np->block_bytes, and, when the disk tier may be needed, the disk rate of a read of
 * np->disk_file (ft_probe_disk, the pack reader's 8 GiB at most) in place of the pack's own
 * blocks; with no file, or when reading it fails, FT_PLACE_DISK_ASSUMED. res->disk_source says
 * which. For an existing pack this gives ft_place_packed's plan (the tiers, micro-batches and
 * memory are the same for the same budgets; predicted times differ by the probes' noise and,
 * with disk layers, by the file read). Returns ft_place_packed's errors. */
int ft_place_preview(ft_backend *be, const ft_model *m, ft_lora *lora, const ft_place_nopack *np,
                     const ft_place_opts *o, ft_place_result *res);

/* Resident set size of this process in bytes (/proc/self/statm), 0 if unknown. */
uint64_t ft_place_rss(void);

#endif
