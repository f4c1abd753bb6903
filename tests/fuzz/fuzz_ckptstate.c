/* fuzz_ckptstate.c - libFuzzer target: a checkpoint's trainer_state.json and
 * optimizer.safetensors (src/train/checkpoint.c ft_ckpt_load), as `ftune train --resume`
 * reads them (src/train/adapter.c resume_from).
 *
 * Input: trainer_state.json, FUZZ_SEP, optimizer.safetensors (without a separator the whole
 * input is the state and the checkpoint has no optimizer file). The adapter files of the
 * checkpoint (adapter_config.json, adapter_model.safetensors) are fixed: written once by
 * LLVMFuzzerInitialize from a LoRA of tests/fixtures/tiny-llama (r 2 on q_proj and v_proj,
 * alpha 32: the settings of the seeds' run). The state records each file's size and FNV-1a
 * hash ("files"); before writing it, the target rewrites, in place, every such entry it finds
 * whose "bytes" number and 16-digit "fnv1a64" string have room for the real values (the size
 * right-aligned in the digits' span, padded with spaces), so that mutations of the
 * optimizer file get past the hash to the tensor checks behind it. An entry mutated out of
 * shape stays as it is (the size / hash mismatch errors). Then the state's own hash
 * ("state_fnv1a64", version 2) is recomputed by ft_ckpt_state_seal when the input size is
 * even, so that both the fields behind the hash and the hash check itself are fuzzed.
 * Per input, the two calls of a resume: ft_ckpt_load(dir, &st, &config, NULL) and, when it
 * succeeds, ft_ckpt_config_diff of the config against itself (must match) and against a fixed
 * config (must not); then ft_ckpt_load(dir, &st2, NULL, &lora), which loads the adapter and
 * the AdamW moments. Checked: the error contract of fuzz_util.h; the second call fails when
 * the first does and else gives the same state; a loaded state has consistent counters
 * (step <= total_steps, adam_step <= step, bad_run <= bad_steps, eval tracking within step)
 * and a NUL-terminated run id, finite-or-NaN losses and a finite elapsed_s >= 0; loaded
 * moments are finite with exp_avg_sq >= 0.
 * Run from the repository root (or set FTUNE_FUZZ_MODEL to the tiny-llama folder).
 * Seeds (tests/fuzz/corpus/ckptstate/): the two files of real checkpoints of tiny-llama
 * (`ftune train ... --lora-r 2 --lora-target q_proj,v_proj --max-steps 1 --save-every 1`,
 * and a 3-step run with evaluations and --save-best), damaged copies, and inputs kept from a
 * fuzzing run (fuzz_*; tests/fuzz/RESULTS.md). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/lora.h"
#include "adapters/peft.h"
#include "kernels/kernels.h"
#include "src/core/fsutil.h"
#include "src/model/model.h"
#include "src/train/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"

static ft_backend *g_be;
static ft_model *g_model;
static ft_lora g_lora;
static int64_t g_size[2];   /* adapter_model.safetensors, adapter_config.json */
static uint64_t g_hash[2];

static const char *const k_names[3] = {"adapter_model.safetensors", "adapter_config.json",
                                       FT_CKPT_OPTIM_FILE};

static void fuzz_ckpt_free(void)
{
    ft_lora_free(&g_lora);
    ft_model_free(g_model);
    ft_backend_free(g_be);
}

static void die(const char *what)
{
    fprintf(stderr, "fuzz_ckptstate: %s: %s\n(run from the repository root or set FTUNE_FUZZ_MODEL)\n",
            what, ft_errmsg());
    exit(2);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *model = getenv("FTUNE_FUZZ_MODEL");
    if (!model) model = "tests/fixtures/tiny-llama";
    if (ft_model_load(&g_model, model) < 0) die("cannot load the model");
    if (ft_backend_cpu_init(&g_be, 1) < 0) die("cpu backend");
    ft_lora_cfg lc = {2, 32.0f, 0.0f, 0, (1u << FT_Q) | (1u << FT_V), 5};
    if (ft_lora_init(&g_lora, g_model, &lc, g_be) < 0) die("ft_lora_init");
    atexit(fuzz_ckpt_free);
    if (ft_peft_save(fuzz_dir(), &g_lora, g_model, model) < 0) die("ft_peft_save");
    for (int i = 0; i < 2; i++) {
        char p[512], *txt;
        size_t len;
        fuzz_path(p, sizeof p, k_names[i]);
        if (ft_read_file(p, &txt, &len) < 0) die("reading the adapter back");
        g_size[i] = (int64_t)len;
        g_hash[i] = ft_ckpt_hash(FT_CKPT_HASH_INIT, txt, len);
        free(txt);
    }
    return 0;
}

/* The first occurrence of key (a quoted name) in [p, end) followed, after blanks, by ':' and
 * blanks: the start of its value, or NULL. */
static char *value_of(char *p, char *end, const char *key)
{
    size_t k = strlen(key);
    while (p && p < end) {
        char *q = memmem(p, (size_t)(end - p), key, k);
        if (!q) return NULL;
        char *v = q + k;
        while (v < end && (*v == ' ' || *v == '\n' || *v == '\t' || *v == '\r')) v++;
        if (v < end && *v == ':') {
            v++;
            while (v < end && (*v == ' ' || *v == '\n' || *v == '\t' || *v == '\r')) v++;
            return v;
        }
        p = q + 1;
    }
    return NULL;
}

/* Rewrites the "bytes" and "fnv1a64" of file `name` in the state text s (n bytes), within
 * the 200 bytes after the name, where they have the room (see the file comment). */
static void patch_entry(char *s, size_t n, const char *name, int64_t size, uint64_t hash)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\"", name);
    char *end = s + n, *at = memmem(s, n, key, strlen(key));
    if (!at) return;
    char *lim = end - at > 200 ? at + 200 : end;
    char *b = value_of(at + 1, lim, "\"bytes\"");
    if (b) {
        char *e = b;
        while (e < lim && *e >= '0' && *e <= '9') e++;
        char num[32];
        int k = snprintf(num, sizeof num, "%lld", (long long)size);
        if (e > b && k <= e - b) {
            memset(b, ' ', (size_t)(e - b - k));
            memcpy(e - k, num, (size_t)k);
        }
    }
    char *h = value_of(at + 1, lim, "\"fnv1a64\"");
    if (h && lim - h >= 18 && h[0] == '"' && h[17] == '"') {
        char hex[20];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
        memcpy(h + 1, hex, 16);
    }
}

static void check_state(const ft_ckpt_state *st)
{
    if (!memchr(st->run_id, 0, sizeof st->run_id) || !memchr(st->eval_set, 0, sizeof st->eval_set) ||
        st->step < 0 || st->adam_step > st->step || st->step > st->total_steps ||
        st->bad_run > st->bad_steps || st->best_eval_step > st->step ||
        st->best_saved_step > st->step || st->evals_no_improve > st->n_evals || st->epoch < 0 ||
        st->cursor < 0 || !(st->elapsed_s >= 0) || isinf(st->elapsed_s) ||
        isinf(st->initial_eval_loss) || isinf(st->last_eval_loss) || isinf(st->last_loss) ||
        isinf(st->best_eval_loss)) {
        fprintf(stderr, "fuzz_ckptstate: inconsistent state accepted\n");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *js, *opt;
    size_t jn, on;
    int has_opt = fuzz_split(data, size, &js, &jn, &opt, &on);
    char *s = malloc(jn ? jn : 1);
    if (!s) abort();
    memcpy(s, js, jn);
    for (int i = 0; i < 2; i++) patch_entry(s, jn, k_names[i], g_size[i], g_hash[i]);
    if (has_opt) {
        patch_entry(s, jn, k_names[2], (int64_t)on, ft_ckpt_hash(FT_CKPT_HASH_INIT, opt, on));
        fuzz_write(FT_CKPT_OPTIM_FILE, opt, on);
    } else {
        fuzz_unlink(FT_CKPT_OPTIM_FILE);
    }
    /* inputs of an even size re-sealed (the state's own hash recomputed, so that mutations reach the
     * fields behind it), odd ones as they are (the hash check itself) */
    if (jn && !(size & 1)) ft_ckpt_state_seal(s, jn);
    fuzz_write(FT_CKPT_STATE_FILE, s, jn);
    free(s);

    ft_ckpt_state st, st2;
    char *cfg = NULL;
    int rc, rc2;
    FUZZ_CALL(rc, ft_ckpt_load(fuzz_dir(), &st, &cfg, NULL));
    if (rc == 0) {
        check_state(&st);
        if (!cfg) abort();
        FUZZ_CALL(rc2, ft_ckpt_config_diff(cfg, cfg));
        if (rc2 < 0) {
            fprintf(stderr, "fuzz_ckptstate: config differs from itself: %s\n", ft_errmsg());
            abort();
        }
        FUZZ_CALL(rc2, ft_ckpt_config_diff(cfg, "{\"lora_r\":2,\"seed\":-1,\"info\":{}}"));
        (void)rc2;
    } else if (cfg) {
        abort(); /* no config handed out on failure */
    }
    free(cfg);
    FUZZ_CALL(rc2, ft_ckpt_load(fuzz_dir(), &st2, NULL, &g_lora));
    if (rc < 0 && rc2 == 0) {
        fprintf(stderr, "fuzz_ckptstate: loaded with the adapter after failing without\n");
        abort();
    }
    if (rc2 == 0) {
        if (memcmp(&st, &st2, sizeof st)) {
            fprintf(stderr, "fuzz_ckptstate: the two loads gave different states\n");
            abort();
        }
        const ft_backend_ops *o = g_be->ops;
        size_t bytes = (size_t)g_lora.n_params * sizeof(float);
        const float *mom[2] = {g_lora.m, g_lora.v};
        for (int k = 0; k < 2; k++) {
            if (o->copy(g_be, g_lora.host, mom[k], bytes) < 0) abort();
            for (int64_t i = 0; i < g_lora.n_params; i++)
                if (!isfinite(g_lora.host[i]) || (k == 1 && g_lora.host[i] < 0)) {
                    fprintf(stderr, "fuzz_ckptstate: %s[%lld] = %g loaded\n",
                            k ? "exp_avg_sq" : "exp_avg", (long long)i, g_lora.host[i]);
                    abort();
                }
        }
    }
    return 0;
}
