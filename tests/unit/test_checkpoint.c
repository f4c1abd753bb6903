/* test_checkpoint.c - training checkpoints (src/train/checkpoint.c) and the resumed
 * metrics file (src/train/metrics.c): bit-exact round trip of parameters, AdamW moments
 * and state; damaged, truncated and partial checkpoints detected; keep-K rotation and the
 * removal of stale checkpoints; injected write failures (full disk) at many offsets leave
 * the previous checkpoint loadable; run-config comparison; the best-eval / early-stopping
 * state (and its absence in older checkpoints); the OUT/best adapter folder swap. */
#include "tests/unit/harness.h"

#include <dirent.h>
#include <sys/stat.h>

#include "src/model/lora.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "src/train/checkpoint.h"
#include "src/train/metrics.h"
#include "tests/unit/model_fixture.h"

typedef model_fix fix;

/* 1 thread, no adapter: the tests build theirs from f->lc (r 4, alpha 8, q and v) */
static int setup(void **state)
{
    if (model_fix_setup(state, 1, NULL, 0, 0.0f) < 0) return -1;
    ((fix *)*state)->lc = (ft_lora_cfg){4, 8.0f, 0.0f, 0, (1u << FT_Q) | (1u << FT_V), 7};
    return 0;
}

/* Fills params, m, v with seeded values, including bit patterns a decimal round trip
 * would lose (-0, a denormal, a NaN payload in v is not used: moments are finite). */
static void fill(ft_lora *l, uint64_t seed)
{
    ft_rng rng;
    ft_rng_seed(&rng, seed);
    size_t bytes = (size_t)l->n_params * sizeof(float);
    float *arr[3] = {l->params, l->m, l->v};
    for (int k = 0; k < 3; k++) {
        for (int64_t i = 0; i < l->n_params; i++)
            l->host[i] = (ft_rng_uniform(&rng) - 0.5f) * (k == 2 ? 1e-6f : 0.3f);
        l->host[0] = -0.0f;
        l->host[1] = 1e-40f; /* denormal */
        if (k == 2) for (int64_t i = 0; i < l->n_params; i++) l->host[i] = fabsf(l->host[i]);
        l->be->ops->copy(l->be, arr[k], l->host, bytes);
    }
}

static ft_ckpt_state make_state(int64_t step, const char *run)
{
    ft_ckpt_state st;
    memset(&st, 0, sizeof st);
    st.step = step;
    st.adam_step = step > 0 ? step - 1 : 0;
    st.total_steps = 100;
    st.warmup_steps = 3;
    st.epoch = 1;
    st.cursor = 17;
    st.tokens = 12345 + step;
    st.positions = 99999;
    st.bad_steps = 1;
    st.bad_run = 0;
    st.initial_eval_loss = 10.354685048133362;
    st.last_eval_loss = NAN;
    st.last_loss = 0.1 + 0.2; /* not exactly representable in decimal at 15 digits */
    st.elapsed_s = 3.25;
    st.best_eval_loss = step > 0 ? 10.1 + 1e-13 : NAN; /* 17 digits to read back */
    st.best_eval_step = step > 0 ? step - 1 : 0;
    st.best_saved_step = st.best_eval_step;
    st.n_evals = step;
    st.evals_no_improve = step > 0 ? 1 : 0;
    snprintf(st.run_id, sizeof st.run_id, "%s", run);
    return st;
}

static const char *CFG = "{\"seq_len\":64,\"lr\":0.01,\"seed\":\"42\",\"info\":{\"threads\":2}}";

static int exists(const char *dir, const char *name)
{
    char p[8400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Names of out's entries joined by ' ' in sorted order (for rotation checks). */
static void listing(const char *dir, char *out, size_t n)
{
    struct dirent **nl;
    int k = scandir(dir, &nl, NULL, alphasort);
    out[0] = 0;
    for (int i = 0; i < k; i++) {
        if (strcmp(nl[i]->d_name, ".") && strcmp(nl[i]->d_name, "..")) /* hidden ones too */
            snprintf(out + strlen(out), n - strlen(out), "%s%s", *out ? " " : "", nl[i]->d_name);
        free(nl[i]);
    }
    free(nl);
}

static void save_ok(fix *f, ft_lora *l, const char *dir, int64_t step, const char *run)
{
    ft_ckpt_state st = make_state(step, run);
    char path[4200];
    int rc = ft_ckpt_save(dir, &st, CFG, l, f->m, TINY, path, sizeof path);
    if (rc) fprintf(stderr, "save: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
}

/* Compares l's params, m, v bit for bit with reference host copies. */
static int64_t count_diff(ft_lora *l, const float *p, const float *m, const float *v)
{
    size_t bytes = (size_t)l->n_params * sizeof(float);
    const float *ref[3] = {p, m, v};
    float *arr[3] = {l->params, l->m, l->v};
    int64_t bad = 0;
    for (int k = 0; k < 3; k++) {
        l->be->ops->copy(l->be, l->host, arr[k], bytes);
        for (int64_t i = 0; i < l->n_params; i++)
            bad += memcmp(&l->host[i], &ref[k][i], sizeof(float)) != 0;
    }
    return bad;
}

typedef struct snap { float *p, *m, *v; } snap;

static snap take(ft_lora *l)
{
    size_t bytes = (size_t)l->n_params * sizeof(float);
    snap s = {malloc(bytes), malloc(bytes), malloc(bytes)};
    l->be->ops->copy(l->be, s.p, l->params, bytes);
    l->be->ops->copy(l->be, s.m, l->m, bytes);
    l->be->ops->copy(l->be, s.v, l->v, bytes);
    return s;
}

static void snap_free(snap *s)
{
    free(s->p);
    free(s->m);
    free(s->v);
}

static void test_round_trip(void **state)
{
    fix *f = *state;
    ft_lora a, b;
    assert_int_equal(ft_lora_init(&a, f->m, &f->lc, f->be), 0);
    assert_int_equal(ft_lora_init(&b, f->m, &f->lc, f->be), 0);
    fill(&a, 1);
    fill(&b, 2);
    snap s = take(&a);
    char *dir = t_tmpdir();
    save_ok(f, &a, dir, 7, "runA");
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoint-7", dir);
    ft_ckpt_state got, want = make_state(7, "runA");
    char *cfg = NULL;
    int rc = ft_ckpt_load(ck, &got, &cfg, &b);
    if (rc) fprintf(stderr, "load: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    int64_t diff = count_diff(&b, s.p, s.m, s.v);
    printf("round trip: %lld params x 3 arrays, %lld differing bit patterns\n",
           (long long)a.n_params, (long long)diff);
    assert_int_equal(diff, 0);
    assert_int_equal(got.step, 7);
    assert_int_equal(got.adam_step, want.adam_step);
    assert_int_equal(got.total_steps, 100);
    assert_int_equal(got.warmup_steps, 3);
    assert_int_equal(got.epoch, 1);
    assert_int_equal(got.cursor, 17);
    assert_int_equal(got.tokens, want.tokens);
    assert_int_equal(got.positions, 99999);
    assert_int_equal(got.bad_steps, 1);
    assert_true(got.initial_eval_loss == want.initial_eval_loss);
    assert_true(got.last_loss == want.last_loss); /* exact: cJSON prints 17 digits if needed */
    assert_true(isnan(got.last_eval_loss));
    assert_true(got.best_eval_loss == want.best_eval_loss);
    assert_int_equal(got.best_eval_step, 6);
    assert_int_equal(got.best_saved_step, 6);
    assert_int_equal(got.n_evals, 7);
    assert_int_equal(got.evals_no_improve, 1);
    assert_string_equal(got.run_id, "runA");
    assert_int_equal(ft_ckpt_config_diff(cfg, CFG), 0);
    free(cfg);
    /* the checkpoint is a PEFT adapter folder as well */
    assert_true(exists(ck, "adapter_config.json") && exists(ck, "adapter_model.safetensors"));
    /* an adapter of another shape is refused, naming the config */
    ft_lora c;
    ft_lora_cfg lc2 = f->lc;
    lc2.r = 8;
    assert_int_equal(ft_lora_init(&c, f->m, &lc2, f->be), 0);
    assert_true(ft_ckpt_load(ck, &got, NULL, &c) < 0);
    assert_non_null(strstr(ft_errmsg(), "adapter_config.json"));
    ft_lora_free(&c);
    snap_free(&s);
    ft_lora_free(&a);
    ft_lora_free(&b);
    free(dir);
}

/* Overwrites `n` bytes at offset `off` of dir/name (or truncates to off if n < 0). */
static void damage(const char *dir, const char *name, long off, int n)
{
    char p[8400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (n < 0) {
        assert_int_equal(truncate(p, off), 0);
        return;
    }
    FILE *fp = fopen(p, "r+b");
    assert_non_null(fp);
    fseek(fp, off, SEEK_SET);
    for (int i = 0; i < n; i++) {
        int c = fgetc(fp);
        fseek(fp, off + i, SEEK_SET);
        fputc(c ^ 0x01, fp);
    }
    fclose(fp);
}

static void test_damaged_detected(void **state)
{
    fix *f = *state;
    ft_lora a;
    assert_int_equal(ft_lora_init(&a, f->m, &f->lc, f->be), 0);
    fill(&a, 3);
    char *dir = t_tmpdir();
    ft_ckpt_state st;
    char ck[4200], latest[4200];
    int64_t step;
    struct { const char *file; long off; int n; int code; const char *what; } cases[] = {
        {FT_CKPT_OPTIM_FILE, 4000, 1, FT_E_CORRUPT, "content hash"},       /* one bit in m */
        {"adapter_model.safetensors", 1000, -1, FT_E_CORRUPT, "bytes"},     /* truncated */
        {"adapter_config.json", 10, 1, FT_E_CORRUPT, "content hash"},
        {FT_CKPT_STATE_FILE, 0, 1, FT_E_INVALID, "JSON"},                   /* '{' -> 'z' */
        {FT_CKPT_STATE_FILE, 0, -1, FT_E_INVALID, "JSON"},                  /* empty */
    };
    save_ok(f, &a, dir, 5, "runA"); /* the one intact checkpoint at the end */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        save_ok(f, &a, dir, 10 + (int64_t)i, "runA");
        snprintf(ck, sizeof ck, "%s/checkpoint-%lld", dir, (long long)(10 + i));
        assert_int_equal(ft_ckpt_load(ck, &st, NULL, &a), 0);
        damage(ck, cases[i].file, cases[i].off, cases[i].n);
        int rc = ft_ckpt_load(ck, &st, NULL, &a);
        printf("damaged %s at %ld: rc %d: %s\n", cases[i].file, cases[i].off, rc, ft_errmsg());
        assert_int_equal(rc, cases[i].code);
        assert_non_null(strstr(ft_errmsg(), cases[i].file));
        assert_non_null(strstr(ft_errmsg(), cases[i].what));
    }
    /* any damage makes the folder invisible to "latest": 5 is the newest intact */
    assert_int_equal(ft_ckpt_find_latest(dir, latest, sizeof latest, &step), 1);
    assert_int_equal(step, 5);
    /* a missing state file, and a leftover temporary folder of a crashed save */
    snprintf(ck, sizeof ck, "%s/checkpoint-12/" FT_CKPT_STATE_FILE, dir);
    assert_int_equal(unlink(ck), 0);
    snprintf(ck, sizeof ck, "%s/.checkpoint-99.tmp", dir);
    assert_int_equal(mkdir(ck, 0755), 0);
    assert_int_equal(ft_ckpt_find_latest(dir, latest, sizeof latest, &step), 1);
    assert_int_equal(step, 5);
    snprintf(ck, sizeof ck, "%s/checkpoint-12", dir);
    assert_int_equal(ft_ckpt_load(ck, &st, NULL, &a), -ENOENT);
    /* a state whose counters contradict each other */
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/checkpoint-11/" FT_CKPT_STATE_FILE, dir);
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(bad, &txt, &len), 0);
    char *p = strstr(txt, "\"adam_step\":");
    assert_non_null(p);
    p = strchr(p, ':') + 1;
    while (*p == ' ' || *p == '\t') p++;
    *p = '9'; /* adam_step 9x > step 11 */
    assert_int_equal(ft_ckpt_state_seal(txt, len), 0); /* past the state's own hash */
    assert_int_equal(ft_write_file_atomic(bad, txt, len), 0);
    free(txt);
    snprintf(ck, sizeof ck, "%s/checkpoint-11", dir);
    assert_int_equal(ft_ckpt_load(ck, &st, NULL, NULL), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "inconsistent"));
    /* a directory with no checkpoint at all */
    char *empty = t_tmpdir();
    assert_int_equal(ft_ckpt_find_latest(empty, latest, sizeof latest, &step), 0);
    ft_lora_free(&a);
    free(dir);
    free(empty);
}

/* Removes the line holding `key` from dir/trainer_state.json (as an older ftune wrote it). */
static void drop_key(const char *dir, const char *key)
{
    char p[8400];
    snprintf(p, sizeof p, "%s/" FT_CKPT_STATE_FILE, dir);
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(p, &txt, &len), 0);
    char *k = strstr(txt, key);
    assert_non_null(k);
    char *b = k, *e = strchr(k, '\n');
    while (b > txt && b[-1] != '\n') b--;
    memmove(b, e + 1, strlen(e + 1) + 1);
    assert_int_equal(ft_ckpt_state_seal(txt, strlen(txt)), 0);
    assert_int_equal(ft_write_file_atomic(p, txt, strlen(txt)), 0);
    free(txt);
}

/* Flips byte off of dir/name by xor x (off < 0: counted from the end). */
static void flip(const char *dir, const char *name, long off, int x)
{
    char p[8400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *fp = fopen(p, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, off, off < 0 ? SEEK_END : SEEK_SET), 0);
    int c = fgetc(fp);
    assert_true(c != EOF);
    assert_int_equal(fseek(fp, -1, SEEK_CUR), 0);
    fputc(c ^ x, fp);
    assert_int_equal(fclose(fp), 0);
}

static long file_size(const char *dir, const char *name)
{
    char p[8400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    return (long)sb.st_size;
}

/* Issue 31 class 8: every byte of a checkpoint is covered. Each byte of trainer_state.json
 * (whitespace, key names, the recorded hashes, the state's own hash included) flipped by
 * two patterns, and bytes across each other file: ft_ckpt_verify and ft_ckpt_load refuse
 * each, naming the file, and the checkpoint verifies again once the byte is restored. */
static void test_every_byte_covered(void **state)
{
    fix *f = *state;
    ft_lora a;
    assert_int_equal(ft_lora_init(&a, f->m, &f->lc, f->be), 0);
    fill(&a, 11);
    char *dir = t_tmpdir();
    char ck[4200];
    ft_ckpt_state st;
    save_ok(f, &a, dir, 4, "runA");
    snprintf(ck, sizeof ck, "%s/checkpoint-4", dir);
    assert_int_equal(ft_ckpt_verify(ck, &st), 0);
    assert_int_equal(st.step, 4);
    static const char *const names[] = {FT_CKPT_STATE_FILE, "adapter_config.json",
                                        "adapter_model.safetensors", FT_CKPT_OPTIM_FILE};
    static const int pats[] = {0x01, 0x20};
    int64_t tried = 0;
    for (int k = 0; k < 4; k++) {
        long n = file_size(ck, names[k]);
        long stride = k < 2 ? 1 : n / 97 + 1; /* ~100 offsets over the large files */
        for (long off = 0; off < n; off += (off + stride < n || off == n - 1) ? stride : n - 1 - off) {
            for (int pi = 0; pi < 2; pi++) {
                flip(ck, names[k], off, pats[pi]);
                int rc = ft_ckpt_verify(ck, NULL);
                if (rc == 0) fprintf(stderr, "%s: flip 0x%02x at %ld not detected\n", names[k], pats[pi], off);
                assert_true(rc < 0);
                assert_non_null(strstr(ft_errmsg(), names[k]));
                if (off % 64 == 0) assert_true(ft_ckpt_load(ck, &st, NULL, &a) < 0);
                flip(ck, names[k], off, pats[pi]);
                tried++;
            }
            if (off == n - 1) break;
        }
        assert_int_equal(ft_ckpt_verify(ck, NULL), 0);
    }
    printf("%lld flipped bytes refused\n", (long long)tried);
    ft_lora_free(&a);
    free(dir);
}

/* A version-1 checkpoint (written before the state's own hash) still loads; a version-2
 * state without its hash is refused. */
static void test_version1_state(void **state)
{
    fix *f = *state;
    ft_lora a;
    assert_int_equal(ft_lora_init(&a, f->m, &f->lc, f->be), 0);
    fill(&a, 12);
    char *dir = t_tmpdir();
    char ck[4200], p[8400];
    ft_ckpt_state st;
    save_ok(f, &a, dir, 6, "runA");
    snprintf(ck, sizeof ck, "%s/checkpoint-6", dir);
    snprintf(p, sizeof p, "%s/" FT_CKPT_STATE_FILE, ck);
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(p, &txt, &len), 0);
    char *k = strstr(txt, ",\n\t\"state_fnv1a64\"");
    assert_non_null(k);
    char *e = strchr(k + 2, '\n');
    memmove(k, e, strlen(e) + 1); /* "files" is the last key again */
    assert_int_equal(ft_write_file_atomic(p, txt, strlen(txt)), 0);
    assert_int_equal(ft_ckpt_load(ck, &st, NULL, &a), FT_E_CORRUPT);
    printf("refused: %s\n", ft_errmsg());
    assert_non_null(strstr(ft_errmsg(), "state_fnv1a64"));
    char *v = strstr(txt, "\"version\":\t2");
    assert_non_null(v);
    v[strlen("\"version\":\t")] = '1';
    assert_int_equal(ft_write_file_atomic(p, txt, strlen(txt)), 0);
    int rc = ft_ckpt_load(ck, &st, NULL, &a);
    if (rc) fprintf(stderr, "load: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(st.step, 6);
    assert_int_equal(ft_ckpt_verify(ck, NULL), 0);
    free(txt);
    ft_lora_free(&a);
    free(dir);
}

/* The best-eval / early-stopping state: a checkpoint without it (older ftune) resumes with
 * none / 0; a best step after the checkpoint's step or more evals without improvement than
 * evals are refused as inconsistent. */
static void test_eval_tracking_state(void **state)
{
    fix *f = *state;
    ft_lora a;
    assert_int_equal(ft_lora_init(&a, f->m, &f->lc, f->be), 0);
    fill(&a, 5);
    char *dir = t_tmpdir();
    char ck[4200];
    ft_ckpt_state got;
    save_ok(f, &a, dir, 9, "runA");
    snprintf(ck, sizeof ck, "%s/checkpoint-9", dir);
    static const char *const keys[] = {"\"best_eval_loss\"", "\"best_eval_step\"",
                                       "\"best_saved_step\"", "\"n_evals\"", "\"evals_no_improve\""};
    for (int i = 0; i < 5; i++) drop_key(ck, keys[i]);
    int rc = ft_ckpt_load(ck, &got, NULL, &a);
    if (rc) fprintf(stderr, "load: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(got.step, 9);
    assert_true(isnan(got.best_eval_loss));
    assert_int_equal(got.best_eval_step + got.best_saved_step + got.n_evals + got.evals_no_improve, 0);
    ft_ckpt_state st = make_state(10, "runA");
    struct { int64_t best_step, no_improve; } bad[] = {{11, 1}, {9, 11}};
    for (int i = 0; i < 2; i++) {
        st.best_eval_step = bad[i].best_step;
        st.evals_no_improve = bad[i].no_improve;
        char path[4200];
        assert_int_equal(ft_ckpt_save(dir, &st, CFG, &a, f->m, TINY, path, sizeof path), 0);
        assert_int_equal(ft_ckpt_load(path, &got, NULL, NULL), FT_E_INVALID);
        printf("refused: %s\n", ft_errmsg());
        assert_non_null(strstr(ft_errmsg(), "inconsistent eval tracking"));
    }
    ft_lora_free(&a);
    free(dir);
}

/* OUT/best: written, replaced by another adapter with no leftover hidden folder, its files
 * those of a checkpoint of the same values; a crash between the renames of the fallback
 * path (OUT/best missing, OUT/.best.old present) is repaired by ft_ckpt_adapter_cleanup. */
static void test_best_adapter_folder(void **state)
{
    fix *f = *state;
    ft_lora a;
    assert_int_equal(ft_lora_init(&a, f->m, &f->lc, f->be), 0);
    char *dir = t_tmpdir();
    char best[4200], ck[4200], ls[1024], p1[8400], p2[8400];
    snprintf(best, sizeof best, "%s/" FT_CKPT_BEST_DIR, dir);
    fill(&a, 6);
    assert_int_equal(ft_ckpt_save_adapter(dir, FT_CKPT_BEST_DIR, &a, NULL, TINY, 2, 1.5), 0);
    assert_int_equal(ft_ckpt_adapter_step(dir, FT_CKPT_BEST_DIR), 2);
    fill(&a, 7);
    save_ok(f, &a, dir, 3, "runA"); /* the checkpoint of the second values */
    assert_int_equal(ft_ckpt_save_adapter(dir, FT_CKPT_BEST_DIR, &a, NULL, TINY, 3, 1.25), 0);
    assert_int_equal(ft_ckpt_adapter_step(dir, FT_CKPT_BEST_DIR), 3); /* the folder says which */
    assert_int_equal(ft_ckpt_adapter_step(dir, "nothing-here"), -1);
    listing(dir, ls, sizeof ls);
    assert_string_equal(ls, "best checkpoint-3");
    listing(best, ls, sizeof ls);
    assert_string_equal(ls, "adapter_config.json adapter_model.safetensors ftune_step.json");
    snprintf(ck, sizeof ck, "%s/checkpoint-3", dir);
    const char *names[2] = {"adapter_model.safetensors", "adapter_config.json"};
    for (int i = 0; i < 2; i++) {
        char *x, *y;
        size_t nx, ny;
        snprintf(p1, sizeof p1, "%s/%s", best, names[i]);
        snprintf(p2, sizeof p2, "%s/%s", ck, names[i]);
        assert_int_equal(ft_read_file(p1, &x, &nx), 0);
        assert_int_equal(ft_read_file(p2, &y, &ny), 0);
        assert_true(nx == ny && !memcmp(x, y, nx)); /* the replacement took */
        free(x);
        free(y);
    }
    /* the fallback path crashed after renaming best aside */
    snprintf(p1, sizeof p1, "%s/.best.old", dir);
    assert_int_equal(rename(best, p1), 0);
    snprintf(p2, sizeof p2, "%s/.best.tmp", dir);
    assert_int_equal(mkdir(p2, 0755), 0);
    ft_ckpt_adapter_cleanup(dir, FT_CKPT_BEST_DIR, 0);
    listing(dir, ls, sizeof ls);
    assert_string_equal(ls, "best checkpoint-3");
    ft_ckpt_adapter_cleanup(dir, FT_CKPT_BEST_DIR, 1); /* a fresh run's stale folder */
    listing(dir, ls, sizeof ls);
    assert_string_equal(ls, "checkpoint-3");
    ft_lora_free(&a);
    free(dir);
}

static void test_rotation(void **state)
{
    fix *f = *state;
    ft_lora a;
    assert_int_equal(ft_lora_init(&a, f->m, &f->lc, f->be), 0);
    fill(&a, 4);
    char *dir = t_tmpdir();
    char ls[1024], latest[4200];
    int64_t step;
    /* keep 2 */
    for (int64_t s = 1; s <= 5; s++) {
        save_ok(f, &a, dir, s, "runA");
        assert_true(ft_ckpt_prune(dir, s, "runA", 2) >= 0);
    }
    listing(dir, ls, sizeof ls);
    printf("keep 2 after 5 saves: %s\n", ls);
    assert_string_equal(ls, "checkpoint-4 checkpoint-5");
    assert_int_equal(ft_ckpt_find_latest(dir, latest, sizeof latest, &step), 1);
    assert_int_equal(step, 5);
    /* resumed from checkpoint-4 of the same run: saving 5 again replaces it */
    a.be->ops->zero(a.be, a.m, (size_t)a.n_params * sizeof(float));
    save_ok(f, &a, dir, 5, "runA");
    assert_int_equal(ft_ckpt_prune(dir, 5, "runA", 2), 0);
    listing(dir, ls, sizeof ls);
    assert_string_equal(ls, "checkpoint-4 checkpoint-5");
    ft_lora b;
    assert_int_equal(ft_lora_init(&b, f->m, &f->lc, f->be), 0);
    ft_ckpt_state st;
    snprintf(latest, sizeof latest, "%s/checkpoint-5", dir);
    assert_int_equal(ft_ckpt_load(latest, &st, NULL, &b), 0);
    double sq;
    b.be->ops->sumsq(b.be, &sq, b.m, b.n_params);
    assert_true(sq == 0); /* the new content, not the replaced one */
    /* a later save of an earlier step (a resume from checkpoint-2, keep 0): 4 and 5 are
     * stale, the other branch of the run */
    save_ok(f, &a, dir, 3, "runA");
    assert_int_equal(ft_ckpt_prune(dir, 3, "runA", 0), 2);
    listing(dir, ls, sizeof ls);
    assert_string_equal(ls, "checkpoint-3");
    /* a fresh run (another id) into the same folder removes the old run's checkpoints at
     * its first save, lower steps included */
    save_ok(f, &a, dir, 4, "runB");
    listing(dir, ls, sizeof ls);
    assert_string_equal(ls, "checkpoint-3 checkpoint-4");
    assert_int_equal(ft_ckpt_prune(dir, 4, "runB", 2), 1);
    listing(dir, ls, sizeof ls);
    printf("after a new run's first save: %s\n", ls);
    assert_string_equal(ls, "checkpoint-4");
    int64_t hi;
    assert_int_equal(ft_ckpt_count(dir, &hi), 1);
    assert_int_equal(hi, 4);
    /* hidden leftovers of a save or prune killed midway are removed by the next prune;
     * other hidden files are not touched */
    const char *left[] = {".checkpoint-9.tmp", ".checkpoint-2.del", ".checkpoint-4.old"};
    for (int i = 0; i < 3; i++) {
        char p[8400];
        snprintf(p, sizeof p, "%s/%s", dir, left[i]);
        assert_int_equal(mkdir(p, 0755), 0);
        snprintf(p, sizeof p, "%s/%s/optimizer.safetensors", dir, left[i]);
        FILE *fp = fopen(p, "wb");
        assert_non_null(fp);
        fclose(fp);
    }
    char keepme[8400];
    snprintf(keepme, sizeof keepme, "%s/.keep.tmp", dir);
    FILE *fk = fopen(keepme, "wb");
    assert_non_null(fk);
    fclose(fk);
    assert_int_equal(ft_ckpt_prune(dir, 4, "runB", 2), 0);
    listing(dir, ls, sizeof ls);
    assert_string_equal(ls, ".keep.tmp checkpoint-4");
    ft_lora_free(&a);
    ft_lora_free(&b);
    free(dir);
}

static void test_write_failure(void **state)
{
    fix *f = *state;
    ft_lora a, b;
    assert_int_equal(ft_lora_init(&a, f->m, &f->lc, f->be), 0);
    assert_int_equal(ft_lora_init(&b, f->m, &f->lc, f->be), 0);
    fill(&a, 5);
    snap s = take(&a);
    char *dir = t_tmpdir();
    save_ok(f, &a, dir, 1, "runA");
    fill(&a, 6); /* the state that fails to save differs from the saved one */
    int64_t opt_bytes = 8 + 256 + 2 * a.n_params * 4; /* about: header length varies */
    int64_t points[] = {0, 1, 7, 8, 100, opt_bytes / 2, opt_bytes - 300, opt_bytes + 50, opt_bytes + 600};
    char ls[1024], ck[4200];
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
        ft_ckpt_fail_writes_after(points[i]);
        ft_ckpt_state st = make_state(2, "runA");
        int rc = ft_ckpt_save(dir, &st, CFG, &a, f->m, TINY, NULL, 0);
        ft_ckpt_fail_writes_after(-1);
        const char *msg = ft_errmsg();
        printf("write fails after %lld bytes: rc %d: %s\n", (long long)points[i], rc, msg);
        assert_int_equal(rc, -ENOSPC);
        assert_non_null(strstr(msg, "No space left on device"));
        assert_non_null(strstr(msg, "checkpoint-2"));
        listing(dir, ls, sizeof ls);
        assert_string_equal(ls, "checkpoint-1"); /* no checkpoint-2, no temporary folder */
        snprintf(ck, sizeof ck, "%s/checkpoint-1", dir);
        ft_ckpt_state got;
        assert_int_equal(ft_ckpt_load(ck, &got, NULL, &b), 0);
        assert_int_equal(count_diff(&b, s.p, s.m, s.v), 0);
    }
    /* the disk has room again: the next save works */
    save_ok(f, &a, dir, 2, "runA");
    listing(dir, ls, sizeof ls);
    assert_string_equal(ls, "checkpoint-1 checkpoint-2");
    snap_free(&s);
    ft_lora_free(&a);
    ft_lora_free(&b);
    free(dir);
}

static void test_config_diff(void **state)
{
    (void)state;
    assert_int_equal(ft_ckpt_config_diff(CFG, "{\"seed\":\"42\",\"lr\":0.01,\"seq_len\":64,\"info\":{\"threads\":8}}"), 0);
    int rc = ft_ckpt_config_diff(CFG, "{\"seq_len\":128,\"lr\":0.010000000000000002,\"seed\":\"42\",\"batch_size\":2}");
    printf("diff: %s\n", ft_errmsg());
    assert_int_equal(rc, FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "seq_len: 64 -> 128"));
    assert_non_null(strstr(ft_errmsg(), "lr: 0.01 -> 0.010000000000000002")); /* one ulp counts */
    assert_non_null(strstr(ft_errmsg(), "batch_size: (absent) -> 2"));
    assert_null(strstr(ft_errmsg(), "threads"));
    assert_int_equal(ft_ckpt_config_diff("{", CFG), FT_E_INVALID);
}

static void test_names_and_hash(void **state)
{
    (void)state;
    assert_int_equal(ft_ckpt_parse_name("checkpoint-12"), 12);
    assert_int_equal(ft_ckpt_parse_name("checkpoint-0"), 0);
    assert_int_equal(ft_ckpt_parse_name("checkpoint-"), -1);
    assert_int_equal(ft_ckpt_parse_name("checkpoint-1a"), -1);
    assert_int_equal(ft_ckpt_parse_name(".checkpoint-1.tmp"), -1);
    assert_int_equal(ft_ckpt_parse_name("checkpoint-99999999999999999999999"), -1);
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 7 + 3);
    uint64_t whole = ft_ckpt_hash(FT_CKPT_HASH_INIT, buf, sizeof buf);
    uint64_t parts = ft_ckpt_hash(ft_ckpt_hash(FT_CKPT_HASH_INIT, buf, 512), buf + 512, 488);
    assert_true(whole == parts);
    buf[999] ^= 1;
    assert_true(ft_ckpt_hash(FT_CKPT_HASH_INIT, buf, sizeof buf) != whole);
    assert_true(ft_ckpt_hash(FT_CKPT_HASH_INIT, buf, 0) == FT_CKPT_HASH_INIT);
}

static void test_metrics_resume(void **state)
{
    (void)state;
    const char *lines =
        "{\"step\": 0, \"eval_loss\": 10.3, \"eval_tokens\": 5, \"elapsed_s\": 1}\n"
        "{\"step\": 1, \"loss\": 10.1, \"bad_steps\": 0}\n"
        "{\"step\": 2, \"loss\": 10.0, \"bad_steps\": 0}\n"
        "{\"step\": 2, \"eval_loss\": 10.2, \"eval_tokens\": 5, \"elapsed_s\": 2}\n"
        "{\"step\": 3, \"loss\": 9.9, \"bad_steps\": 0}\n"
        "{\"step\": 4, \"lo"; /* torn by a crash */
    char *path = t_write_tmp("metrics.jsonl", lines, strlen(lines));
    ft_metrics m;
    assert_int_equal(ft_metrics_open_resume(&m, path, 2, 1), 0);
    assert_int_equal(ft_metrics_step(&m, 3, NAN, 1e-3, INFINITY, 7, 100, 5, 1, 1, NULL), 0);
    ft_metrics_close(&m);
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(path, &txt, &len), 0);
    printf("%s", txt);
    const char *want =
        "{\"step\": 0, \"eval_loss\": 10.3, \"eval_tokens\": 5, \"elapsed_s\": 1}\n"
        "{\"step\": 1, \"loss\": 10.1, \"bad_steps\": 0}\n"
        "{\"step\": 2, \"loss\": 10.0, \"bad_steps\": 0}\n"
        "{\"step\": 2, \"eval_loss\": 10.2, \"eval_tokens\": 5, \"elapsed_s\": 2}\n"
        "{\"step\": 3, \"loss\": null, \"lr\": 0.001, \"grad_norm\": null, \"tokens\": 7, "
        "\"tokens_per_s\": 100, \"elapsed_s\": 5, \"skipped\": true, \"bad_steps\": 1}\n";
    assert_string_equal(txt, want);
    free(txt);
    /* the final eval at the resumed step is redone, so it is dropped */
    assert_int_equal(ft_metrics_open_resume(&m, path, 2, 0), 0);
    ft_metrics_close(&m);
    assert_int_equal(ft_read_file(path, &txt, &len), 0);
    assert_null(strstr(txt, "10.2"));
    assert_non_null(strstr(txt, "\"step\": 2, \"loss\""));
    free(txt);
    /* no metrics file yet (resume into a new --out) */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(ft_metrics_open_resume(&m, path, 5, 1), 0);
    ft_metrics_close(&m);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_damaged_detected),
        cmocka_unit_test(test_every_byte_covered),
        cmocka_unit_test(test_version1_state),
        cmocka_unit_test(test_eval_tracking_state),
        cmocka_unit_test(test_best_adapter_folder),
        cmocka_unit_test(test_rotation),
        cmocka_unit_test(test_write_failure),
        cmocka_unit_test(test_config_diff),
        cmocka_unit_test(test_names_and_hash),
        cmocka_unit_test(test_metrics_resume),
    };
    return cmocka_run_group_tests(tests, setup, model_fix_teardown);
}
