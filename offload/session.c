/* session.c - the runtime session: open, the placement decision, close (see session.h). */
#include "offload/session.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "adapters/peft.h"
#include "adapters/qcorr.h"
#include "offload/exec_impl.h"
#include "offload/pack_model.h"
#include "offload/place.h"
#include "offload/prefetch.h"
#include "src/core/err.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* GiB, for messages. */
static double gib(double bytes) { return bytes / 1073741824.0; }

static void note(const ft_session *s, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void note(const ft_session *s, int kind, const char *fmt, ...)
{
    if (!s->cfg.note) return;
    char line[4608];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->cfg.note(s->cfg.note_user, kind, line);
}

/* offload/pack.h ft_pack_wait_cb: "pack: waiting for process PID, which is building PATH ...". */
static void pack_wait_note(const char *path, long pid, void *user)
{
    char line[4400];
    ft_pack_wait_text(line, sizeof line, path, pid);
    note(user, FT_SESSION_INFO, "pack: %s", line);
}

/* ---- opening --------------------------------------------------------------------------- */

int ft_session_open_model(ft_session *s, const ft_session_cfg *c)
{
    memset(s, 0, sizeof *s);
    s->cfg = *c;
    s->gpu_mem = c->gpu_mem;
    s->host_mem = c->host_mem;
    s->base_layers[0] = s->base_layers[1] = s->base_layers[2] = -1;
    /* the weights are read once the placement knows where the base goes: a QLoRA base comes
     * from the pack, built by streaming the safetensors, so the fp32 model is never in host
     * memory */
    FT_TRY(ft_pack_model_load_deferred(&s->model, c->model));
    if (c->tokenizer) FT_TRY(ft_model_tokenizer(s->model, &s->tok));
    return 0;
}

/* Loads the PEFT adapter of adapter_dir into s->lora (none before). */
static int load_adapter(ft_session *s, const char *adapter_dir)
{
    ft_lora_cfg lc;
    FT_TRY(ft_peft_read_config(adapter_dir, &lc));
    lc.dropout = 0;
    lc.seed = 0;
    FT_TRY(ft_lora_init(&s->lora, s->model, &lc, s->be));
    s->has_lora = 1;
    return ft_peft_load_weights(adapter_dir, &s->lora);
}

/* 1 when the pack-only model m's pack holds bf16 weights. */
static int pack_is_bf16(const ft_model *m)
{
    return ft_pack_quant_of_path(m->pack_only) == FT_PACK_QUANT_BF16;
}

/* The run folder whose quant_correction belongs to adapter_dir: adapter_dir itself (OUT), or
 * its parent (OUT/best, OUT/checkpoint-N); 0 when neither has one. */
static int qcorr_home(const char *adapter_dir, char *out, size_t n)
{
    char p[4300];
    snprintf(out, n, "%s", adapter_dir);
    for (int up = 0; up < 2; up++) {
        snprintf(p, sizeof p, "%s/" FT_QCORR_DIR "/adapter_config.json", out);
        if (access(p, F_OK) == 0) return 1;
        char *slash = strrchr(out, '/');
        if (!up && slash && slash[1]) *slash = 0;
        else if (!up) snprintf(out, n, "%s", adapter_dir[0] == '/' ? "/" : ".");
    }
    return 0;
}

static int preview_pack(ft_session *s, const ft_pack_settings *ps, const ft_pack_ensure_info *pi);

/* Finds or builds the model's pack in `quant` (NF4, or bf16 for a bf16 base streamed by the
 * offload executor) under cache_dir and opens it in s->pack (checksums were verified by
 * ft_pack_ensure when it was reused). Training reports what happened (a rebuilt pack:
 * truncated, corrupted, other settings, as a warning naming the reason); the forward commands
 * note a build only. plan_only builds none: a pack not in the cache (or not usable there) is
 * previewed instead (preview_pack). */
static int open_base_pack(ft_session *s, int quant, int plan_only)
{
    ft_pack_settings ps;
    ft_pack_settings_default(&ps, quant);
    ft_pack_ensure_info *pi = malloc(sizeof *pi);
    if (!pi) return ft_err(-ENOMEM, "out of memory");
    const char *model = s->model->path;
    int rc = plan_only ? ft_pack_locate(model, s->cfg.cache_dir, &ps, pi) /* builds nothing */
                       : ft_pack_ensure_loaded(model, s->model, s->cfg.cache_dir, &ps, 0, pi,
                                               pack_wait_note, s);
    if (!rc && plan_only && pi->action != FT_PACK_REUSED) {
        rc = preview_pack(s, &ps, pi);
        free(pi);
        return rc;
    }
    if (!rc && !s->cfg.train && pi->action != FT_PACK_REUSED)
        note(s, FT_SESSION_INFO, "pack: built %s", pi->path);
    if (!rc && s->cfg.train && pi->action == FT_PACK_REBUILT)
        note(s, FT_SESSION_WARN, "the cached pack was not usable, rebuilt it: %s", pi->reason);
    if (!rc && s->cfg.train && pi->action == FT_PACK_REUSED)
        note(s, FT_SESSION_INFO, "pack: reusing %s (identity and settings match, checksums %s)%s",
             pi->path, pi->verified ? "verified" : "verified at an earlier start: its .verified "
             "stamp matches the file", pi->waited_s > 0 ? "; another run built it" : "");
    else if (!rc && s->cfg.train)
        note(s, FT_SESSION_INFO, "pack: built %s: %.1f MB in %.1f s (%.1f MB/s), largest layer block %.1f MB",
             pi->path, pi->stats.file_bytes / 1e6, pi->stats.seconds,
             pi->stats.seconds > 0 ? pi->stats.file_bytes / 1e6 / pi->stats.seconds : 0.0,
             pi->stats.max_layer_bytes / 1e6);
    if (!rc) rc = ft_pack_open(&s->pack, pi->path, 0);
    free(pi);
    return rc;
}

/* The forward commands' requests at open: the NF4 pack, or the weights on a host backend. */
static int open_forward_base(ft_session *s)
{
    ft_model *m = s->model;
    if (s->cfg.quant == FT_PACK_QUANT_NF4) {
        if (m->pack_only[0] && pack_is_bf16(m))
            return ft_err(FT_E_INVALID, "%s holds only the bf16 pack %s: --quant nf4 cannot be served",
                          s->cfg.model, m->pack_only);
        if (m->pack_only[0]) return 0;
        /* on an error the model is as it was (ft_pack_model_use checks the pack first) */
        FT_TRY(open_base_pack(s, FT_PACK_QUANT_NF4, 0));
        return ft_pack_model_use(m, ft_pack_path(s->pack));
    }
    /* a bf16 base on a device stays deferred: the placement reads it or streams it */
    if (s->be->ops->host_memory || m->pack_only[0]) FT_TRY(ft_model_load_weights(m));
    return 0;
}

int ft_session_open_backend(ft_session *s)
{
    const ft_session_cfg *c = &s->cfg;
    FT_TRY(ft_backend_init(&s->be, c->device, c->threads));
    if (c->cuda_fused) {
        if (strcmp(s->be->ops->name, "cuda"))
            return ft_err(FT_E_INVALID, "--cuda-fused: the fused kernels are the CUDA backend's (device %s)",
                          s->be->ops->name);
        FT_TRY(ft_backend_cuda_set_fused(s->be, c->cuda_fused));
        note(s, FT_SESSION_INFO, "CUDA fused kernels: mask 0x%x (docs/gpu.md)", c->cuda_fused);
    }
    s->be->tune = c->tune;
    if (c->train) return 0; /* the training adapter and the base: ft_session_place */
    FT_TRY(open_forward_base(s));
    if (c->adapter) {
        FT_TRY(load_adapter(s, c->adapter));
        char home[4200];
        if (c->quant == FT_PACK_QUANT_NF4 && qcorr_home(c->adapter, home, sizeof home)) {
            FT_TRY(ft_qcorr_load(&s->lora, home));
            note(s, FT_SESSION_INFO, "the NF4 base with its quantization correction %s/" FT_QCORR_DIR
                 " (the adapter was trained on it)", home);
            s->qcorr = 1;
        }
    }
    if (c->quant == FT_PACK_QUANT_BF16 && s->model->pack_only[0] && !pack_is_bf16(s->model))
        return ft_err(FT_E_INVALID, "%s holds only the NF4 pack %s: --quant bf16 cannot be served "
                      "(use --quant nf4, or drop --quant)", c->model, s->model->pack_only);
    return 0;
}

int ft_session_open(ft_session *s, const ft_session_cfg *c)
{
    FT_TRY(ft_session_open_model(s, c));
    return ft_session_open_backend(s);
}

/* ---- the placement decision ----------------------------------------------------------- */

/* The device budget and the resident run's need, read once per placement. */
typedef struct place_need {
    ft_mem_budget mb;           /* device backends: ft_backend_mem_budget (zero on the host) */
    size_t exec;                /* ft_exec_bytes with every layer resident */
    size_t need;                /* exec + the spare (ft_session_place) */
} place_need;

/* Training's quantization of the base (--quant, or auto: bf16 unless a device backend's
 * budget cannot hold the bf16 run, then nf4), why in s->quant_why. NF4 needs a backend that
 * dequantizes it (the CPU on the host, CUDA with dequant_nf4): FT_E_UNSUPPORTED on another,
 * naming the way out. The forward commands take what they opened. */
static int choose_quant(ft_session *s, const place_need *nd)
{
    const ft_session_cfg *c = &s->cfg;
    const ft_model *m = s->model;
    const ft_backend *be = s->be;
    char *why = s->quant_why;
    const size_t n = sizeof s->quant_why;
    why[0] = 0;
    if (!c->train) {
        s->quant = m->pack_only[0] ? ft_pack_quant_of_path(m->pack_only) : FT_PACK_QUANT_BF16;
        return 0;
    }
    if (m->pack_only[0]) { /* only the pack exists: its quantization it is */
        int pq = ft_pack_quant_of_path(m->pack_only);
        if (c->quant != FT_SESSION_QUANT_AUTO && c->quant != pq)
            return ft_err(FT_E_INVALID, "%s holds only %s (a pack-only model): --quant %s cannot be "
                          "served; drop --quant", c->model, m->pack_only, ft_pack_quant_name(c->quant));
        s->quant = pq;
        snprintf(why, n, "the model folder holds only the pack %.160s", m->pack_only);
    } else if (c->quant == FT_PACK_QUANT_NF4 || c->quant == FT_PACK_QUANT_BF16) {
        s->quant = c->quant;
    } else if (c->quant != FT_SESSION_QUANT_AUTO) {
        return ft_err(FT_E_INVALID, "unknown base quantization %d (nf4, bf16)", c->quant);
    } else if (be->ops->host_memory) {
        s->quant = FT_PACK_QUANT_BF16;
        snprintf(why, n, "auto: the %s backend holds the base in host memory", be->ops->name);
    } else {
        s->quant = nd->need <= nd->mb.avail ? FT_PACK_QUANT_BF16 : FT_PACK_QUANT_NF4;
        snprintf(why, n, "auto: the bf16 base run needs %.2f GiB, %s allows %.2f GiB",
                 gib((double)nd->need), s->gpu_mem > 0 ? "--gpu-mem" : "the GPU", gib((double)nd->mb.avail));
    }
    if (s->quant == FT_PACK_QUANT_NF4 && !be->ops->host_memory && !be->ops->dequant_nf4)
        return ft_err(FT_E_UNSUPPORTED, "QLoRA (--quant nf4%s%s) needs NF4 kernels, which the %s "
                      "backend lacks; use --device cpu%s",
                      why[0] ? "; " : "", why, be->ops->name,
                      c->quant == FT_SESSION_QUANT_AUTO
                          ? ", a larger --gpu-mem, or a smaller --batch-size, --seq-len or --grad-accum"
                          : " or --quant bf16");
    return 0;
}

/* A bf16 base not read yet on a device whose budget cannot hold it with every layer
 * resident: says so (it is streamed from its bf16 pack). */
static void note_streamed(const ft_session *s, const place_need *nd)
{
    const char *by = s->gpu_mem > 0 ? "--gpu-mem" : "the GPU";
    if (s->cfg.train) {
        note(s, FT_SESSION_INFO, "the bf16 base run needs %.3f GiB of GPU memory with every "
             "layer resident, %s allows %.3f GiB (%.3f GiB in use): the base is streamed from "
             "its bf16 pack", gib((double)nd->need), by, gib((double)nd->mb.avail),
             gib((double)nd->mb.used));
        return;
    }
    char kept[80] = "";
    if (s->gpu_reserve > 0)
        snprintf(kept, sizeof kept, ", %.3f GiB kept for generation's KV cache and buffers",
                 gib((double)s->gpu_reserve));
    note(s, FT_SESSION_INFO, "the bf16 base run needs %.3f GiB of GPU memory with every layer "
         "resident, %s allows %.3f GiB (%.3f GiB in use%s): it is streamed from its bf16 pack",
         gib((double)nd->need), by, gib((double)nd->mb.avail), gib((double)nd->mb.used), kept);
}

/* The base where it goes: a packed one's pack open (training: found or built, a fresh
 * correction's unquantized weights read first; plan_only: maybe only previewed), a resident
 * one's weights read (not for a plan). */
static int settle_base(ft_session *s, const ft_session_place_cfg *pc, int packed)
{
    ft_model *m = s->model;
    if (packed) {
        /* a forward command's earlier placement, or its NF4 open */
        if (s->pack || s->preview) return 0;
        if (!s->cfg.train && m->pack_only[0]) return ft_pack_open(&s->pack, m->pack_only, 0);
        if (s->quant == FT_PACK_QUANT_NF4 && pc->nf4_weights && !pc->plan_only)
            FT_TRY(ft_model_load_weights(m));
        return open_base_pack(s, s->quant, pc->plan_only);
    }
    if (pc->plan_only || !ft_model_deferred(m)) return 0;
    double t0 = now_s();
    FT_TRY(ft_model_load_weights(m));
    if (s->cfg.train) note(s, FT_SESSION_INFO, "model weights read in %.1f s", now_s() - t0);
    return 0;
}

/* Training's report of a placement by the offload planner: the probe, the plan, and once
 * placed, the memory in use and the disk reader. */
static void note_planned(const ft_session *s, const ft_session_place_cfg *pc,
                         const ft_place_result *pr, int rc)
{
    if (!rc || pr->text[0]) {
        char disk[1200] = "";
        if (pr->disk_rate > 0)
            snprintf(disk, sizeof disk, "; disk %.2f GB/s (%s%s%s)", pr->disk_rate / 1e9, pr->disk_mode,
                     pr->disk_source[0] ? "; " : "", pr->disk_source);
        note(s, FT_SESSION_INFO, "probe: one layer of %lld tokens: dequant %.2f ms, forward %.2f ms, "
             "backward %.2f ms; PCIe H2D %.1f GB/s%s",
             (long long)pc->T, pr->t_dequant * 1e3, pr->in.t_fwd_layer * 1e3,
             pr->in.t_bwd_layer * 1e3, pr->in.rates.h2d / 1e9, disk);
        if (pr->nf4_probed)
            note(s, FT_SESSION_INFO, "probe (FTUNE_NF4_GEMM=auto): one layer's forward + backward "
                 "%.2f ms with the NF4 projections dequantized per visit, %.2f ms with the fused "
                 "NF4 GEMM (outputs agree to %.1e; at most %.0e taken): %s",
                 pr->nf4_t_dequant_path * 1e3, pr->nf4_t_fused_path * 1e3, pr->nf4_err,
                 FT_PLACE_NF4_MAX_ERR, pr->nf4_fused ? "fused" : "dequantized");
    }
    if (!rc || pr->text[0]) {
        for (const char *line = pr->text; *line;) {
            const char *nl = strchr(line, '\n');
            note(s, FT_SESSION_PLAN, "%.*s", nl ? (int)(nl - line) : (int)strlen(line), line);
            line = nl ? nl + 1 : line + strlen(line);
        }
    }
    if (rc || pc->plan_only) return;
    size_t fb = 0, tb = 0;
    if (!ft_backend_mem_free(s->be, &fb, &tb))
        note(s, FT_SESSION_INFO, "placed: device memory in use %.2f GiB of %.2f GiB (budget %.2f GiB), "
             "host RSS %.2f GiB (budget %.2f GiB for the pinned pool and staging)",
             gib((double)(tb - fb)), gib((double)tb), gib((double)pr->in.gpu_budget),
             gib((double)ft_place_rss()), gib((double)pr->in.host_budget));
    char io[1024];
    ft_exec_io_describe(s->ex, io, sizeof io);
    if (io[0]) note(s, FT_SESSION_INFO, "%s", io);
}

/* A packed base on a device backend: measured, planned (offload/place.h) and placed within
 * the budgets (less gpu_reserve); s->n_micro gets the planned micro-batch count, base_layers
 * the layers per tier. The forward commands note the plan's lines when some layers are
 * streamed. */
static int place_packed(ft_session *s, const ft_session_place_cfg *pc, ft_lora *lora,
                        const place_need *nd)
{
    uint64_t gpu_budget = (uint64_t)s->gpu_mem; /* 0: the device's total */
    if (s->gpu_reserve > 0) /* nothing left: a budget that refuses, naming what it needs */
        gpu_budget = nd->mb.budget ? nd->mb.budget : 1;
    ft_place_opts po = {pc->T, pc->rope_seq_len > 0 ? pc->rope_seq_len : pc->T, pc->n_micro,
                        gpu_budget, (uint64_t)s->host_mem, NULL, NULL, !s->cfg.train,
                        pc->n_adapters, pc->k_max, pc->r_max, pc->adapter_bytes};
    if (pc->probe && pc->probe->T == pc->T) { /* the probe sees the data's sequence lengths */
        po.pos = pc->probe->pos;
        po.seq_start = pc->probe->seq_start;
    }
    ft_place_result *pr = calloc(1, sizeof *pr);
    if (!pr) return ft_err(-ENOMEM, "out of memory");
    int rc;
    if (s->preview) { /* `ftune plan` of a pack not built yet */
        ft_place_nopack np = {s->preview->probe, s->preview->block_bytes, s->preview->disk_file,
                              s->preview->disk_same_device};
        rc = ft_place_preview(s->be, s->model, lora, &np, &po, pr);
    } else {
        rc = ft_place_packed(s->be, s->model, lora, s->pack, &po, !pc->plan_only, s->ex, pr);
    }
    if (!rc && !pc->plan_only) s->has_ex = 1;
    if (s->cfg.train) {
        note_planned(s, pc, pr, rc);
    } else if (!rc && pr->plan.n_tier[FT_TIER_GPU] < s->model->cfg.num_hidden_layers) {
        for (const char *line = pr->text; *line;) { /* some layers are streamed: say where */
            const char *nl = strchr(line, '\n');
            note(s, FT_SESSION_PLAN, "%.*s", nl ? (int)(nl - line) : (int)strlen(line), line);
            line = nl ? nl + 1 : line + strlen(line);
        }
    }
    s->n_micro = pr->plan.micro_batches;
    s->n_adapters = pr->n_adapters;
    if (!rc)
        for (int t = 0; t < 3; t++) s->base_layers[t] = pr->plan.n_tier[t];
    s->plan_step_s = rc ? 0 : pr->plan.t_step;
    free(pr);
    return rc;
}

/* 1 if the place cfg asks for an executor of several adapters per pass. */
static int multi(const ft_session_place_cfg *pc)
{
    return pc->n_adapters > 0 || pc->k_max > 0;
}

/* Bytes of the executor of K adapters (every layer resident), or of lora's (one adapter). */
static size_t exec_bytes(const ft_session *s, const ft_session_place_cfg *pc, const ft_lora *lora,
                         int64_t K)
{
    const int64_t nm = pc->n_micro > 0 ? pc->n_micro : 1;
    if (!multi(pc)) return ft_exec_bytes(s->be, s->model, lora, pc->T, nm);
    return ft_exec_bytes_multi(s->be, s->model, K, pc->r_max, pc->T, nm) +
           (size_t)(K - 1) * pc->adapter_bytes;
}

/* Adapters per pass without a planner (the host, a resident base on a device): pc->n_adapters,
 * or the most up to k_max whose executor (exec_bytes) fits `budget` bytes (at least 1). */
static int64_t fit_adapters(const ft_session *s, const ft_session_place_cfg *pc,
                            const ft_lora *lora, uint64_t budget)
{
    if (pc->n_adapters > 0) return pc->n_adapters;
    int64_t K = 1;
    while (K < pc->k_max && exec_bytes(s, pc, lora, K + 1) <= budget) K++;
    return K;
}

/* The executor over every layer: of lora, or (multi) of s->n_adapters adapters per pass;
 * place: the base's weights placed on the backend (none from a pack). */
static int init_exec(ft_session *s, const ft_session_place_cfg *pc, ft_lora *lora, int64_t rope,
                     int place)
{
    if (multi(pc))
        FT_TRY(ft_exec_init_multi(s->ex, s->be, s->model, s->n_adapters, pc->r_max, pc->T,
                                  s->n_micro, rope, place, 0, 0));
    else if (place)
        FT_TRY(ft_exec_init(s->ex, s->be, s->model, lora, pc->T, s->n_micro, rope));
    else
        FT_TRY(ft_exec_init_ex(s->ex, s->be, s->model, lora, pc->T, s->n_micro, rope, 0));
    s->has_ex = 1;
    return 0;
}

/* A resident base on a device for training: refused up front, naming the smallest budget
 * that would work, rather than failing mid-run; then every layer's activations kept (no
 * recompute in the backward) when they fit too, the spare kept for cuBLAS and
 * the CUDA context's growth. */
static int place_resident_train(ft_session *s, const ft_session_place_cfg *pc, ft_lora *lora,
                                const place_need *nd, int64_t rope)
{
    const ft_mem_budget *mb = &nd->mb;
    if (nd->need > mb->avail) {
        size_t wb = ft_exec_weight_bytes(s->be, s->model);
        return ft_err(FT_E_RANGE, "the run needs at least %.2f GiB of GPU memory (%.2f GiB in use "
                      "by the CUDA context and the adapter, %.2f GiB of base weights, "
                      "%.2f GiB of activation checkpoints and workspace, 1 GiB spare) but %s "
                      "allows %.2f GiB: use --gpu-mem %.0fG or more, or a smaller --batch-size, "
                      "--seq-len or --grad-accum",
                      gib((double)(mb->used + nd->need)), gib((double)mb->used), gib((double)wb),
                      gib((double)(nd->exec - wb)),
                      s->gpu_mem > 0 ? "--gpu-mem" : "the GPU's free memory",
                      gib((double)(s->gpu_mem > 0 ? mb->budget : mb->total)),
                      ceil(gib((double)(mb->used + nd->need))));
    }
    FT_TRY(init_exec(s, pc, lora, rope, 1));
    int rc = ft_exec_keep_activations(s->ex, mb->avail - nd->need);
    return rc < 0 ? rc : 0;
}

/* The executor for the settled base: the offload planner's for a packed base on a device;
 * else one over every layer (the pack read per visit, or held in memory, on the host); a plan
 * only says which. */
static int make_exec(ft_session *s, const ft_session_place_cfg *pc, ft_lora *lora,
                     const place_need *nd)
{
    const int host = s->be->ops->host_memory;
    const int64_t rope = pc->rope_seq_len > 0 ? pc->rope_seq_len : pc->T;
    if ((s->pack || s->preview) && !host) return place_packed(s, pc, lora, nd);
    s->n_micro = pc->n_micro > 0 ? pc->n_micro : 1;
    s->n_adapters = 1;
    if (multi(pc)) {
        uint64_t avail = ft_place_mem_available(), four = (uint64_t)4 << 30;
        uint64_t budget = host ? (s->host_mem > 0 ? (uint64_t)s->host_mem
                                                  : avail > four ? avail - four : 0)
                               : nd->mb.avail > FT_EXEC_SPARE_BYTES ? nd->mb.avail - FT_EXEC_SPARE_BYTES
                                                                    : 0;
        s->n_adapters = fit_adapters(s, pc, lora, budget);
        if (pc->plan_only || pc->k_max > 0)
            note(s, FT_SESSION_PLAN, "plan: %lld adapter%s per pass (%.1f MiB of executor and LoRA state each, within %.1f GiB%s)",
                 (long long)s->n_adapters, s->n_adapters == 1 ? "" : "s",
                 (exec_bytes(s, pc, lora, 2) - exec_bytes(s, pc, lora, 1)) / 1048576.0,
                 budget / 1073741824.0,
                 pc->n_adapters > 0 ? ", as asked" : host ? " of host memory" : " of device memory");
    }
    if (pc->plan_only) {
        note(s, FT_SESSION_PLAN, "plan: backend %s, base %s: every layer %s; %lld micro-batch%s of %lld tokens per step",
             s->be->ops->name, s->quant == FT_PACK_QUANT_NF4 ? "nf4" : "bf16",
             host ? (s->pack || s->preview ? "streamed from the pack file per visit" : "in host memory")
                  : "in device memory",
             (long long)s->n_micro, s->n_micro == 1 ? "" : "es", (long long)pc->T);
        return 0;
    }
    if (s->pack) { /* the host: every weight read from the pack (layers per visit, globals once) */
        FT_TRY(init_exec(s, pc, lora, rope, 0));
        return ft_exec_use_pack_ex(s->ex, s->pack, s->pack_in_memory);
    }
    if (!host && s->cfg.train) return place_resident_train(s, pc, lora, nd, rope);
    return init_exec(s, pc, lora, rope, 1);
}

int ft_session_place(ft_session *s, const ft_session_place_cfg *pc)
{
    if (s->has_ex) ft_exec_free(s->ex);
    s->has_ex = 0;
    s->n_adapters = 1;
    /* the executor's storage, kept until ft_session_close (the constructors fill it) */
    if (!s->ex && !(s->ex = calloc(1, sizeof *s->ex))) return ft_err(-ENOMEM, "out of memory");
    ft_lora *lora = pc->lora ? pc->lora : s->has_lora ? &s->lora : NULL;
    const int host = s->be->ops->host_memory;
    /* the rule: with every layer resident a run needs the executor (and on a device the
     * base's copy) plus FT_EXEC_SPARE_BYTES, within what the budget leaves */
    place_need nd;
    memset(&nd, 0, sizeof nd);
    if (!host)
        FT_TRY(ft_backend_mem_budget(s->be, s->gpu_mem,
                                     s->gpu_reserve > 0 ? (size_t)s->gpu_reserve : 0, &nd.mb));
    nd.exec = exec_bytes(s, pc, lora, pc->n_adapters > 0 ? pc->n_adapters : 1);
    nd.need = nd.exec + FT_EXEC_SPARE_BYTES;
    FT_TRY(choose_quant(s, &nd));
    if (pc->hook) FT_TRY(pc->hook(pc->hook_user, s, FT_SESSION_QUANT_CHOSEN));
    /* the base comes from a pack: NF4 (QLoRA), a pack-only folder, or a bf16 base that a
     * device cannot hold whole, streamed by the offload executor as a QLoRA base is */
    int packed = s->quant == FT_PACK_QUANT_NF4 || s->model->pack_only[0];
    if (!packed && !host && ft_model_deferred(s->model) && nd.need > nd.mb.avail) {
        packed = 1;
        note_streamed(s, &nd);
    }
    FT_TRY(settle_base(s, pc, packed));
    if (pc->hook) FT_TRY(pc->hook(pc->hook_user, s, FT_SESSION_BASE_READY));
    /* from here the base is the pack's: the host copy (a GGUF file's dequantized weights, or
     * those a correction read) is freed, and the executor reads every weight from the pack
     * (offload/tiers.c ft_exec_globals_from_pack) */
    if (s->pack && !s->model->pack_only[0])
        FT_TRY(ft_pack_model_use(s->model, ft_pack_path(s->pack)));
    return make_exec(s, pc, lora, &nd);
}

int ft_session_plan(ft_session *s, int64_t T)
{
    ft_session_place_cfg pc;
    memset(&pc, 0, sizeof pc);
    pc.T = T;
    pc.n_micro = 1;
    pc.rope_seq_len = T;
    return ft_session_place(s, &pc);
}

/* `ftune plan` (plan_only) of a base whose pack is not in the cache (or not usable there): the
 * pack is not built; s->preview gets the sizes it will have and, for a device backend's probe,
 * a probe pack of layer 0's block (offload/pack.h ft_pack_preview_make; nothing stays in the
 * cache folder). Noted as a plan line: the size, where it goes, the build time estimate. */
static int preview_pack(ft_session *s, const ft_pack_settings *ps, const ft_pack_ensure_info *pi)
{
    if (pi->action == FT_PACK_REBUILT)
        note(s, FT_SESSION_WARN, "the cached pack is not usable (`ftune train` rebuilds it): %s",
             pi->reason);
    s->preview = calloc(1, sizeof *s->preview);
    if (!s->preview) return ft_err(-ENOMEM, "out of memory");
    int probe = !s->be->ops->host_memory; /* the CPU backend's plan measures nothing */
    FT_TRY(ft_pack_preview_make(s->model->path, s->model, pi->path, ps, probe, s->preview));
    const ft_pack_preview *pv = s->preview;
    char est[256] = "", t[32];
    double e = pv->build_estimate_s;
    if (e >= 600) snprintf(t, sizeof t, "%.0f min", ceil(e / 60));
    else snprintf(t, sizeof t, e >= 10 ? "%.0f s" : "%.1f s", e);
    if (e > 0)
        snprintf(est, sizeof est, "; building it takes about %s (layer 0's block took %.3f s here; "
                 "the final fsync not counted)", t, pv->probe_seconds);
    note(s, FT_SESSION_PLAN, "plan: the %s pack is not built yet: `ftune train` first writes "
         "%llu bytes (%.2f GB: %lld layer blocks of up to %llu bytes, embeddings and head %llu "
         "bytes) to %s%s", ft_pack_quant_name(pv->quant), (unsigned long long)pv->file_bytes,
         pv->file_bytes / 1e9, (long long)pv->n_layers, (unsigned long long)pv->max_layer_bytes,
         (unsigned long long)pv->block_bytes[pv->n_layers], pv->path, est);
    return 0;
}

/* ---- the adapter, closing -------------------------------------------------------------- */

int ft_session_set_adapter(ft_session *s, const char *adapter_dir, int64_t T)
{
    if (adapter_dir && s->has_lora && s->has_ex && s->ex->T_max >= T) {
        /* an adapter of the same shape replaces the parameters in place: the executor (and
         * the base it placed, probed and uploaded) stays */
        ft_lora_cfg lc;
        FT_TRY(ft_peft_read_config(adapter_dir, &lc));
        if (lc.r == s->lora.cfg.r && lc.targets == s->lora.cfg.targets) {
            FT_TRY(ft_peft_load_weights(adapter_dir, &s->lora));
            s->lora.cfg.alpha = lc.alpha;
            s->lora.cfg.use_rslora = lc.use_rslora;
            s->lora.scale = ft_lora_scale(&lc);
            return 0;
        }
    }
    if (s->has_ex) ft_exec_free(s->ex); /* it holds the adapter */
    s->has_ex = 0;
    if (s->has_lora) ft_lora_free(&s->lora);
    s->has_lora = 0;
    if (adapter_dir) FT_TRY(load_adapter(s, adapter_dir));
    return ft_session_plan(s, T);
}

ft_lora *ft_session_swap_adapter(ft_session *s, ft_lora *l)
{
    return ft_exec_set_adapter(s->ex, l);
}

void ft_session_close(ft_session *s)
{
    if (s->has_ex) ft_exec_free(s->ex);
    free(s->ex);
    if (s->has_lora) ft_lora_free(&s->lora);
    ft_pack_close(s->pack);
    ft_pack_preview_free(s->preview);
    free(s->preview);
    ft_backend_free(s->be);
    ft_tok_free(s->tok);
    ft_model_free(s->model);
    memset(s, 0, sizeof *s);
}
