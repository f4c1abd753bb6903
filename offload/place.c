/* place.c - measure, plan and place a packed base on a device backend (place.h). */
#include "offload/place.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offload/exec_internal.h"
#include "offload/probe.h"
#include "src/core/err.h"

uint64_t ft_place_rss(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (!f) return 0;
    if (fscanf(f, "%llu %llu", &size, &res) != 2) res = 0;
    fclose(f);
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* MemAvailable of /proc/meminfo in bytes, 0 if unknown. */
uint64_t ft_place_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* max |a - b| / max |a| over n values (0 when both are all zero). */
static double rel_maxdiff(const float *a, const float *b, int64_t n)
{
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - (double)b[i]);
        d = x > d || x != x ? x : d;
        mx = fabs((double)a[i]) > mx ? fabs((double)a[i]) : mx;
    }
    return d != d ? INFINITY : mx > 0 ? d / mx : d > 0 ? INFINITY : 0;
}

/* FTUNE_NF4_GEMM=auto: the probe has run with the NF4 projections dequantized (its times in
 * *t_dq, *t_f, *t_b, its output and input gradient in outs); runs it again with the fused GEMM
 * (outputs into outs + 2 T C) and keeps the fused GEMM, with its times, when it is faster and
 * its outputs agree (res: nf4_*; probe->nf4_fused says what was kept). */
static int probe_fused(ft_exec *probe, ft_pack_file *pack, int64_t T, const ft_place_opts *o, float *outs,
                       double *t_dq, double *t_f, double *t_b, ft_place_result *res)
{
    int64_t C = probe->m->cfg.hidden_size;
    double f_dq = 0, f_f = 0, f_b = 0;
    probe->nf4_fused = 1;
    FT_TRY(ft_exec_probe_layer(probe, pack, T, o->pos, o->seq_start, &f_dq, &f_f, &f_b, outs + 2 * T * C));
    double e_y = rel_maxdiff(outs, outs + 2 * T * C, T * C);
    double e_dx = rel_maxdiff(outs + T * C, outs + 3 * T * C, T * C);
    res->nf4_probed = 1;
    res->nf4_err = e_y > e_dx || e_dx != e_dx ? e_dx : e_y;
    res->nf4_t_dequant_path = *t_dq + *t_f + *t_b;
    res->nf4_t_fused_path = f_dq + f_f + f_b;
    probe->nf4_fused = res->nf4_err <= FT_PLACE_NF4_MAX_ERR && res->nf4_t_fused_path < res->nf4_t_dequant_path;
    if (probe->nf4_fused) {
        *t_dq = f_dq;
        *t_f = f_f;
        *t_b = f_b;
    }
    return 0;
}

/* The disk rate of a pack not built yet (ft_place_preview): a read of np->disk_file, else
 * the assumption; res->disk_* say which. */
static int preview_disk(const ft_place_nopack *np, ft_place_result *res)
{
    const char *dev = np->disk_same_device > 0    ? "on the cache folder's device"
                      : np->disk_same_device == 0 ? "on another device than the cache folder: "
                                                    "assumed to be the pack's rate"
                                                  : "device unknown";
    if (np->disk_file && np->disk_file[0]) {
        ft_probe_disk_result *dr = calloc(1, sizeof *dr);
        if (!dr) return ft_err(-ENOMEM, "out of memory");
        int rc = ft_probe_disk(np->disk_file, (uint64_t)8 << 30, dr);
        if (!rc && dr->bytes_per_s > 0) {
            res->disk_rate = dr->bytes_per_s;
            snprintf(res->disk_mode, sizeof res->disk_mode, "%s", dr->mode);
            snprintf(res->disk_source, sizeof res->disk_source,
                     "the pack is not built: %.1f MB of %s read instead, %s%s%s", dr->bytes / 1e6,
                     np->disk_file, dev, dr->page_cache ? "; " : "", dr->page_cache ? dr->note : "");
            free(dr);
            return 0;
        }
        free(dr);
        snprintf(res->disk_source, sizeof res->disk_source,
                 "the pack is not built and reading %s failed (%s): assumed %.2f GB/s",
                 np->disk_file, rc ? ft_errmsg() : "no rate", FT_PLACE_DISK_ASSUMED / 1e9);
        ft_err_clear();
    } else {
        snprintf(res->disk_source, sizeof res->disk_source,
                 "the pack is not built and there is no source file to read: assumed %.2f GB/s",
                 FT_PLACE_DISK_ASSUMED / 1e9);
    }
    res->disk_rate = FT_PLACE_DISK_ASSUMED;
    snprintf(res->disk_mode, sizeof res->disk_mode, "assumed");
    return 0;
}

/* The plan of res->in for the adapters per pass o asks for: n_adapters, or the most up to
 * k_max (ft_plan_max_adapters); res->in becomes the inputs of that many. */
static int plan_adapters(const ft_place_opts *o, ft_place_result *res)
{
    res->n_adapters = 1;
    if (o->n_adapters <= 1 && o->k_max <= 1) return ft_plan_make(&res->in, &res->plan);
    int64_t K = o->n_adapters > 1 ? o->n_adapters : 0;
    if (!K) {
        int64_t got = ft_plan_max_adapters(&res->in, o->adapter_bytes, o->k_max, &res->plan);
        if (got < 0) return (int)got;
        K = got;
    }
    ft_plan_in one = res->in;
    ft_plan_in_adapters(&one, K, o->adapter_bytes, &res->in);
    res->n_adapters = K;
    return ft_plan_make(&res->in, &res->plan);
}

/* ft_place_packed (np NULL) and ft_place_preview (np: pack is np->probe, the sizes and the
 * disk from np, apply 0). */
static int place(ft_backend *be, const ft_model *m, ft_lora *lora, ft_pack_file *pack,
                 const ft_place_nopack *np, const ft_place_opts *o, int apply, ft_exec *ex,
                 ft_place_result *res)
{
    const ft_model_config *c = &m->cfg;
    int64_t L = c->num_hidden_layers, T = o->T, C = c->hidden_size, V = c->vocab_size;
    memset(res, 0, sizeof *res);
    if (be->ops->host_memory)
        return ft_err(FT_E_INVALID, "ft_place_packed: %s is a host-memory backend", be->ops->name);
    if (L > FT_PLAN_MAX_LAYERS)
        return ft_err(FT_E_UNSUPPORTED, "%lld layers: the planner takes at most %d",
                      (long long)L, FT_PLAN_MAX_LAYERS);

    /* 1. one layer on the device, timed on a one-micro-batch executor (with
     * FTUNE_NF4_GEMM=auto both ways: NF4 dequantized into the staging, then fused) */
    ft_exec probe;
    double t_dq = 0, t_f = 0, t_b = 0;
    /* the NF4 GEMM modes concern an NF4 pack only */
    int mode = ft_pack_header(pack)->quant == FT_PACK_QUANT_NF4 ? ft_exec_nf4_gemm_mode(be)
                                                                 : FT_NF4_GEMM_DEQUANT;
    int rc = ft_exec_init_ex(&probe, be, m, lora, T, 1, o->rope_seq_len, 0);
    if (rc < 0) return rc; /* a failed init frees what it allocated */
    float *outs = mode == FT_NF4_GEMM_AUTO ? malloc((size_t)(4 * T * C) * sizeof(float)) : NULL;
    rc = mode == FT_NF4_GEMM_AUTO && !outs ? ft_err(-ENOMEM, "probe: out of memory") : 0;
    probe.nf4_fused = mode == FT_NF4_GEMM_FUSED;
    if (!rc) rc = ft_exec_probe_layer(&probe, pack, T, o->pos, o->seq_start, &t_dq, &t_f, &t_b, outs);
    if (!rc && outs) rc = probe_fused(&probe, pack, T, o, outs, &t_dq, &t_f, &t_b, res);
    res->nf4_fused = probe.nf4_fused;
    size_t kept1 = ft_exec_kept_bytes(&probe) / (size_t)L;
    size_t arena1 = probe.arena_bytes;
    free(outs);
    if (rc) return ft_exec_free_keeping_err(&probe, rc);
    ft_exec_free(&probe);
    res->t_dequant = t_dq;

    /* 2. what the device holds already (context, adapter, workspaces prepared above) */
    size_t free_b = 0, total_b = 0;
    FT_TRY(ft_backend_mem_free(be, &free_b, &total_b));
    size_t used = total_b - free_b;

    /* 3. sizes (a pack not built yet: those it will have) */
    size_t blocks = 0, biggest = np ? 0 : ft_pack_max_layer_bytes(pack);
    for (int64_t l = 0; l < L; l++) {
        size_t b = np ? (size_t)np->block_bytes[l] : ft_pack_block_bytes(pack, l);
        blocks += b;
        if (np && b > biggest) biggest = b;
    }
    res->pack_bytes = blocks;
    /* a pack-only model: the final norm and one V x C table (the untied LM head, or a tied
     * model's embeddings, which are its LM head; tiers.c ft_exec_globals_from_pack) */
    size_t globals = m->embed ? ft_exec_global_bytes(m) : (size_t)(C + 16 + V * C) * sizeof(float);
    size_t staging = ft_exec_staging_bytes(m, pack, res->nf4_fused);
    size_t ckpt = (size_t)(T * C) * sizeof(float), per_micro = ckpt + 16 * (size_t)T;
    const size_t spare = (size_t)1 << 30;
    ft_plan_in *in = &res->in;
    in->n_layers = L;
    in->layer_bytes = biggest;
    in->packed = 1;
    in->device = 1;
    in->gpu_fixed = used + (arena1 - (size_t)(L + 1) * ckpt - per_micro) + globals + staging + spare;
    in->slot_bytes = biggest;
    in->ckpt_bytes = ckpt;
    in->per_micro_bytes = per_micro;
    in->kept_bytes = kept1;
    in->host_fixed = ft_place_rss();
    in->t_fwd_layer = t_f;
    in->t_visit = t_dq; /* once per visit, for all its micro-batches (the recompute reuses it) */
    in->t_bwd_layer = o->forward_only ? 0 : t_b;
    double P = ft_layer_proj_params(&m->cfg);
    in->flops_fwd_layer = 2.0 * (double)T * P;
    in->flops_bwd_layer = o->forward_only ? 0 : 2.0 * in->flops_fwd_layer;
    /* the LM head's forward (2 T C V), and with a backward its input gradient (as much again) */
    in->flops_head = (o->forward_only ? 2.0 : 4.0) * (double)T * (double)C * (double)V;
    in->forward_only = o->forward_only;
    if (o->forward_only) in->kept_bytes = 0; /* nothing is kept for a backward */
    double rate = t_f > 0 ? in->flops_fwd_layer / t_f : 0;
    in->t_head = rate > 0 ? in->flops_head / rate : 0;
    in->tokens_per_micro = T;
    in->micro_batches = o->grad_accum;
    in->max_micro_batches = 16;
    in->gpu_budget = o->gpu_budget ? o->gpu_budget : total_b;
    uint64_t avail = ft_place_mem_available();
    in->host_budget = o->host_budget ? o->host_budget
                                     : avail > ((uint64_t)4 << 30) ? avail - ((uint64_t)4 << 30) : 0;
    in->rates.flops = rate;

    /* 4. the bus, and the disk when some layers may have to stay there */
    double h2d = 0, d2h = 0;
    FT_TRY(ft_probe_pcie(be, 0, &h2d, &d2h));
    in->rates.h2d = h2d;
    in->rates.d2h = d2h; /* checkpoint stores (offload/actckpt.h) */
    /* be->tune.ckpt_host (the program's FTUNE_CKPT_HOST): ALWAYS = checkpoints in host memory
     * (tests), AUTO = where the predicted step is faster; LAST_RESORT (the default) = in host
     * memory only when the run does not fit otherwise (the CUDA checkpoint offload is checked
     * on the CPU twin but has not run on a GPU yet) */
    in->ckpt_host_only = be->tune.ckpt_host == FT_CKPT_HOST_ALWAYS;
    in->ckpt_host_last_resort = be->tune.ckpt_host != FT_CKPT_HOST_AUTO;
    if (blocks + 3 * biggest > in->host_budget && np) {
        FT_TRY(preview_disk(np, res));
        in->rates.disk = res->disk_rate;
    } else if (blocks + 3 * biggest > in->host_budget) {
        ft_probe_disk_result *dr = calloc(1, sizeof *dr);
        if (!dr) return ft_err(-ENOMEM, "out of memory");
        /* 8 GiB: on the lent machine's virtual disk, 2 GiB samples ranged 1.44-1.82 GB/s */
        /* the pack's own blocks, read as the executor reads them; the best queue depth and
         * chunk of the grid are given to the pack's reader (and its read-ahead) */
        rc = ft_probe_pack_reader(pack, (uint64_t)8 << 30, dr);
        if (!rc) {
            res->disk_rate = in->rates.disk = dr->bytes_per_s;
            snprintf(res->disk_mode, sizeof res->disk_mode, "%s", dr->mode);
        }
        free(dr);
        if (rc) return rc;
    }

    /* 5. the plan (several adapters per pass: the inputs of K, ft_plan_in_adapters) */
    FT_TRY(plan_adapters(o, res));
    ft_plan_format(in, &res->plan, res->text, sizeof res->text);
    if (!apply) return 0;

    /* 6. the executor as planned: with host checkpoints, its arena has only the device sets
     * and the last layers' checkpoints from the start */
    const ft_plan *pl = &res->plan;
    const int64_t K = res->n_adapters;
    if (o->n_adapters > 0 || o->k_max > 0) /* the adapters come with each step */
        rc = ft_exec_init_multi(ex, be, m, K, o->r_max, T, pl->micro_batches, o->rope_seq_len, 0,
                                pl->ckpt_tier == FT_TIER_HOST ? pl->ckpt_dev_layers : 0,
                                pl->ckpt_tier == FT_TIER_HOST ? pl->ckpt_sets : 0);
    else if (pl->ckpt_tier == FT_TIER_HOST)
        rc = ft_exec_init_ckpt_host(ex, be, m, lora, T, pl->micro_batches, o->rope_seq_len, 0,
                                    pl->ckpt_dev_layers, pl->ckpt_sets);
    else
        rc = ft_exec_init_ex(ex, be, m, lora, T, pl->micro_batches, o->rope_seq_len, 0);
    if (!rc) {
        ex->nf4_fused = res->nf4_fused;
        int slots = pl->prefetch_depth < 2 ? 2 : pl->prefetch_depth > 8 ? 8 : pl->prefetch_depth;
        int stage = pl->host_slots < 1 ? 1 : pl->host_slots > 8 ? 8 : pl->host_slots;
        rc = ft_exec_use_pack_tiers(ex, pack, pl->tier, slots, stage);
    }
    if (!rc && pl->keep_acts) {
        int k = ft_exec_keep_activations(ex, (size_t)-1);
        rc = k < 0 ? k : 0;
    }
    /* the caller frees *ex only on success: on a failure, what the calls after the init
     * allocated is freed here (a failed init frees its own) */
    return rc < 0 ? ft_exec_free_keeping_err(ex, rc) : 0;
}

int ft_place_packed(ft_backend *be, const ft_model *m, ft_lora *lora, ft_pack_file *pack,
                    const ft_place_opts *o, int apply, ft_exec *ex, ft_place_result *res)
{
    return place(be, m, lora, pack, NULL, o, apply, ex, res);
}

int ft_place_preview(ft_backend *be, const ft_model *m, ft_lora *lora, const ft_place_nopack *np,
                     const ft_place_opts *o, ft_place_result *res)
{
    if (!np || !np->probe || !np->block_bytes)
        return ft_err(FT_E_INVALID, "ft_place_preview: no probe pack or block sizes");
    if (ft_pack_header(np->probe)->n_layers != (uint32_t)m->cfg.num_hidden_layers)
        return ft_err(FT_E_INVALID, "%s: a probe pack of %u layers for a model of %lld",
                      ft_pack_path(np->probe), ft_pack_header(np->probe)->n_layers,
                      (long long)m->cfg.num_hidden_layers);
    return place(be, m, lora, np->probe, np, o, 0, NULL, res);
}
