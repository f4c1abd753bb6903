/* init_model.c - random-weight models of any Llama-family config (see init_model.h). */
#include "src/tools/init_model.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/formats/config.h"
#include "src/model/model.h"
#include "src/numeric/quant.h"

#define CHUNK ((int64_t)1 << 22) /* elements generated per write */

uint64_t ft_init_tensor_id(const char *name)
{
    return ft_xxh64(name, strlen(name), 0x66747565ull);
}

/* ---- the generator -------------------------------------------------------------------------
 *
 * Element i of a tensor belongs to group g = i / 32 of 16 Box-Muller pairs: w = i % 32, pair
 * k = 16 g + w % 16, the cosine for w < 16 and the sine otherwise (so a group's 32 values are
 * two plain vector stores). Per pair, with four 32-bit keys from splitmix64 of (seed, tensor
 * id, k >> 32) and lo = the low 32 bits of k:
 *   a = mix(mix(lo ^ K0) + K1), b = mix(mix(lo ^ K2) + K3)   (mix: Wellons' lowbias32)
 *   u1 = (a / 256 + 1) / 2^24 in (0, 1], t = (b / 256) / 2^24 in [0, 1)
 *   value = bf16(std * (sqrt(-2 ln u1) * cos or sin(2 pi t)))
 * ln from the exponent and 2 atanh((m - 1)/(m + 1)) to the f^7 term (m in [0.707, 1.414),
 * error < 3e-8 + rounding), sin/cos from Cephes' sinf/cosf polynomials on [-pi/4, pi/4]
 * after an exact quadrant reduction of t. Only IEEE +, -, *, / and sqrt, no fused
 * multiply-add (ISO C: -ffp-contract=off), so every vector width gives the same bits: the
 * 4-lane (SSE / generic), 8-lane (AVX2) and 16-lane (AVX-512F) kernels below are picked at
 * run time and test_pack.c checks they agree. */

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi" /* vector arguments of always-inline helpers */
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FT_GEN_X86 1
#endif

#define GEN_PAIRS 16 /* pairs per group; a group is 32 values */

/* One kernel: n_groups whole groups of pairs lo0 / 16 .. (all with the same k >> 32), values
 * into out (32 per group). W lanes, vector types vf/vu/vi, SQRT(x) a correctly rounded
 * lane-wise square root. */
#define GEN_KERNEL(NAME, ATTR, W, SQRT)                                                       \
    ATTR static void NAME(const uint32_t key[4], uint32_t lo0, int64_t n_groups, float std,     \
                          float *out)                                                         \
    {                                                                                         \
        typedef float vf __attribute__((vector_size(4 * W)));                                 \
        typedef uint32_t vu __attribute__((vector_size(4 * W)));                              \
        typedef int32_t vi __attribute__((vector_size(4 * W)));                               \
        vu iota;                                                                              \
        for (int l = 0; l < W; l++) iota[l] = (uint32_t)l;                                    \
        const vf zero = {0};                                                                  \
        for (int64_t g = 0; g < n_groups; g++) {                                              \
            for (int h = 0; h < GEN_PAIRS; h += W) {                                          \
                vu k = iota + (lo0 + (uint32_t)(g * GEN_PAIRS + h));                          \
                vu a = k ^ key[0], b = k ^ key[2];                                            \
                a ^= a >> 16; a *= 0x7feb352du; a ^= a >> 15; a *= 0x846ca68bu; a ^= a >> 16; \
                b ^= b >> 16; b *= 0x7feb352du; b ^= b >> 15; b *= 0x846ca68bu; b ^= b >> 16; \
                a += key[1];                                                                  \
                b += key[3];                                                                  \
                a ^= a >> 16; a *= 0x7feb352du; a ^= a >> 15; a *= 0x846ca68bu; a ^= a >> 16; \
                b ^= b >> 16; b *= 0x7feb352du; b ^= b >> 15; b *= 0x846ca68bu; b ^= b >> 16; \
                /* ln u1 = ln j - 24 ln 2 with j = a / 256 + 1 in [1, 2^24], exact in fp32 */ \
                vf jf = __builtin_convertvector((vi)((a >> 8) + 1u), vf);                     \
                vu ub = (vu)jf;                                                               \
                vi e = (vi)(ub >> 23) - (127 + 24);                                           \
                vu mu = (ub & 0x007fffffu) | 0x3f800000u; /* m in [1, 2) */                   \
                vi big = (vi)((vf)mu > 1.41421356f);      /* -1 where m > sqrt 2: m / 2 */   \
                mu -= (vu)big & 0x00800000u;                                                  \
                e -= big;                                                                     \
                vf m = (vf)mu;                                                                \
                vf f = (m - 1.0f) / (m + 1.0f);                                               \
                vf z = f * f;                                                                 \
                vf p = ((z * (2.0f / 7.0f) + (2.0f / 5.0f)) * z + (2.0f / 3.0f)) * z + 2.0f;  \
                vf lnu = f * p + __builtin_convertvector(e, vf) * 0.693147180559945309f;      \
                vf r = SQRT(lnu * -2.0f); /* ln u1 <= 0, = 0 only at u1 = 1 */               \
                /* 2 pi t = x + q pi/2, q = round(4 t), |x| <= pi/4, exact in integers */     \
                vi j = (vi)(b >> 8);                                                          \
                vi q = (j + (1 << 21)) >> 22;                                                 \
                vf x = __builtin_convertvector(j - (q << 22), vf) *                           \
                       (float)(1.57079632679489661923 / 4194304.0);                           \
                z = x * x;                                                                    \
                vf sx = ((z * -1.9515295891e-4f + 8.3321608736e-3f) * z - 1.6666654611e-1f) * \
                            z * x + x;                                                        \
                vf cx = ((z * 2.443315711809948e-5f - 1.388731625493765e-3f) * z +            \
                         4.166664568298827e-2f) * z * z - z * 0.5f + 1.0f;                    \
                vi odd = (q & 1) != 0;                                                        \
                vu cneg = (vu)(((q + 1) & 2) != 0) & 0x80000000u;                             \
                vu sneg = (vu)((q & 2) != 0) & 0x80000000u;                                   \
                vu c = (((vu)cx & ~(vu)odd) | ((vu)sx & (vu)odd)) ^ cneg;                     \
                vu s = (((vu)sx & ~(vu)odd) | ((vu)cx & (vu)odd)) ^ sneg;                     \
                vu vc = (vu)((r * (vf)c) * std + zero), vs = (vu)((r * (vf)s) * std + zero);  \
                vc = (vc + 0x7fffu + ((vc >> 16) & 1u)) & 0xffff0000u; /* bf16, nearest even */ \
                vs = (vs + 0x7fffu + ((vs >> 16) & 1u)) & 0xffff0000u;                        \
                memcpy(out + g * 2 * GEN_PAIRS + h, &vc, sizeof vc);                          \
                memcpy(out + g * 2 * GEN_PAIRS + GEN_PAIRS + h, &vs, sizeof vs);              \
            }                                                                                 \
        }                                                                                     \
    }

#ifdef FT_GEN_X86
#define SQRT_SSE(x) ((vf)_mm_sqrt_ps((__m128)(x)))
#define SQRT_AVX(x) ((vf)_mm256_sqrt_ps((__m256)(x)))
#define SQRT_512(x) ((vf)_mm512_sqrt_ps((__m512)(x)))
GEN_KERNEL(gen_w4, , 4, SQRT_SSE)
GEN_KERNEL(gen_w8, __attribute__((target("avx2"))), 8, SQRT_AVX)
GEN_KERNEL(gen_w16, __attribute__((target("avx512f"))), 16, SQRT_512)
#else
#define SQRT_GEN(x) ({ vf x_ = (x), y_; for (int l_ = 0; l_ < 4; l_++) y_[l_] = sqrtf(x_[l_]); y_; })
GEN_KERNEL(gen_w4, , 4, SQRT_GEN)
#endif

typedef void (*gen_fn)(const uint32_t key[4], uint32_t lo0, int64_t n_groups, float std, float *out);
static gen_fn g_gen;  /* chosen once (ft_init_set_simd) */

int ft_init_set_simd(int level)
{
    int best = 1;
#ifdef FT_GEN_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) best = 2;
    if (__builtin_cpu_supports("avx512f")) best = 3;
#endif
    if (level < 0 || level > 3)
        return ft_err(FT_E_INVALID, "init-model: SIMD level %d (0 = best, 1 = SSE/generic, "
                      "2 = AVX2, 3 = AVX-512F)", level);
    if (level > best)
        return ft_err(FT_E_UNSUPPORTED, "init-model: SIMD level %d is not available on this CPU "
                      "(best: %d)", level, best);
    if (level == 0) level = best;
    gen_fn f = gen_w4;
#ifdef FT_GEN_X86
    if (level == 2) f = gen_w8;
    if (level == 3) f = gen_w16;
#endif
    __atomic_store_n(&g_gen, f, __ATOMIC_RELEASE);
    return level;
}

static gen_fn gen_kernel(void)
{
    gen_fn f = __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE);
    if (!f) {
        ft_init_set_simd(0);
        f = __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE);
    }
    return f;
}

/* The four keys of pairs with k >> 32 == hi. */
static void gen_keys(uint64_t seed, uint64_t tid, uint64_t hi, uint32_t key[4])
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ tid ^ (hi * 0xD1B54A32D192ED03ull);
    uint64_t a = ft_splitmix64(&x), b = ft_splitmix64(&x);
    key[0] = (uint32_t)a;
    key[1] = (uint32_t)(a >> 32);
    key[2] = (uint32_t)b;
    key[3] = (uint32_t)(b >> 32);
}

/* Groups [g0, g1) of a tensor into out (32 values per group), split where k >> 32 changes. */
static void gen_groups(gen_fn fn, uint64_t seed, uint64_t tid, float std, int64_t g0, int64_t g1,
                       float *out)
{
    const int64_t per_hi = ((int64_t)1 << 32) / GEN_PAIRS; /* groups with the same k >> 32 */
    while (g0 < g1) {
        int64_t hi = g0 / per_hi, end = (hi + 1) * per_hi;
        if (end > g1) end = g1;
        uint32_t key[4];
        gen_keys(seed, tid, (uint64_t)hi, key);
        fn(key, (uint32_t)((uint64_t)g0 * GEN_PAIRS), end - g0, std, out);
        out += (end - g0) * 2 * GEN_PAIRS;
        g0 = end;
    }
}

/* Values [e0, e0 + n) of a tensor, whole groups written in place, partial ones through a
 * small buffer. Parallel (OpenMP, static split into whole groups) above 4096 groups. */
static void gen_normal(uint64_t seed, uint64_t tid, float std, int64_t e0, int64_t n, float *dst)
{
    if (n <= 0) return;
    const int64_t G = 2 * GEN_PAIRS;
    gen_fn fn = gen_kernel();
    int64_t g0 = e0 / G, g1 = (e0 + n + G - 1) / G;
    int64_t f0 = (e0 + G - 1) / G, f1 = (e0 + n) / G; /* whole groups: [f0, f1) */
    float tmp[2 * GEN_PAIRS];
    if (f1 <= f0) { /* everything inside one or two partial groups */
        for (int64_t g = g0; g < g1; g++) {
            gen_groups(fn, seed, tid, std, g, g + 1, tmp);
            for (int64_t i = 0; i < G; i++) {
                int64_t e = g * G + i;
                if (e >= e0 && e < e0 + n) dst[e - e0] = tmp[i];
            }
        }
        return;
    }
    if (g0 < f0) { /* leading partial group */
        gen_groups(fn, seed, tid, std, g0, f0, tmp);
        for (int64_t e = e0; e < f0 * G; e++) dst[e - e0] = tmp[e - g0 * G];
    }
    if (f1 < g1) { /* trailing partial group */
        gen_groups(fn, seed, tid, std, f1, g1, tmp);
        for (int64_t e = f1 * G; e < e0 + n; e++) dst[e - e0] = tmp[e - f1 * G];
    }
    int64_t whole = f1 - f0;
    float *base = dst + (f0 * G - e0);
    if (whole <= 4096) {
        gen_groups(fn, seed, tid, std, f0, f1, base);
        return;
    }
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t a = whole * t / nt, b = whole * (t + 1) / nt;
        gen_groups(fn, seed, tid, std, f0 + a, f0 + b, base + a * G);
    }
}

float ft_init_normal(uint64_t seed, uint64_t tid, int64_t i, float std)
{
    float v;
    gen_normal(seed, tid, std, i, 1, &v);
    return v;
}

/* ---- the tensor list ---------------------------------------------------------------------- */

enum { K_NORMAL, K_ONES, K_ZEROS };

typedef struct itensor {
    char name[160];
    int64_t rows, cols;        /* cols 0: a vector of rows */
    int kind;
    int64_t layer;             /* -1: global */
    int role;                  /* ft_pack_role */
    int shard;
    uint64_t tid;              /* ft_init_tensor_id(name) */
} itensor;

static int64_t numel(const itensor *t) { return t->rows * (t->cols ? t->cols : 1); }

/* The model's tensors in HF order (formats.md 2.3). */
static itensor *list_tensors(const ft_model_config *c, int64_t *n_out)
{
    int64_t L = c->num_hidden_layers, cap = 3 + L * 16, n = 0; /* <= 15 per layer */
    itensor *v = calloc((size_t)cap, sizeof *v);
    if (!v) return NULL;
    const int64_t C = c->hidden_size, V = c->vocab_size;
    v[n++] = (itensor){"model.embed_tokens.weight", V, C, K_NORMAL, -1, FT_PACK_ROLE_EMBED};
    for (int64_t l = 0; l < L; l++) {
        itensor *t = &v[n++];
        *t = (itensor){"", C, 0, K_ONES, l, FT_PACK_ROLE_ATTN_NORM};
        snprintf(t->name, sizeof t->name, "model.layers.%lld.input_layernorm.weight", (long long)l);
        for (int p = 0; p < FT_N_PROJ; p++) {
            int64_t o, i;
            ft_proj_dims(c, p, &o, &i);
            t = &v[n++];
            *t = (itensor){"", o, i, K_NORMAL, l, FT_PACK_ROLE_W0 + p};
            snprintf(t->name, sizeof t->name, "model.layers.%lld.%s.%s.weight", (long long)l,
                     ft_proj_parent[p], ft_proj_name[p]);
            int bias = c->attention_bias &&
                       (p <= FT_V || (p == FT_O && strcmp(c->model_type, "qwen2")));
            if (bias) {
                t = &v[n++];
                *t = (itensor){"", o, 0, K_ZEROS, l, FT_PACK_ROLE_B0 + p};
                snprintf(t->name, sizeof t->name, "model.layers.%lld.%s.%s.bias", (long long)l,
                         ft_proj_parent[p], ft_proj_name[p]);
            }
            for (int k = 0; p == FT_O && c->qk_norm && k < 2; k++) {
                /* Qwen3Attention's q_norm / k_norm (registered after o_proj): RMSNorm
                 * weights, ones as transformers initializes them */
                t = &v[n++];
                *t = (itensor){"", c->head_dim, 0, K_ONES, l,
                               k ? FT_PACK_ROLE_K_NORM : FT_PACK_ROLE_Q_NORM};
                snprintf(t->name, sizeof t->name, "model.layers.%lld.self_attn.%s.weight",
                         (long long)l, k ? "k_norm" : "q_norm");
            }
        }
        t = &v[n++];
        *t = (itensor){"", C, 0, K_ONES, l, FT_PACK_ROLE_FFN_NORM};
        snprintf(t->name, sizeof t->name, "model.layers.%lld.post_attention_layernorm.weight",
                 (long long)l);
    }
    v[n++] = (itensor){"model.norm.weight", C, 0, K_ONES, -1, FT_PACK_ROLE_FINAL_NORM};
    if (!c->tie_word_embeddings)
        v[n++] = (itensor){"lm_head.weight", V, C, K_NORMAL, -1, FT_PACK_ROLE_LM_HEAD};
    for (int64_t i = 0; i < n; i++) v[i].tid = ft_init_tensor_id(v[i].name);
    *n_out = n;
    return v;
}

/* Values [e0, e0 + n) of tensor t as fp32. */
static void gen(const itensor *t, uint64_t seed, float std, int64_t e0, int64_t n, float *dst)
{
    if (t->kind != K_NORMAL) {
        float v = t->kind == K_ONES ? 1.0f : 0.0f;
        for (int64_t i = 0; i < n; i++) dst[i] = v;
        return;
    }
    gen_normal(seed, t->tid, std, e0, n, dst);
}

/* ---- safetensors, streamed ---------------------------------------------------------------- */

static int write_all(int fd, const void *p, size_t n, const char *path)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            return ft_err(-e, "%s: write failed: %s", path, strerror(e));
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One shard: header (compact JSON, "__metadata__" first, padded to 8 bytes), then each
 * tensor generated in chunks as bf16; temp name, fsync, rename. */
static int write_shard(const char *path, const itensor *ts, int64_t n, int shard, uint64_t seed,
                       float std, float *f32, uint16_t *b16, uint64_t *bytes)
{
    size_t cap = 256 + (size_t)n * 256, k = 0;
    char *h = malloc(cap);
    if (!h) return ft_err(-ENOMEM, "%s: out of memory", path);
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ts[i].shard != shard) continue;
        int64_t nb = 2 * numel(&ts[i]);
        if (ts[i].cols)
            k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],"
                                  "\"data_offsets\":[%lld,%lld]}", ts[i].name, (long long)ts[i].rows,
                                  (long long)ts[i].cols, (long long)off, (long long)(off + nb));
        else
            k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],"
                                  "\"data_offsets\":[%lld,%lld]}", ts[i].name, (long long)ts[i].rows,
                                  (long long)off, (long long)(off + nb));
        off += nb;
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    while (k % 8) h[k++] = ' ';
    char tmp[4300];
    int fd = ft_tmp_open(path, tmp, sizeof tmp);
    if (fd < 0) {
        free(h);
        return fd;
    }
    uint64_t hl = k;
    int rc = write_all(fd, &hl, 8, tmp);
    if (!rc) rc = write_all(fd, h, k, tmp);
    free(h);
    for (int64_t i = 0; i < n && !rc; i++) {
        if (ts[i].shard != shard) continue;
        int64_t total = numel(&ts[i]);
        for (int64_t e0 = 0; e0 < total && !rc; e0 += CHUNK) {
            int64_t m = total - e0 < CHUNK ? total - e0 : CHUNK;
            gen(&ts[i], seed, std, e0, m, f32);
            ft_quant_f32_to_bf16_n(b16, f32, m);
            rc = write_all(fd, b16, (size_t)m * 2, tmp);
        }
    }
    FT_TRY(ft_tmp_commit(fd, tmp, path, rc));
    *bytes += 8 + hl + (uint64_t)off;
    return 0;
}

static int write_index(const char *dir, const itensor *ts, int64_t n, int n_shards, uint64_t total)
{
    cJSON *o = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(o, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(o, "weight_map");
    char fn[64];
    for (int64_t i = 0; i < n; i++) {
        snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", ts[i].shard + 1, n_shards);
        cJSON_AddStringToObject(wm, ts[i].name, fn);
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return ft_err(-ENOMEM, "out of memory");
    char p[4200];
    int rc = ft_path_join(p, sizeof p, dir, "model.safetensors.index.json");
    if (!rc) rc = ft_write_file_atomic(p, s, strlen(s));
    cJSON_free(s);
    return rc;
}

/* ---- the random pack source ---------------------------------------------------------------- */

/* Roles per layer slot: ATTN_NORM .. LM_HEAD are < 64 (pack.h). */
#define ROLE_SLOTS 64

typedef struct rnd_src {
    const itensor *ts;
    int64_t n;
    uint64_t seed;
    float std;
    int32_t *index;            /* [(layer + 1) * ROLE_SLOTS + role] -> tensor, -1 if none */
    int64_t n_layers;
} rnd_src;

/* Thread-safe (a pure function of the arguments): the builder calls it from several threads
 * at once for disjoint rows (ft_pack_build_opts.concurrent_src). */
static int rnd_read(void *user, int64_t l, int role, int64_t row0, int64_t n_rows, int64_t cols,
                    float *dst)
{
    rnd_src *r = user;
    int32_t k = l >= -1 && l < r->n_layers && role >= 0 && role < ROLE_SLOTS
                    ? r->index[(l + 1) * ROLE_SLOTS + role] : -1;
    if (k < 0)
        return ft_err(FT_E_INVALID, "init-model: no tensor for layer %lld role %d", (long long)l, role);
    const itensor *t = &r->ts[k];
    int64_t c = t->cols ? t->cols : 1;
    (void)cols;
    gen(t, r->seed, r->std, row0 * c, n_rows * c, dst);
    return 0;
}

/* ---- the model ------------------------------------------------------------------------------ */

static int copy_file(const char *from_dir, const char *to_dir, const char *name)
{
    char a[4200], b[4200], *data;
    size_t len;
    FT_TRY(ft_path_join(a, sizeof a, from_dir, name));
    FT_TRY(ft_path_join(b, sizeof b, to_dir, name));
    FT_TRY(ft_read_file(a, &data, &len));
    int rc = ft_write_file_atomic(b, data, len);
    free(data);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ft_init_model(const ft_init_cfg *c, ft_init_result *res)
{
    memset(res, 0, sizeof *res);
    char *json = NULL, p[4200];
    size_t len = 0;
    ft_model_config cfg;
    FT_TRY(ft_read_file(c->config_path, &json, &len));
    int rc = ft_config_parse(&cfg, json, len, c->config_path);
    double std = 0.02;
    cJSON *root = rc ? NULL : cJSON_ParseWithLength(json, len);
    const cJSON *ir = root ? cJSON_GetObjectItemCaseSensitive(root, "initializer_range") : NULL;
    if (cJSON_IsNumber(ir)) std = ir->valuedouble;
    cJSON_Delete(root);
    if (!rc && !(std >= 0 && std < 10))
        rc = ft_err(FT_E_INVALID, "%s: initializer_range %g out of range", c->config_path, std);
    res->init_std = std;
    int64_t n = 0;
    itensor *ts = rc ? NULL : list_tensors(&cfg, &n);
    if (!rc && !ts) rc = ft_err(-ENOMEM, "out of memory");
    float *f32 = NULL;
    uint16_t *b16 = NULL;
    if (!rc && (rc = ft_mkdir_p(c->out_dir)) < 0)
        rc = ft_err(rc, "%s: cannot create the folder: %s", c->out_dir, strerror(-rc));
    if (!rc) rc = ft_path_join(p, sizeof p, c->out_dir, "config.json");
    if (!rc) rc = ft_write_file_atomic(p, json, len);
    for (int64_t i = 0; !rc && i < n; i++) res->n_params += numel(&ts[i]);
    if (!rc && c->write_safetensors) {
        double t0 = now_s();
        int64_t cap = c->shard_bytes > 0 ? c->shard_bytes : 5000000000ll, cur = 0;
        int shard = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t b = 2 * numel(&ts[i]);
            if (cur > 0 && cur + b > cap) {
                shard++;
                cur = 0;
            }
            ts[i].shard = shard;
            cur += b;
        }
        res->n_shards = shard + 1;
        f32 = malloc((size_t)CHUNK * 4);
        b16 = malloc((size_t)CHUNK * 2);
        if (!f32 || !b16) rc = ft_err(-ENOMEM, "out of memory");
        for (int s = 0; !rc && s < res->n_shards; s++) {
            char fn[64];
            if (res->n_shards == 1) snprintf(fn, sizeof fn, "model.safetensors");
            else snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", s + 1, res->n_shards);
            rc = ft_path_join(p, sizeof p, c->out_dir, fn);
            if (!rc) rc = write_shard(p, ts, n, s, c->seed, (float)std, f32, b16, &res->st_bytes);
        }
        if (!rc && res->n_shards > 1) rc = write_index(c->out_dir, ts, n, res->n_shards, res->st_bytes);
        res->st_seconds = now_s() - t0;
    }
    free(f32);
    free(b16);
    if (!rc && c->tokenizer_dir) {
        static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
        for (int k = 0; k < 2 && !rc; k++) {
            char a[4200];
            if (ft_path_join(a, sizeof a, c->tokenizer_dir, files[k]) < 0 || access(a, R_OK)) {
                if (k == 0) rc = ft_err(-ENOENT, "%s: no tokenizer.json", c->tokenizer_dir);
                continue;
            }
            rc = copy_file(c->tokenizer_dir, c->out_dir, files[k]);
            if (!rc) res->tokenizer_files++;
        }
    }
    if (!rc && c->pack_quant) {
        /* identity: the safetensors just written when there are any (so `ftune pack` of this
         * folder gives the same file), else the config text and the seed */
        uint64_t id = 0;
        if (c->write_safetensors) {
            rc = ft_pack_model_identity(c->out_dir, &id);
        } else {
            ft_xxh64_state h;
            ft_xxh64_init(&h, 0);
            static const char tag[] = "ftune init-model v2"; /* v2: the SIMD generator */
            ft_xxh64_update(&h, tag, sizeof tag);
            ft_xxh64_update(&h, json, len);
            ft_xxh64_update(&h, &c->seed, sizeof c->seed);
            id = ft_xxh64_digest(&h);
        }
        ft_pack_settings s;
        ft_pack_settings_default(&s, c->pack_quant);
        if (!rc) rc = ft_path_join(res->pack_path, sizeof res->pack_path, c->out_dir,
                                   c->pack_quant == FT_PACK_QUANT_NF4 ? FT_PACK_LOCAL_NF4
                                                                      : FT_PACK_LOCAL_BF16);
        rnd_src r = {ts, n, c->seed, (float)std, NULL, cfg.num_hidden_layers};
        r.index = rc ? NULL : malloc((size_t)(cfg.num_hidden_layers + 1) * ROLE_SLOTS * sizeof *r.index);
        if (!rc && !r.index) rc = ft_err(-ENOMEM, "out of memory");
        for (int64_t i = 0; !rc && i < (cfg.num_hidden_layers + 1) * ROLE_SLOTS; i++) r.index[i] = -1;
        for (int64_t i = 0; !rc && i < n; i++)
            r.index[(ts[i].layer + 1) * ROLE_SLOTS + ts[i].role] = (int32_t)i;
        ft_pack_src src = {&r, rnd_read, NULL, NULL};
        /* c->pack_direct: O_DIRECT writes (benchmarks of the disk path) */
        ft_pack_build_opts bo = {1, 0, 0, c->pack_direct != 0};
        if (!rc) rc = ft_pack_build_ex(res->pack_path, &cfg, json, len, id, &s, &src, &bo, &res->pack);
        free(r.index);
    }
    free(ts);
    free(json);
    return rc;
}
