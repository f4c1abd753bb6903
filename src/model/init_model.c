/* init_model.c - random-weight models of any Llama-family config (see init_model.h). */
#include "src/model/init_model.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/model/config.h"
#include "src/model/model.h"
#include "src/model/quant.h"

#define CHUNK ((int64_t)1 << 22) /* elements generated per write */

uint64_t ft_init_tensor_id(const char *name)
{
    return ft_pack_xxh64(name, strlen(name), 0x66747565ull);
}

/* Box-Muller on the pair k = i / 2 of a tensor: radius and angle from two splitmix64 draws. */
static inline void pair_polar(uint64_t seed, uint64_t tid, int64_t k, float *r, float *t)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ tid ^ ((uint64_t)k * 0xD1B54A32D192ED03ull);
    uint64_t a = ft_splitmix64(&x), b = ft_splitmix64(&x);
    float u1 = (float)((a >> 40) + 1) * (1.0f / 16777216.0f); /* (0, 1] */
    float u2 = (float)(b >> 40) * (1.0f / 16777216.0f);       /* [0, 1) */
    *r = sqrtf(-2.0f * logf(u1));
    *t = 6.28318530717958647692f * u2;
}

static inline float round_bf16(float v) { return ft_quant_bf16_to_f32(ft_quant_f32_to_bf16(v)); }

float ft_init_normal(uint64_t seed, uint64_t tid, int64_t i, float std)
{
    /* one (u1, u2) pair per two consecutive elements: cos for the even, sin for the odd */
    float r, t;
    pair_polar(seed, tid, i >> 1, &r, &t);
    return round_bf16(std * ((i & 1) ? r * sinf(t) : r * cosf(t)));
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
} itensor;

static int64_t numel(const itensor *t) { return t->rows * (t->cols ? t->cols : 1); }

static void proj_dims(const ft_model_config *c, int p, int64_t *out, int64_t *in)
{
    const int64_t C = c->hidden_size, F = c->intermediate_size;
    const int64_t qd = c->num_attention_heads * c->head_dim, kd = c->num_key_value_heads * c->head_dim;
    switch (p) {
    case FT_Q: *out = qd; *in = C; break;
    case FT_K: case FT_V: *out = kd; *in = C; break;
    case FT_O: *out = C; *in = qd; break;
    case FT_GATE: case FT_UP: *out = F; *in = C; break;
    default: *out = C; *in = F; break;
    }
}

/* The model's tensors in HF order (formats.md 2.3). */
static itensor *list_tensors(const ft_model_config *c, int64_t *n_out)
{
    int64_t L = c->num_hidden_layers, cap = 3 + L * 16, n = 0;
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
            proj_dims(c, p, &o, &i);
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
        }
        t = &v[n++];
        *t = (itensor){"", C, 0, K_ONES, l, FT_PACK_ROLE_FFN_NORM};
        snprintf(t->name, sizeof t->name, "model.layers.%lld.post_attention_layernorm.weight",
                 (long long)l);
    }
    v[n++] = (itensor){"model.norm.weight", C, 0, K_ONES, -1, FT_PACK_ROLE_FINAL_NORM};
    if (!c->tie_word_embeddings)
        v[n++] = (itensor){"lm_head.weight", V, C, K_NORMAL, -1, FT_PACK_ROLE_LM_HEAD};
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
    uint64_t tid = ft_init_tensor_id(t->name);
    /* pairwise: the same values as ft_init_normal, one log/sqrt per two elements */
    int64_t k0 = e0 >> 1, k1 = (e0 + n + 1) >> 1;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t k = k0; k < k1; k++) {
        float r, th;
        pair_polar(seed, tid, k, &r, &th);
        int64_t i = 2 * k - e0;
        if (i >= 0) dst[i] = round_bf16(std * (r * cosf(th)));
        if (i + 1 < n) dst[i + 1] = round_bf16(std * (r * sinf(th)));
    }
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
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
        free(h);
        return ft_err(FT_E_RANGE, "%s: path too long", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(h);
        return ft_err(-e, "%s: cannot create: %s", tmp, strerror(e));
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
            for (int64_t j = 0; j < m; j++) b16[j] = ft_quant_f32_to_bf16(f32[j]);
            rc = write_all(fd, b16, (size_t)m * 2, tmp);
        }
    }
    if (!rc && fsync(fd) < 0) rc = ft_err(-errno, "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) < 0 && !rc) rc = ft_err(-errno, "%s: close: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) < 0) rc = ft_err(-errno, "%s: rename: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    else *bytes += 8 + hl + (uint64_t)off;
    return rc;
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

typedef struct rnd_src {
    const itensor *ts;
    int64_t n;
    uint64_t seed;
    float std;
} rnd_src;

static int rnd_read(void *user, int64_t l, int role, int64_t row0, int64_t n_rows, int64_t cols,
                    float *dst)
{
    rnd_src *r = user;
    for (int64_t i = 0; i < r->n; i++)
        if (r->ts[i].layer == l && r->ts[i].role == role) {
            int64_t c = r->ts[i].cols ? r->ts[i].cols : 1;
            gen(&r->ts[i], r->seed, r->std, row0 * c, n_rows * c, dst);
            return 0;
        }
    return ft_err(FT_E_INVALID, "init-model: no tensor for layer %lld role %d", (long long)l, role);
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
            ft_xxh64 h;
            ft_xxh64_init(&h, 0);
            static const char tag[] = "ftune init-model v1";
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
        rnd_src r = {ts, n, c->seed, (float)std};
        ft_pack_src src = {&r, rnd_read, NULL, NULL};
        if (!rc) rc = ft_pack_build(res->pack_path, &cfg, json, len, id, &s, &src, &res->pack);
    }
    free(ts);
    free(json);
    return rc;
}
