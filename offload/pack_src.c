/* pack_src.c - where packs come from and where they are kept: the model sources for the
 * builder (a HF folder streamed tensor by tensor, bitsandbytes 4-bit weights copied as they
 * are, a GGUF file through the loader), the model identity, the cache directory and
 * ft_pack_ensure (see pack.h). */
#include "offload/pack.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "offload/pack_internal.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/formats/bnb4.h"
#include "src/formats/gguf.h"
#include "src/formats/safetensors.h"

/* ---- HF folder source --------------------------------------------------------------------- */

typedef struct hf_src {
    const char *dir;
    const ft_model_config *cfg;
    ft_st_set *set;
    ft_bnb4_tensor bnb;        /* the bnb weight being packed (one at a time) */
    char bnb_name[256];
} hf_src;

static int hf_name(const ft_model_config *c, int64_t l, int role, char *out, size_t n)
{
    (void)c;
    int k;
    if (l < 0) {
        const char *s = role == FT_PACK_ROLE_EMBED ? "model.embed_tokens.weight"
                      : role == FT_PACK_ROLE_FINAL_NORM ? "model.norm.weight" : "lm_head.weight";
        k = snprintf(out, n, "%s", s);
    } else if (role == FT_PACK_ROLE_Q_NORM || role == FT_PACK_ROLE_K_NORM) {
        k = snprintf(out, n, "model.layers.%lld.self_attn.%s.weight", (long long)l,
                     role == FT_PACK_ROLE_Q_NORM ? "q_norm" : "k_norm");
    } else if (role == FT_PACK_ROLE_ATTN_NORM || role == FT_PACK_ROLE_FFN_NORM) {
        k = snprintf(out, n, "model.layers.%lld.%s.weight", (long long)l,
                     role == FT_PACK_ROLE_ATTN_NORM ? "input_layernorm" : "post_attention_layernorm");
    } else {
        int p = role >= FT_PACK_ROLE_B0 ? role - FT_PACK_ROLE_B0 : role - FT_PACK_ROLE_W0;
        k = snprintf(out, n, "model.layers.%lld.%s.%s.%s", (long long)l, ft_proj_parent[p],
                     ft_proj_name[p], role >= FT_PACK_ROLE_B0 ? "bias" : "weight");
    }
    return k < (int)n ? 0 : ft_err(FT_E_RANGE, "tensor name too long");
}

/* Opens (or keeps) the bnb state of weight `name` of shape rows x cols. */
static int hf_bnb(hf_src *h, const char *name, int64_t rows, int64_t cols)
{
    if (h->bnb.owned && !strcmp(h->bnb_name, name)) return 0;
    ft_bnb4_free(&h->bnb);
    h->bnb_name[0] = 0;
    FT_TRY(ft_bnb4_open(h->set, name, rows, cols, &h->bnb));
    snprintf(h->bnb_name, sizeof h->bnb_name, "%s", name);
    return 0;
}

/* rows x cols of tensor `role` in block l (-1: global), as the pack's slot table has it
 * (ft_pack_block_slots: the one place that knows each role's shape). */
static int role_shape(const ft_model_config *c, int64_t l, int role, int64_t *rows, int64_t *cols)
{
    ft_pack_slot sl[FT_PACK_MAX_SLOTS];
    int n = ft_pack_block_slots(c, l, sl);
    for (int i = 0; i < n; i++)
        if (sl[i].role == role) {
            *rows = sl[i].rows;
            *cols = sl[i].cols;
            return 0;
        }
    return ft_err(FT_E_INVALID, "layer %lld: the pack has no tensor of role %d", (long long)l, role);
}

/* Drops the mapped pages of a tensor once packed, so the resident set stays near one layer
 * (madvise on a read-only private file mapping: the pages are re-read if touched again). */
static void drop_pages(const void *data, size_t n)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)data + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    uintptr_t e = ((uintptr_t)data + n) & ~((uintptr_t)pg - 1);
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

static int hf_read_f32(void *user, int64_t l, int role, int64_t row0, int64_t n_rows, int64_t cols,
                       float *dst)
{
    hf_src *h = user;
    char name[256];
    FT_TRY(hf_name(h->cfg, l, role, name, sizeof name));
    int64_t rows, cc;
    FT_TRY(role_shape(h->cfg, l, role, &rows, &cc));
    if (ft_bnb4_detect(h->set, name)) {
        FT_TRY(hf_bnb(h, name, rows, cols));
        return ft_nf4_dequant_range(&h->bnb.v, row0 * cols, n_rows * cols, dst);
    }
    const ft_st_file *f = NULL;
    const ft_st_tensor *t = ft_st_set_find(h->set, name, &f);
    if (!t)
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\" not found in the model's safetensors",
                      h->dir, name);
    int ok = cols == 1 ? t->n_dims == 1 && t->shape[0] == rows
                       : t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols;
    if (!ok) {
        char want[64], got[64] = "[";
        if (cols == 1) snprintf(want, sizeof want, "[%lld]", (long long)rows);
        else snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
        for (int d = 0; d < t->n_dims && d < 4; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), d ? ", %lld" : "%lld",
                     (long long)t->shape[d]);
        snprintf(got + strlen(got), sizeof got - strlen(got), "]");
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\" has shape %s, expected %s (from "
                      "config.json)", ft_st_path(f), name, got, want);
    }
    if (t->dtype != FT_ST_F32 && t->dtype != FT_ST_F16 && t->dtype != FT_ST_BF16)
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor \"%s\": dtype %s cannot be converted to fp32 "
                      "(F32, F16 and BF16 can)", ft_st_path(f), name, ft_st_dtype_name(t->dtype));
    ft_st_tensor sub = *t; /* the row range as a tensor of its own */
    size_t es = ft_st_dtype_size(t->dtype);
    sub.data = (const uint8_t *)t->data + (size_t)(row0 * cols) * es;
    sub.nbytes = (size_t)(n_rows * cols) * es;
    sub.file_offset += (int64_t)((size_t)(row0 * cols) * es);
    int rc = ft_st_to_f32(&sub, dst, n_rows * cols);
    if (rc < 0) /* an element index counts from row row0 */
        return ft_err_prefix(rc, "%s (rows %lld-%lld)", ft_st_path(f), (long long)row0,
                             (long long)(row0 + n_rows - 1));
    drop_pages(sub.data, sub.nbytes); /* chunks come in order: these rows are done */
    return 0;
}

static int hf_read_nf4(void *user, int64_t l, int role, ft_nf4_view *v)
{
    hf_src *h = user;
    char name[256];
    FT_TRY(hf_name(h->cfg, l, role, name, sizeof name));
    if (!ft_bnb4_detect(h->set, name)) return 0;
    int64_t rows, cols;
    FT_TRY(role_shape(h->cfg, l, role, &rows, &cols));
    FT_TRY(hf_bnb(h, name, rows, cols));
    *v = h->bnb.v;
    return 1;
}

static void hf_release(void *user, int64_t l, int role)
{
    hf_src *h = user;
    char name[256];
    if (hf_name(h->cfg, l, role, name, sizeof name) < 0) return;
    const ft_st_tensor *t = ft_st_set_find(h->set, name, NULL);
    if (t) drop_pages(t->data, t->nbytes);
    if (h->bnb.owned && !strcmp(h->bnb_name, name)) {
        static const char *const sfx[] = {".absmax", ".nested_absmax"};
        for (int k = 0; k < 2; k++) {
            char c[300];
            snprintf(c, sizeof c, "%s%s", name, sfx[k]);
            const ft_st_tensor *ct = ft_st_set_find(h->set, c, NULL);
            if (ct) drop_pages(ct->data, ct->nbytes);
        }
        ft_bnb4_free(&h->bnb);
        h->bnb_name[0] = 0;
    }
}

/* ---- GGUF source (through the loader: dequantized, q/k unpermuted) ------------------------ */

/* A llama-arch GGUF with attention biases may lack blk.N.attn_output.bias (llama.cpp loads
 * it as optional; the loader then gives o_proj none), while the pack's layout, from the
 * config alone (ft_pack_has_bias), has an o bias for every llama-type model with
 * attention_bias, as transformers' LlamaAttention does. Its slot is then zeros: the same
 * outputs as no bias. */
#define O_BIAS (FT_PACK_ROLE_B0 + FT_O)

static const float *gguf_base(const ft_model *m, int64_t l, int role)
{
    if (l < 0)
        return role == FT_PACK_ROLE_EMBED ? m->embed : role == FT_PACK_ROLE_FINAL_NORM ? m->final_norm
                                                                                      : m->lm_head;
    const ft_layer_weights *w = &m->layers[l];
    if (role == FT_PACK_ROLE_ATTN_NORM) return w->attn_norm;
    if (role == FT_PACK_ROLE_FFN_NORM) return w->ffn_norm;
    if (role == FT_PACK_ROLE_Q_NORM) return w->q_norm;
    if (role == FT_PACK_ROLE_K_NORM) return w->k_norm;
    if (role >= FT_PACK_ROLE_B0) return w->proj[role - FT_PACK_ROLE_B0].b;
    return w->proj[role - FT_PACK_ROLE_W0].w;
}

static int gguf_read_f32(void *user, int64_t l, int role, int64_t row0, int64_t n_rows,
                         int64_t cols, float *dst)
{
    const float *b = gguf_base(user, l, role);
    if (!b && role == O_BIAS) { /* see O_BIAS */
        memset(dst, 0, (size_t)(n_rows * cols) * sizeof *dst);
        return 0;
    }
    if (!b) return ft_err(FT_E_INVALID, "layer %lld: tensor role %d missing", (long long)l, role);
    memcpy(dst, b + row0 * cols, (size_t)(n_rows * cols) * sizeof *dst);
    return 0;
}

/* ---- GGUF source streamed from the file (no fp32 model in memory) --------------------------- */

typedef struct gguf_src {
    const ft_gguf *g;
    const ft_model_config *cfg;
} gguf_src;

/* Rows of a role's tensor, dequantized from the mapped file as the loader would
 * (ft_gguf_hf_rows): the pack equals the one built from a loaded model, byte for byte. */
static int gguf_stream_f32(void *user, int64_t l, int role, int64_t row0, int64_t n_rows,
                           int64_t cols, float *dst)
{
    gguf_src *s = user;
    char name[256];
    FT_TRY(hf_name(s->cfg, l, role, name, sizeof name));
    int perm;
    if (role == O_BIAS && !ft_gguf_hf_tensor(s->g, name, &perm)) { /* see O_BIAS */
        memset(dst, 0, (size_t)(n_rows * cols) * sizeof *dst);
        return 0;
    }
    return ft_gguf_hf_rows(s->g, s->cfg, name, row0, n_rows, cols, dst);
}

static void gguf_stream_release(void *user, int64_t l, int role)
{
    gguf_src *s = user;
    char name[256];
    int perm;
    if (hf_name(s->cfg, l, role, name, sizeof name) < 0) return;
    const ft_gguf_tensor *t = ft_gguf_hf_tensor(s->g, name, &perm);
    if (t) drop_pages(t->data, t->nbytes);
}

/* A config.json text for a model whose config came from GGUF metadata. */
static char *config_json_of(const ft_model_config *c)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "model_type", c->model_type);
    cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", (double)c->hidden_size);
    cJSON_AddNumberToObject(o, "intermediate_size", (double)c->intermediate_size);
    cJSON_AddNumberToObject(o, "num_hidden_layers", (double)c->num_hidden_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", (double)c->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", (double)c->num_key_value_heads);
    cJSON_AddNumberToObject(o, "head_dim", (double)c->head_dim);
    cJSON_AddNumberToObject(o, "max_position_embeddings", (double)c->max_position_embeddings);
    cJSON_AddNumberToObject(o, "rms_norm_eps", (double)c->rms_norm_eps);
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddBoolToObject(o, "attention_bias", c->attention_bias);
    if (c->rope_type != FT_ROPE_DEFAULT) {
        static const char *const names[] = {"default", "linear", "llama3", "dynamic", "yarn"};
        cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", names[c->rope_type]);
        cJSON_AddNumberToObject(r, "factor", c->rope_factor);
        if (c->rope_type == FT_ROPE_LLAMA3) {
            cJSON_AddNumberToObject(r, "low_freq_factor", c->rope_low_freq_factor);
            cJSON_AddNumberToObject(r, "high_freq_factor", c->rope_high_freq_factor);
        }
        if (c->rope_original_max_position_embeddings > 0)
            cJSON_AddNumberToObject(r, "original_max_position_embeddings",
                                    (double)c->rope_original_max_position_embeddings);
        if (c->rope_type == FT_ROPE_YARN) {
            cJSON_AddNumberToObject(r, "beta_fast", c->rope_beta_fast);
            cJSON_AddNumberToObject(r, "beta_slow", c->rope_beta_slow);
            cJSON_AddNumberToObject(r, "attention_factor", c->rope_attention_factor);
        }
    }
    if (c->bos_token_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", (double)c->bos_token_id);
    if (c->n_eos > 0) {
        cJSON *e = cJSON_AddArrayToObject(o, "eos_token_id");
        for (int i = 0; i < c->n_eos; i++) cJSON_AddItemToArray(e, cJSON_CreateNumber((double)c->eos_token_id[i]));
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* ---- identity ---------------------------------------------------------------------------- */

/* Hashes a file's name, size and first `n` bytes (n < 0: the safetensors header). */
static int hash_file_head(ft_xxh64_state *h, const char *dir, const char *name, int64_t n)
{
    char p[4200];
    FT_TRY(ft_path_join(p, sizeof p, dir, name));
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ft_err(-errno, "%s: cannot open: %s", p, strerror(errno));
    struct stat sb;
    int rc = fstat(fd, &sb) < 0 ? ft_err(-errno, "%s: stat: %s", p, strerror(errno)) : 0;
    uint64_t hl = 0;
    if (!rc && n < 0) {
        if (pread(fd, &hl, 8, 0) != 8 || hl > 100000000u || (int64_t)hl + 8 > (int64_t)sb.st_size)
            rc = ft_err(FT_E_CORRUPT, "%s: offset 0: bad safetensors header length", p);
        n = (int64_t)hl + 8;
    }
    if (!rc && n > (int64_t)sb.st_size) n = (int64_t)sb.st_size;
    char *buf = rc ? NULL : malloc((size_t)(n > 0 ? n : 1));
    if (!rc && !buf) rc = ft_err(-ENOMEM, "%s: out of memory", p);
    if (!rc && n > 0 && pread(fd, buf, (size_t)n, 0) != (ssize_t)n)
        rc = ft_err(-EIO, "%s: short read of its header", p);
    if (!rc) {
        int64_t size = (int64_t)sb.st_size;
        ft_xxh64_update(h, name, strlen(name) + 1);
        ft_xxh64_update(h, &size, 8);
        ft_xxh64_update(h, buf, (size_t)n);
    }
    free(buf);
    close(fd);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The safetensors files of a folder, sorted (index.json shards, model.safetensors, or the
 * *.safetensors files). */
static int st_files(const char *dir, char ***out, int *n)
{
    char p[4200], **v = NULL;
    int k = 0, cap = 0, rc = 0;
    FT_TRY(ft_path_join(p, sizeof p, dir, "model.safetensors.index.json"));
    DIR *d = opendir(dir);
    if (!d) return ft_err(-errno, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t L = strlen(e->d_name);
        if (L < 12 || strcmp(e->d_name + L - 12, ".safetensors")) continue;
        if (k == cap) {
            cap = cap ? 2 * cap : 16;
            char **nv = realloc(v, sizeof *v * (size_t)cap);
            if (!nv) { rc = ft_err(-ENOMEM, "out of memory"); break; }
            v = nv;
        }
        if (!(v[k] = strdup(e->d_name))) { rc = ft_err(-ENOMEM, "out of memory"); break; }
        k++;
    }
    closedir(d);
    if (!rc && k == 0) rc = ft_err(-ENOENT, "%s: no *.safetensors files", dir);
    if (rc) {
        for (int i = 0; i < k; i++) free(v[i]);
        free(v);
        return rc;
    }
    qsort(v, (size_t)k, sizeof *v, cmp_str);
    *out = v;
    *n = k;
    return 0;
}

int ft_pack_model_identity(const char *model, uint64_t *identity)
{
    ft_xxh64_state h;
    ft_xxh64_init(&h, 0);
    static const char tag[] = "ftune-model-identity v1";
    ft_xxh64_update(&h, tag, sizeof tag);
    int isdir = ft_is_dir(model);
    if (isdir < 0) return ft_err(isdir, "%s: cannot open model: %s", model, strerror(-isdir));
    if (!isdir) {
        ft_gguf *g;
        FT_TRY(ft_gguf_open(&g, model));
        int64_t n = ft_gguf_data_offset(g);
        ft_gguf_close(g);
        char dir[4200], *slash;
        snprintf(dir, sizeof dir, "%s", model);
        slash = strrchr(dir, '/');
        const char *base = slash ? slash + 1 : model;
        if (slash) *slash = 0;
        FT_TRY(hash_file_head(&h, slash ? dir : ".", base, n));
        *identity = ft_xxh64_digest(&h);
        return 0;
    }
    FT_TRY(hash_file_head(&h, model, "config.json", INT32_MAX));
    char p[4200];
    FT_TRY(ft_path_join(p, sizeof p, model, "model.safetensors.index.json"));
    if (access(p, R_OK) == 0) FT_TRY(hash_file_head(&h, model, "model.safetensors.index.json", INT32_MAX));
    char **files;
    int n, rc = 0;
    FT_TRY(st_files(model, &files, &n));
    for (int i = 0; i < n; i++) {
        if (!rc) rc = hash_file_head(&h, model, files[i], -1);
        free(files[i]);
    }
    free(files);
    if (!rc) *identity = ft_xxh64_digest(&h);
    return rc;
}

/* ---- cache -------------------------------------------------------------------------------- */

/* A pack to find or build without a cache folder: the program found no default
 * (ft_pack_default_cache_dir) and none was given. */
static int no_cache_dir(void)
{
    return ft_err(FT_E_INVALID, "neither XDG_CACHE_HOME nor HOME is set: pass --cache-dir");
}

int ft_pack_default_cache_dir(const char *x, const char *home, char *out, size_t n)
{
    int k;
    if (x && x[0]) k = snprintf(out, n, "%s/ftune/packs", x);
    else if (home && home[0]) k = snprintf(out, n, "%s/.cache/ftune/packs", home);
    else return ft_err(FT_E_INVALID, "neither XDG_CACHE_HOME nor HOME is set: pass --cache-dir");
    return k < (int)n ? 0 : ft_err(FT_E_RANGE, "cache directory path too long");
}

int ft_pack_cache_path(char *out, size_t n, const char *dir, uint64_t identity,
                       const ft_pack_settings *s)
{
    int k = s->quant == FT_PACK_QUANT_NF4
                ? snprintf(out, n, "%s/%016llx-nf4-b%lld-n%lld.ftpack", dir,
                           (unsigned long long)identity, (long long)s->blocksize,
                           (long long)s->nested_blocksize)
                : snprintf(out, n, "%s/%016llx-%s.ftpack", dir, (unsigned long long)identity,
                           ft_pack_quant_name(s->quant));
    return k < (int)n ? 0 : ft_err(FT_E_RANGE, "%s: pack path too long", dir);
}

/* ---- verification stamp ------------------------------------------------------------------ */

/* "<pack>.verified" records the file's (device, inode, size, mtime, ctime) when every checksum
 * of it last verified. A later start whose stat() gives the same values skips the full read
 * (a 70B pack is 39.5 GB): any write to the file, a rename over it or a restored mtime changes
 * one of them (ctime cannot be set by utime). The racy case of git's index (a change within the
 * file system's timestamp granularity of the stat taken) is excluded as git does: no stamp is
 * written for a file changed less than STAMP_SETTLE_S seconds before the stat. Bit rot that
 * leaves the metadata alone is then caught later, when the executor reads each block with its
 * checksum (offload/exec.h). Best effort: a stamp that cannot be written (read-only folder)
 * only means the next start verifies again. */
#define STAMP_SETTLE_S 2

static int stamp_line(const struct stat *st, char *buf, size_t n)
{
    return snprintf(buf, n, "ftune pack verified v1 dev %llu ino %llu size %lld mtime %lld.%09ld "
                    "ctime %lld.%09ld\n", (unsigned long long)st->st_dev,
                    (unsigned long long)st->st_ino, (long long)st->st_size,
                    (long long)st->st_mtim.tv_sec, (long)st->st_mtim.tv_nsec,
                    (long long)st->st_ctim.tv_sec, (long)st->st_ctim.tv_nsec);
}

static int stamp_path(const char *path, char *out, size_t n)
{
    return snprintf(out, n, "%s.verified", path) < (int)n ? 0 : -1;
}

/* 1 when path's stamp matches st (path's current stat()), else 0. */
static int stamp_ok(const char *path, const struct stat *st)
{
    char sp[4300], want[256], *have = NULL;
    size_t len = 0;
    if (stamp_path(path, sp, sizeof sp) || access(sp, F_OK)) return 0;
    int k = stamp_line(st, want, sizeof want);
    if (ft_read_file(sp, &have, &len) < 0) return 0;
    int ok = k > 0 && len == (size_t)k && !memcmp(have, want, len);
    free(have);
    return ok;
}

/* Records st (taken before the verification) as verified, unless the file changed within
 * STAMP_SETTLE_S seconds of now. */
static void stamp_write(const char *path, const struct stat *st)
{
    struct timespec now;
    char sp[4300], line[256];
    clock_gettime(CLOCK_REALTIME, &now);
    if (now.tv_sec - st->st_ctim.tv_sec < STAMP_SETTLE_S + 1 ||
        now.tv_sec - st->st_mtim.tv_sec < STAMP_SETTLE_S + 1 || stamp_path(path, sp, sizeof sp))
        return;
    int k = stamp_line(st, line, sizeof line);
    if (k > 0 && (size_t)k < sizeof line) (void)ft_write_file_atomic(sp, line, (size_t)k);
}

static void stamp_remove(const char *path)
{
    char sp[4300];
    if (!stamp_path(path, sp, sizeof sp)) unlink(sp);
}

/* 0 when path is a complete pack of identity (0: any) with settings s whose checksums all
 * verify, now or (*verified = 0) as recorded by its stamp; else the error (message says why).
 * A pack that verifies gets a stamp. */
static int usable(const char *path, uint64_t identity, const ft_pack_settings *s, uint64_t *found,
                  int *verified)
{
    ft_pack_file *p;
    struct stat st;
    int have_st = stat(path, &st) == 0, trust = have_st && stamp_ok(path, &st);
    *verified = !trust;
    FT_TRY(ft_pack_open(&p, path, !trust));
    const ft_pack_hdr *h = ft_pack_header(p);
    if (found) *found = h->identity;
    int rc = 0;
    if (identity && h->identity != identity)
        rc = ft_err(FT_E_INVALID, "%s: made for another model (identity %016llx, the model is "
                    "%016llx)", path, (unsigned long long)h->identity, (unsigned long long)identity);
    else if (h->settings != ft_pack_settings_hash(s))
        rc = ft_err(FT_E_INVALID, "%s: made with other quantization settings", path);
    ft_pack_close(p);
    if (!rc && !trust && have_st) stamp_write(path, &st);
    return rc;
}

/* A model opened as the builder's source: the config, its config.json text (stored in the
 * pack) and the tensor reader, as ft_pack_ensure builds from it. */
typedef struct model_src {
    const ft_model_config *cfg;
    char *json;                /* the config.json text (cJSON_free'd when made from GGUF) */
    size_t json_len;
    int json_cjson;
    ft_pack_src src;
    ft_model_config hf_cfg;    /* a HF folder's config */
    hf_src h;
    ft_model *deferred;        /* a GGUF file: shapes only (its tensors checked, none read) */
    ft_gguf *g;
    gguf_src gs;
} model_src;

static void msrc_close(model_src *ms)
{
    if (ms->json_cjson) cJSON_free(ms->json);
    else free(ms->json);
    ft_bnb4_free(&ms->h.bnb);
    ft_st_set_close(ms->h.set);
    ft_gguf_close(ms->g);
    ft_model_free(ms->deferred);
    memset(ms, 0, sizeof *ms);
}

/* Opens `model` as a source: a GGUF model in memory (loaded with weights) from its weights, a
 * GGUF file dequantized tensor by tensor as the builder asks, a HF folder streamed from its
 * safetensors. On an error nothing is left to close. */
static int msrc_open(model_src *ms, const char *model, const ft_model *loaded)
{
    memset(ms, 0, sizeof *ms);
    int isdir = ft_is_dir(model);
    if (isdir < 0) return ft_err(isdir, "%s: cannot open model: %s", model, strerror(-isdir));
    int rc = 0;
    if (!isdir && loaded && loaded->embed) { /* a GGUF model in memory: its weights */
        ms->cfg = &loaded->cfg;
        ms->json = config_json_of(&loaded->cfg);
        ms->json_cjson = 1;
        rc = ms->json ? 0 : ft_err(-ENOMEM, "out of memory");
        ms->src = (ft_pack_src){(void *)loaded, gguf_read_f32, NULL, NULL};
    } else if (!isdir) { /* a GGUF file, dequantized tensor by tensor as the builder asks */
        FT_TRY(ft_model_load_deferred(&ms->deferred, model));
        ms->cfg = &ms->deferred->cfg;
        rc = ft_gguf_open(&ms->g, model);
        if (!rc) {
            ms->json = config_json_of(ms->cfg);
            ms->json_cjson = 1;
            if (!ms->json) rc = ft_err(-ENOMEM, "out of memory");
        }
        ms->gs = (gguf_src){ms->g, ms->cfg};
        ms->src = (ft_pack_src){&ms->gs, gguf_stream_f32, NULL, gguf_stream_release};
    } else {
        char p[4200];
        FT_TRY(ft_path_join(p, sizeof p, model, "config.json"));
        FT_TRY(ft_config_load(&ms->hf_cfg, p));
        ms->cfg = &ms->hf_cfg;
        rc = ft_read_file(p, &ms->json, &ms->json_len);
        ms->h = (hf_src){model, &ms->hf_cfg, NULL};
        if (!rc) rc = ft_st_set_open(&ms->h.set, model);
        ms->src = (ft_pack_src){&ms->h, hf_read_f32, hf_read_nf4, hf_release};
    }
    if (!rc && ms->json_cjson) ms->json_len = strlen(ms->json);
    if (rc) msrc_close(ms);
    return rc;
}

static int build_from(const char *model, const ft_model *loaded, const char *path,
                      uint64_t identity, const ft_pack_settings *s, ft_pack_stats *st)
{
    model_src ms;
    FT_TRY(msrc_open(&ms, model, loaded));
    int rc = ft_pack_build(path, ms.cfg, ms.json, ms.json_len, identity, s, &ms.src, st);
    msrc_close(&ms);
    return rc;
}

int ft_pack_ensure(const char *model, const char *cache_dir, const ft_pack_settings *s,
                   int force, ft_pack_ensure_info *info)
{
    return ft_pack_ensure_loaded(model, NULL, cache_dir, s, force, info, NULL, NULL);
}

/* ft_pack_ensure_loaded up to the build: 1 when a usable pack is at info->path, 0 when one
 * is to be built there (info->action and reason say why), or an error. */
static int locate(const char *model, const char *cache_dir, const ft_pack_settings *s,
                  int force, ft_pack_ensure_info *info)
{
    memset(info, 0, sizeof *info);
    char dir[4200];
    if (cache_dir) snprintf(dir, sizeof dir, "%s", cache_dir);
    else return no_cache_dir();
    int isdir = ft_is_dir(model);
    if (isdir < 0) return ft_err(isdir, "%s: cannot open model: %s", model, strerror(-isdir));
    if (isdir && !force) { /* a pack written into the folder by init-model --pack */
        char lp[4200];
        FT_TRY(ft_path_join(lp, sizeof lp, model, s->quant == FT_PACK_QUANT_NF4 ? FT_PACK_LOCAL_NF4
                                                                                : FT_PACK_LOCAL_BF16));
        if (access(lp, F_OK) == 0) {
            int rc = usable(lp, 0, s, &info->identity, &info->verified);
            if (!rc) {
                info->action = FT_PACK_REUSED;
                snprintf(info->path, sizeof info->path, "%s", lp);
                return 1;
            }
            snprintf(info->reason, sizeof info->reason, "%s", ft_errmsg());
            char **files;
            int n;
            if (st_files(model, &files, &n) < 0) /* nothing to rebuild it from */
                return ft_err(rc, "%s (no safetensors to rebuild it from: run ftune init-model "
                              "again)", info->reason);
            for (int i = 0; i < n; i++) free(files[i]);
            free(files);
        }
    }
    if (isdir) {
        char **files;
        int n;
        if (st_files(model, &files, &n) < 0)
            return ft_err(-ENOENT, "%s: no *.safetensors files to pack%s", model,
                          info->reason[0] ? "" : " (a folder from `ftune init-model --pack` holds "
                          "only the pack of the quantization it was made with)");
        for (int i = 0; i < n; i++) free(files[i]);
        free(files);
    }
    FT_TRY(ft_pack_model_identity(model, &info->identity));
    FT_TRY(ft_pack_cache_path(info->path, sizeof info->path, dir, info->identity, s));
    if (!force && access(info->path, F_OK) == 0) {
        int rc = usable(info->path, info->identity, s, NULL, &info->verified);
        if (!rc) {
            info->action = FT_PACK_REUSED;
            return 1;
        }
        snprintf(info->reason, sizeof info->reason, "%s", ft_errmsg());
        info->action = FT_PACK_REBUILT;
    } else {
        info->action = force && access(info->path, F_OK) == 0 ? FT_PACK_REBUILT : FT_PACK_BUILT;
        if (force && info->action == FT_PACK_REBUILT) snprintf(info->reason, sizeof info->reason, "--force");
    }
    if (info->reason[0] && info->action != FT_PACK_REBUILT) info->action = FT_PACK_REBUILT;
    ft_err_clear(); /* the unusable file's error is in info->reason */
    return 0;
}

int ft_pack_locate(const char *model, const char *cache_dir, const ft_pack_settings *s,
                   ft_pack_ensure_info *info)
{
    int rc = locate(model, cache_dir, s, 0, info);
    return rc < 0 ? rc : 0;
}

void ft_pack_wait_text(char *buf, size_t n, const char *pack_path, long pid)
{
    char who[40] = "another process";
    if (pid > 0) snprintf(who, sizeof who, "process %ld", pid);
    snprintf(buf, n, "waiting for %s, which is building %s (a run sharing this cache folder); "
             "it is reused when done", who, pack_path);
}

/* The build lock of the pack at path: an exclusive flock on lp ("<path>.lock"), waited for when
 * another process holds it (on_wait told first, with the pid it wrote there; *waited_s the
 * seconds waited, > 0 exactly when it waited). The holder removes the file before it lets go
 * (build_unlock), so a waiter that then gets the lock on the removed file opens the path
 * again and locks what is there now (the inode check). *fd_out: the lock's descriptor, or -1
 * when the file system has no flock (then nothing is locked). Returns 0 or an error. */
static int build_lock(const char *path, const char *lp, ft_pack_wait_cb on_wait, void *user,
                      int *fd_out, double *waited_s)
{
    char pid[32] = "";
    *fd_out = -1;
    *waited_s = 0;
    int told = 0;
    for (;;) {
        int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return ft_err(-errno, "%s: cannot open the pack's build lock: %s", lp, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno != EWOULDBLOCK) { /* ENOLCK, EOPNOTSUPP: no locks here; build unlocked */
                close(fd);
                return 0;
            }
            ssize_t k = pread(fd, pid, sizeof pid - 1, 0);
            pid[k > 0 ? k : 0] = 0;
            struct timespec t0, t1; /* from before the caller is told: it may act on that */
            clock_gettime(CLOCK_MONOTONIC, &t0);
            if (on_wait && !told++) on_wait(path, strtol(pid, NULL, 10), user);
            while (flock(fd, LOCK_EX) != 0) {
                if (errno == EINTR) continue;
                int e = errno;
                close(fd);
                return ft_err(-e, "%s: waiting for the pack's build lock: %s", lp, strerror(e));
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            *waited_s += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            if (*waited_s <= 0) *waited_s = 1e-9; /* > 0: it waited */
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(lp, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            ssize_t w = ftruncate(fd, 0) == 0 ? pwrite(fd, pid, (size_t)n, 0) : -1;
            (void)w; /* the pid only names this process in a waiter's message */
            *fd_out = fd;
            return 0;
        }
        close(fd); /* the holder removed the file it locked: lock the one at the path now */
    }
}

/* Lets go of a build lock taken by build_lock on lp: its file removed first, then the
 * descriptor closed (a waiter on the removed file then locks the path afresh). */
static void build_unlock(const char *lp, int fd)
{
    if (fd < 0) return;
    unlink(lp);
    close(fd);
}

int ft_pack_ensure_loaded(const char *model, const ft_model *loaded, const char *cache_dir,
                          const ft_pack_settings *s, int force, ft_pack_ensure_info *info,
                          ft_pack_wait_cb on_wait, void *user)
{
    int found = locate(model, cache_dir, s, force, info);
    if (found) return found < 0 ? found : 0;
    char dir[4200];
    if (cache_dir) snprintf(dir, sizeof dir, "%s", cache_dir);
    else return no_cache_dir();
    FT_TRY(ft_mkdir_p(dir));
    int lock;
    double waited;
    char lp[4300];
    if (snprintf(lp, sizeof lp, "%s.lock", info->path) >= (int)sizeof lp)
        return ft_err(FT_E_INVALID, "%s: path too long for its build lock", info->path);
    FT_TRY(build_lock(info->path, lp, on_wait, user, &lock, &waited));
    if (!force) {
        /* look again under the lock: another run may have built it meanwhile, also one that
         * finished between the look above and the lock (no wait then) */
        found = locate(model, cache_dir, s, 0, info);
        info->waited_s = waited;
        if (found) {
            build_unlock(lp, lock);
            return found < 0 ? found : 0;
        }
    }
    info->waited_s = waited;
    stamp_remove(info->path);
    int rc = build_from(model, loaded, info->path, info->identity, s, &info->stats);
    build_unlock(lp, lock);
    return rc < 0 ? ft_err_prefix(rc, "building the pack of %s", model) : 0;
}

/* ---- a pack not built yet ------------------------------------------------------------------ */

/* Weights of block l (-1: global) of config c: elements of its tensors. */
static double block_elems(const ft_model_config *c, int64_t l)
{
    ft_pack_slot sl[FT_PACK_MAX_SLOTS];
    int n = ft_pack_block_slots(c, l, sl);
    double e = 0;
    for (int i = 0; i < n; i++) e += (double)sl[i].rows * (double)sl[i].cols;
    return e;
}

/* The largest source file of model (a folder's safetensors, or the GGUF file) into pv. */
static int largest_source(const char *model, ft_pack_preview *pv)
{
    struct stat st;
    int isdir = ft_is_dir(model);
    if (isdir < 0) return ft_err(isdir, "%s: cannot open model: %s", model, strerror(-isdir));
    if (!isdir) {
        if (stat(model, &st) < 0) return ft_err(-errno, "%s: cannot stat: %s", model, strerror(errno));
        snprintf(pv->disk_file, sizeof pv->disk_file, "%s", model);
        pv->disk_file_bytes = (uint64_t)st.st_size;
        return 0;
    }
    char **files;
    int n, rc = 0;
    FT_TRY(st_files(model, &files, &n));
    for (int i = 0; i < n; i++) {
        char p[4200];
        if (!rc) rc = ft_path_join(p, sizeof p, model, files[i]);
        if (!rc && stat(p, &st) == 0 && (uint64_t)st.st_size > pv->disk_file_bytes) {
            snprintf(pv->disk_file, sizeof pv->disk_file, "%s", p);
            pv->disk_file_bytes = (uint64_t)st.st_size;
        }
        free(files[i]);
    }
    free(files);
    return rc;
}

/* st_dev of path's folder, or of its nearest existing ancestor (the cache folder may not exist
 * yet); -1 if none can be found. */
static int folder_dev(const char *path, dev_t *dev)
{
    char d[4200];
    snprintf(d, sizeof d, "%s", path);
    for (;;) {
        char *slash = strrchr(d, '/');
        if (!slash) snprintf(d, sizeof d, ".");
        else if (slash == d) d[1] = 0;
        else *slash = 0;
        struct stat st;
        if (stat(d, &st) == 0) {
            *dev = st.st_dev;
            return 0;
        }
        if (!slash || !strcmp(d, "/")) return -1;
    }
}

void ft_pack_preview_free(ft_pack_preview *pv)
{
    if (!pv) return;
    ft_pack_close(pv->probe);
    free(pv->block_bytes);
    memset(pv, 0, sizeof *pv);
}

int ft_pack_preview_make(const char *model, const ft_model *loaded, const char *path,
                         const ft_pack_settings *s, int probe, ft_pack_preview *pv)
{
    memset(pv, 0, sizeof *pv);
    if (snprintf(pv->path, sizeof pv->path, "%s", path) >= (int)sizeof pv->path)
        return ft_err(FT_E_RANGE, "%s: path too long", path);
    pv->quant = s->quant;
    model_src ms;
    FT_TRY(msrc_open(&ms, model, loaded));
    const int64_t L = ms.cfg->num_hidden_layers;
    int rc = 0;
    pv->block_bytes = L >= 1 ? calloc((size_t)(L + 1), sizeof *pv->block_bytes) : NULL;
    if (!pv->block_bytes) rc = L >= 1 ? ft_err(-ENOMEM, "out of memory")
                                      : ft_err(FT_E_INVALID, "%s: no layers", model);
    if (!rc) rc = ft_pack_layout(ms.cfg, ms.json_len, s, &ms.src, pv->block_bytes, &pv->file_bytes);
    if (!rc) {
        pv->n_layers = L;
        for (int64_t l = 0; l < L; l++)
            if (pv->block_bytes[l] > pv->max_layer_bytes) pv->max_layer_bytes = pv->block_bytes[l];
        rc = largest_source(model, pv);
    }
    if (!rc) {
        struct stat st;
        dev_t dev;
        pv->disk_same_device = stat(pv->disk_file, &st) == 0 && folder_dev(path, &dev) == 0
                                   ? st.st_dev == dev : -1;
    }
    if (!rc && probe) {
        char dir[4200], pp[4300];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) *slash = 0;
        if (slash && slash != dir) rc = ft_mkdir_p(dir);
        if (!rc && snprintf(pp, sizeof pp, "%s.probe.%d", path, (int)getpid()) >= (int)sizeof pp)
            rc = ft_err(FT_E_RANGE, "%s: path too long", path);
        ft_pack_build_opts o = {0};
        o.layer_limit = 1;
        ft_pack_stats st;
        memset(&st, 0, sizeof st);
        if (!rc) rc = ft_pack_build_ex(pp, ms.cfg, ms.json, ms.json_len, 0, s, &ms.src, &o, &st);
        if (!rc) {
            rc = ft_pack_open_partial(&pv->probe, pp);
            unlink(pp); /* read through the open descriptors from here on */
        }
        if (rc < 0) rc = ft_err_prefix(rc, "building the probe pack of %s (layer 0)", model);
        if (!rc) {
            double e0 = block_elems(ms.cfg, 0), all = block_elems(ms.cfg, -1);
            for (int64_t l = 0; l < L; l++) all += block_elems(ms.cfg, l);
            pv->probe_seconds = st.layer_seconds;
            pv->build_estimate_s = e0 > 0 ? st.layer_seconds * all / e0 : 0;
        }
    }
    msrc_close(&ms);
    if (rc) ft_pack_preview_free(pv);
    return rc;
}
