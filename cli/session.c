/* session.c - shared set-up for eval, generate and logits, training signals (see session.h). */
#include "cli/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapters/peft.h"
#include "offload/pack_model.h"
#include "offload/place.h"
#include "src/core/err.h"
#include "src/formats/hub_cache.h"
#include "src/train/correction.h"
#include "src/train/dpo.h"

int ft_session_hub_path(const char **path, char *buf, size_t n, int quiet, const char *what)
{
    if (!*path) return 0;
    int rc = ft_hub_resolve(*path, buf, n);
    if (rc < 0) {
        ft_err_prefix(rc, "--%s", what);
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    if (rc == 1 && !quiet) fprintf(stderr, "ftune: %s %s: %s (Hugging Face cache)\n", what, *path, buf);
    if (rc == 1) *path = buf;
    return 0;
}

const char *ft_session_device(const char *opt)
{
    const char *env = getenv("FTUNE_DEVICE");
    return opt ? opt : env && *env ? env : "auto";
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

/* Hands the session's deferred base to its pack of quantization `quant` (enum ft_pack_quant),
 * found or built under cache_dir (NULL: the default; offload/pack.h ft_pack_ensure_loaded, as
 * `ftune train` does); says so on stderr when it was built. On an error the model is as it
 * was (ft_pack_model_use checks the pack before it drops anything). */
void ft_session_pack_wait_note(const char *path, long pid, void *user)
{
    char line[4400];
    (void)user;
    ft_pack_wait_text(line, sizeof line, path, pid);
    fprintf(stderr, "ftune: pack: %s\n", line);
}

static int base_to_pack(ft_session *s, int quant, const char *cache_dir)
{
    ft_pack_settings ps;
    ft_pack_settings_default(&ps, quant);
    ft_pack_ensure_info *pi = malloc(sizeof *pi);
    if (!pi) return ft_err(-ENOMEM, "out of memory");
    int rc = ft_pack_ensure_loaded(s->model->path, s->model, cache_dir, &ps, 0, pi, ft_session_pack_wait_note, NULL);
    if (!rc && pi->action != FT_PACK_REUSED) fprintf(stderr, "ftune: pack: built %s\n", pi->path);
    if (!rc) rc = ft_pack_model_use(s->model, pi->path);
    free(pi);
    return rc;
}

int ft_session_open_nf4(ft_session *s, const char *model, const char *adapter_dir, int64_t T,
                        const char *device, int threads, const char *cache_dir, int *qcorr)
{
    memset(s, 0, sizeof *s);
    if (qcorr) *qcorr = 0;
    FT_TRY(ft_pack_model_load_deferred(&s->model, model));
    FT_TRY(ft_backend_init(&s->be, ft_session_device(device), threads));
    if (!s->model->pack_only[0]) {
        FT_TRY(base_to_pack(s, FT_PACK_QUANT_NF4, cache_dir));
    } else if (pack_is_bf16(s->model)) {
        return ft_err(FT_E_INVALID, "%s holds only the bf16 pack %s: --quant nf4 cannot be served",
                      model, s->model->pack_only);
    }
    if (adapter_dir) {
        FT_TRY(load_adapter(s, adapter_dir));
        char home[4200];
        if (qcorr_home(adapter_dir, home, sizeof home)) {
            FT_TRY(ft_qcorr_load(&s->lora, home));
            fprintf(stderr, "ftune: the NF4 base with its quantization correction %s/" FT_QCORR_DIR
                    " (the adapter was trained on it)\n", home);
            if (qcorr) *qcorr = 1;
        }
    }
    return T > 0 ? ft_session_plan(s, T) : 0;
}

/* The session of the unquantized base, without an executor: the model, backend and (if
 * adapter_dir) PEFT adapter (its shapes come from the model's config, so it loads before the
 * weights). On a host backend the weights are read at once; on a device the model stays
 * deferred (bf16_deferred) until ft_session_plan knows the tokens per forward and can tell
 * whether every layer fits. A pack-only folder is its pack either way. */
static int open_bf16(ft_session *s, const char *model, const char *adapter_dir, const char *device,
                     int threads, const char *cache_dir)
{
    memset(s, 0, sizeof *s);
    FT_TRY(ft_pack_model_load_deferred(&s->model, model));
    FT_TRY(ft_backend_init(&s->be, ft_session_device(device), threads));
    if (s->be->ops->host_memory || s->model->pack_only[0]) FT_TRY(ft_model_load_weights(s->model));
    else s->bf16_deferred = 1;
    s->cache_dir = cache_dir;
    if (adapter_dir) FT_TRY(load_adapter(s, adapter_dir));
    return 0;
}

int ft_session_open_quant(ft_session *s, const char *model, const char *adapter,
                          const char *device, int threads, const char *quant,
                          const char *cache_dir, int64_t gpu_mem, int64_t host_mem, int *qcorr)
{
    int nf4 = quant && !strcmp(quant, "nf4");
    if (qcorr) *qcorr = 0;
    int rc = nf4 ? ft_session_open_nf4(s, model, adapter, 0, device, threads, cache_dir, qcorr)
                 : open_bf16(s, model, adapter, device, threads, cache_dir);
    s->gpu_mem = gpu_mem;
    s->host_mem = host_mem;
    if (!rc && quant && !nf4 && s->model->pack_only[0] && !pack_is_bf16(s->model))
        rc = ft_err(FT_E_INVALID, "%s holds only the NF4 pack %s: --quant bf16 cannot be served "
                    "(use --quant nf4, or drop --quant)", model, s->model->pack_only);
    return rc;
}

int ft_session_bad_quant(const char *quant)
{
    if (!quant || !strcmp(quant, "bf16") || !strcmp(quant, "nf4")) return 0;
    fprintf(stderr, "ftune: --quant: unknown base quantization '%s' (bf16, nf4)\n", quant);
    return 1;
}

int ft_session_set_adapter(ft_session *s, const char *adapter_dir, int64_t T)
{
    if (adapter_dir && s->has_lora && s->has_ex && s->ex.T_max >= T) {
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
    if (s->has_ex) ft_exec_free(&s->ex); /* it holds the adapter */
    s->has_ex = 0;
    if (s->has_lora) ft_lora_free(&s->lora);
    s->has_lora = 0;
    if (adapter_dir) FT_TRY(load_adapter(s, adapter_dir));
    return ft_session_plan(s, T);
}

/* The device memory budget of the base and executor: --gpu-mem (else the device's total)
 * less gpu_reserve, the caller's own later allocations (kernels.h ft_backend_mem_budget). */
static int device_budget(ft_session *s, ft_mem_budget *b)
{
    return ft_backend_mem_budget(s->be, s->gpu_mem, s->gpu_reserve > 0 ? (size_t)s->gpu_reserve : 0, b);
}

/* A deferred bf16 base on a device (bf16_deferred), for forwards of T tokens: with every
 * layer resident the executor needs ft_exec_bytes + FT_EXEC_SPARE_BYTES (the trainer's
 * resident_need); if what device_budget leaves beyond the memory in use holds that, the
 * weights are read; otherwise the base is handed to its bf16 pack (base_to_pack, as `ftune
 * train` streams such a base) and placed by the offload planner. Counts one micro-batch (training counts its --grad-accum
 * ones). Clears bf16_deferred once the base has its weights or its pack. */
static int resolve_bf16(ft_session *s, int64_t T)
{
    ft_mem_budget mb;
    FT_TRY(device_budget(s, &mb));
    const size_t r = s->gpu_reserve > 0 ? (size_t)s->gpu_reserve : 0;
    size_t need = ft_exec_bytes(s->be, s->model, s->has_lora ? &s->lora : NULL, T, 1) +
                  FT_EXEC_SPARE_BYTES;
    if (need <= mb.avail) {
        FT_TRY(ft_model_load_weights(s->model));
        s->bf16_deferred = 0;
        return 0;
    }
    char kept[80] = "";
    if (r) snprintf(kept, sizeof kept, ", %.3f GiB kept for generation's KV cache and buffers",
                    r / 1073741824.0);
    fprintf(stderr, "ftune: the bf16 base run needs %.3f GiB of GPU memory with every layer "
            "resident, %s allows %.3f GiB (%.3f GiB in use%s): it is streamed from its bf16 "
            "pack\n", need / 1073741824.0, s->gpu_mem > 0 ? "--gpu-mem" : "the GPU",
            mb.avail / 1073741824.0, mb.used / 1073741824.0, kept);
    /* on an error the model is still deferred and so is the session: a later ft_session_plan
     * decides again instead of building an executor over a base without weights */
    FT_TRY(base_to_pack(s, FT_PACK_QUANT_BF16, s->cache_dir));
    s->bf16_deferred = 0;
    return 0;
}

int ft_session_plan(ft_session *s, int64_t T)
{
    if (s->has_ex) ft_exec_free(&s->ex);
    s->has_ex = 0;
    if (s->bf16_deferred) FT_TRY(resolve_bf16(s, T));
    if (!s->model->pack_only[0]) {
        FT_TRY(ft_exec_init(&s->ex, s->be, s->model, s->has_lora ? &s->lora : NULL, T, 1, T));
        s->has_ex = 1;
        return 0;
    }
    /* a pack-only model: every weight comes from its pack (layers per visit, globals at setup) */
    if (!s->pack) FT_TRY(ft_pack_open(&s->pack, s->model->pack_only, 0));
    ft_lora *lora = s->has_lora ? &s->lora : NULL;
    if (s->be->ops->host_memory) {
        FT_TRY(ft_exec_init_ex(&s->ex, s->be, s->model, lora, T, 1, T, 0));
        s->has_ex = 1;
        return ft_exec_use_pack_ex(&s->ex, s->pack, s->pack_in_memory);
    }
    /* on a device, placed within the budgets as a training run is (offload/place.h) */
    uint64_t gpu_budget = (uint64_t)s->gpu_mem; /* 0: the device's total */
    if (s->gpu_reserve > 0) {
        ft_mem_budget mb;
        FT_TRY(device_budget(s, &mb));
        gpu_budget = mb.budget ? mb.budget : 1; /* nothing left: a budget that refuses, naming what it needs */
    }
    ft_place_opts po = {T, T, 1, gpu_budget, (uint64_t)s->host_mem, NULL, NULL, 1};
    ft_place_result *pr = calloc(1, sizeof *pr);
    if (!pr) return ft_err(-ENOMEM, "out of memory");
    int rc = ft_place_packed(s->be, s->model, lora, s->pack, &po, 1, &s->ex, pr);
    if (!rc && pr->plan.n_tier[FT_TIER_GPU] < s->model->cfg.num_hidden_layers) {
        /* some layers are streamed: say where they are, as training does */
        char *line = pr->text, *nl;
        while (line && *line) {
            nl = strchr(line, '\n');
            fprintf(stderr, "ftune: %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
            line = nl ? nl + 1 : NULL;
        }
    }
    free(pr);
    if (!rc) s->has_ex = 1;
    return rc;
}

void ft_session_close(ft_session *s)
{
    if (s->has_ex) ft_exec_free(&s->ex);
    if (s->has_lora) ft_lora_free(&s->lora);
    ft_pack_close(s->pack);
    ft_backend_free(s->be);
    ft_model_free(s->model);
    memset(s, 0, sizeof *s);
}

/* ---- training signals ------------------------------------------------------------------ */

static volatile sig_atomic_t g_stop;
static struct sigaction g_old_int, g_old_term;
static int g_installed;

/* Async-signal-safe: only write(2), _exit(2) and the flag. */
static void on_stop_signal(int sig)
{
    static const char first[] =
        "\nftune: stop requested: finishing the current step, then saving a checkpoint "
        "(signal again to quit at once)\n";
    static const char second[] = "\nftune: second stop signal: exiting now; the last complete "
        "checkpoint is intact\n";
    if (g_stop) {
        ssize_t w = write(2, second, sizeof second - 1);
        (void)w;
        _exit(128 + sig);
    }
    g_stop = sig;
    ssize_t w = write(2, first, sizeof first - 1);
    (void)w;
}

volatile sig_atomic_t *ft_session_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    g_stop = 0;
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
    g_installed = 1;
    return &g_stop;
}

void ft_session_signals_restore(void)
{
    if (!g_installed) return;
    sigaction(SIGINT, &g_old_int, NULL);
    sigaction(SIGTERM, &g_old_term, NULL);
    g_installed = 0;
}

int ft_opt_dpo_loss(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_dpo_loss_parse(v);
    if (k < 0) {
        snprintf(err, n, "unknown DPO loss '%s' (sigmoid, hinge, ipo, robust, orpo, simpo)", v);
        return -1;
    }
    *(int *)dst = k;
    return 0;
}
