/* merge.c - streaming LoRA merge (see merge.h): plan every output tensor from the source's
 * tensor table, then for each one read blocks of rows from the mapping, add scale * B A,
 * convert, and hand the bytes to the output sink (a safetensors shard or the GGUF writer).
 * Config and tokenizer files: merge_files.c. */
#include "adapters/export/merge.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "adapters/export/export_gguf.h"
#include "adapters/export/merge_internal.h"
#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/formats/gguf.h"
#include "src/formats/gguf_write.h"
#include "src/numeric/quant.h"
#include "src/formats/safetensors.h"

#define CHUNK_ELEMS ((int64_t)1 << 20) /* fp32 values per row block (4 MiB; 8 MiB of fp64 delta) */
#define RAW_CHUNK ((size_t)64 << 20)   /* bytes per raw copy step */

/* Drops the pages of [p, p + n) from this process (they stay in the page cache), so reading
 * a whole model through the mapping never grows the resident set. */
static void drop_pages(const void *p, size_t n)
{
    static long pg;
    if (!pg) pg = sysconf(_SC_PAGESIZE);
    if (!p || !n || pg <= 0) return;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1), e = (uintptr_t)p + n;
    madvise((void *)a, e - a, MADV_DONTNEED);
}

static int st_to_ggml(int dt)
{
    switch (dt) {
    case FT_ST_F32: return FT_GGML_F32;
    case FT_ST_F16: return FT_GGML_F16;
    case FT_ST_BF16: return FT_GGML_BF16;
    default: return -1;
    }
}

/* ---- source ---------------------------------------------------------------------------- */

/* Rank for ordering an HF folder's tensors layer by layer: embeddings, layers, the rest. */
static int64_t hf_rank(const char *name)
{
    long long l;
    if (!strncmp(name, "model.embed_tokens.", 19)) return -1;
    if (sscanf(name, "model.layers.%lld.", &l) == 1) return l;
    return INT64_MAX / 2;
}

static int cmp_plan(const void *x, const void *y)
{
    const mg_tensor *a = x, *b = y;
    if (a->order != b->order) return a->order < b->order ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Opens the HF folder's safetensors files (the index's shards, model.safetensors, or the
 * folder's single *.safetensors file). */
static int open_hf_files(mg_src *s, const char *dir)
{
    char p[4200];
    FT_TRY(ft_path_join(p, sizeof p, dir, "model.safetensors.index.json"));
    char *txt = NULL;
    size_t len;
    const char *names[4096];
    int n = 0;
    cJSON *o = NULL;
    if (access(p, F_OK) == 0) {
        FT_TRY(ft_read_file(p, &txt, &len));
        o = cJSON_ParseWithLength(txt, len);
        free(txt);
        const cJSON *wm = o ? cJSON_GetObjectItemCaseSensitive(o, "weight_map") : NULL;
        if (!cJSON_IsObject(wm)) {
            cJSON_Delete(o);
            return ft_err(FT_E_INVALID, "%s: no \"weight_map\" object", p);
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, wm) {
            if (!cJSON_IsString(it) || strchr(it->valuestring, '/')) {
                cJSON_Delete(o);
                return ft_err(FT_E_INVALID, "%s: weight_map[\"%s\"] is not a file name in the folder",
                              p, it->string);
            }
            int seen = 0;
            for (int k = 0; k < n && !seen; k++) seen = !strcmp(names[k], it->valuestring);
            if (!seen && n < 4096) names[n++] = it->valuestring;
        }
    } else {
        FT_TRY(ft_path_join(p, sizeof p, dir, "model.safetensors"));
        if (access(p, F_OK) == 0) {
            names[n++] = "model.safetensors";
        } else {
            return ft_err(FT_E_NOTFOUND, "%s: no model.safetensors or model.safetensors.index.json "
                          "(pytorch_model.bin is not supported)", dir);
        }
    }
    s->files = calloc((size_t)n, sizeof *s->files);
    if (!s->files) {
        cJSON_Delete(o);
        return ft_err(-ENOMEM, "out of memory");
    }
    int rc = 0;
    for (int k = 0; k < n && !rc; k++) {
        FT_TRY(ft_path_join(p, sizeof p, dir, names[k]));
        rc = ft_st_open(&s->files[k], p);
        if (!rc) s->n_files++;
    }
    cJSON_Delete(o);
    return rc;
}

int mg_src_open(mg_src *s, const char *path)
{
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    FT_TRY(ft_export_base_config(path, &s->cfg, s->arch, sizeof s->arch, &s->has_rope_freqs));
    int isdir = ft_is_dir(path);
    if (isdir < 0) return ft_err(isdir, "%s: %s", path, strerror(-isdir));
    s->is_gguf = !isdir;
    if (s->is_gguf) FT_TRY(ft_gguf_open(&s->g, path));
    else FT_TRY(open_hf_files(s, path));
    return 0;
}

void mg_src_close(mg_src *s)
{
    for (int k = 0; k < s->n_files; k++) ft_st_close(s->files[k]);
    free(s->files);
    ft_gguf_close(s->g);
    memset(s, 0, sizeof *s);
}

/* Fills the source side of t from a tensor: name, type, shape (rows = outer, cols = inner),
 * data; layer/proj/qk from the HF name. */
static void describe(mg_tensor *t, const char *hf_name)
{
    t->layer = -1;
    t->proj = -1;
    long long l;
    int k = 0;
    if (sscanf(hf_name, "model.layers.%lld.%n", &l, &k) == 1 && k > 0) {
        t->layer = l;
        for (int p = 0; p < 7; p++) {
            char w[64];
            snprintf(w, sizeof w, "%s.%s.", ft_proj_parent[p], ft_proj_name[p]);
            size_t wl = strlen(w);
            if (strncmp(hf_name + k, w, wl)) continue;
            t->is_qk = p == FT_Q || p == FT_K;
            if (!strcmp(hf_name + k + wl, "weight")) t->proj = p;
        }
    }
}

static void set_shape(mg_tensor *t, int n_dims, const int64_t *outer_first)
{
    t->n_dims = n_dims;
    int64_t bn = 1;
    ft_quant_block(t->src_type >= 0 ? t->src_type : FT_GGML_F32, &bn, NULL);
    if (n_dims == 2) {
        t->rows = outer_first[0];
        t->cols = outer_first[1];
    } else {
        int64_t n = 1;
        for (int d = 0; d < n_dims; d++) n *= outer_first[d];
        t->rows = bn == 1 ? n : 1;
        t->cols = bn == 1 ? 1 : n;
    }
    t->numel = 1;
    for (int d = 0; d < n_dims; d++) t->shape[d] = outer_first[d];
    for (int d = 0; d < n_dims; d++) t->numel *= outer_first[d];
}

/* Output type of a float tensor. */
static int out_type_for(const mg_tensor *t, const ft_merge_opts *o)
{
    if (o->format == FT_MERGE_SAFETENSORS) return o->dtype;
    if (t->n_dims != 2) return FT_GGML_F32;
    if (o->dtype == FT_GGML_Q8_0 && t->cols % FT_QK8_0) return FT_GGML_F16;
    return o->dtype;
}

int mg_plan(mg_src *s, const ft_merge_opts *o, mg_tensor **out, int64_t *n_out, int64_t *skipped)
{
    int64_t cap = 0, n = 0, seq = 0;
    mg_tensor *v = NULL;
    *skipped = 0;
    int llama = !strcmp(s->arch, "llama");
#define PUSH()                                                                              \
    do {                                                                                    \
        if (n == cap) {                                                                     \
            cap = cap ? 2 * cap : 256;                                                      \
            mg_tensor *nv = realloc(v, (size_t)cap * sizeof *v);                            \
            if (!nv) { free(v); return ft_err(-ENOMEM, "out of memory"); }                  \
            v = nv;                                                                         \
        }                                                                                   \
        memset(&v[n], 0, sizeof v[n]);                                                      \
    } while (0)
    if (s->is_gguf) {
        for (int64_t i = 0; i < ft_gguf_n_tensors(s->g); i++) {
            const ft_gguf_tensor *gt = ft_gguf_tensor_at(s->g, i);
            char hf[160];
            int has_hf = ft_export_hf_name(gt->name, hf, sizeof hf);
            if (o->format == FT_MERGE_SAFETENSORS && !has_hf) {
                if (!strcmp(gt->name, "rope_freqs.weight")) {
                    free(v);
                    return ft_err(FT_E_UNSUPPORTED, "%s: tensor \"rope_freqs.weight\" (llama3 rope "
                                  "scaling) cannot be written into config.json by this merge; use "
                                  "--format gguf", s->path);
                }
                (*skipped)++;
                continue;
            }
            PUSH();
            mg_tensor *t = &v[n++];
            t->seq = seq++;
            snprintf(t->src_name, sizeof t->src_name, "%s", gt->name);
            snprintf(t->out_name, sizeof t->out_name, "%s",
                     o->format == FT_MERGE_SAFETENSORS ? hf : gt->name);
            if (has_hf) describe(t, hf);
            t->src_type = gt->type;
            int64_t shp[FT_GGUF_MAX_DIMS];
            for (int d = 0; d < gt->n_dims; d++) shp[d] = gt->ne[gt->n_dims - 1 - d];
            set_shape(t, gt->n_dims, shp);
            t->data = gt->data;
            t->nbytes = gt->nbytes;
            t->src_perm = llama && t->is_qk;
        }
    } else {
        for (int f = 0; f < s->n_files; f++)
            for (int64_t i = 0; i < ft_st_count(s->files[f]); i++) {
                const ft_st_tensor *st = ft_st_at(s->files[f], i);
                char gg[160];
                int has_gg = ft_export_gguf_name(st->name, gg, sizeof gg);
                int gt = st_to_ggml(st->dtype);
                if (o->format == FT_MERGE_GGUF && (!has_gg || gt < 0)) {
                    (*skipped)++; /* rotary_emb.inv_freq and the like: llama.cpp has no place for them */
                    continue;
                }
                PUSH();
                mg_tensor *t = &v[n++];
                t->seq = seq++;
                t->order = hf_rank(st->name);
                snprintf(t->src_name, sizeof t->src_name, "%s", st->name);
                snprintf(t->out_name, sizeof t->out_name, "%s", o->format == FT_MERGE_GGUF ? gg : st->name);
                describe(t, st->name);
                t->src_type = gt;
                t->raw_st_dtype = gt < 0 ? st->dtype : -1;
                set_shape(t, st->n_dims, st->shape);
                t->data = st->data;
                t->nbytes = st->nbytes;
            }
        qsort(v, (size_t)n, sizeof *v, cmp_plan);
    }
#undef PUSH
    for (int64_t i = 0; i < n; i++) {
        mg_tensor *t = &v[i];
        t->out_perm = o->format == FT_MERGE_GGUF && llama && t->is_qk;
        if (t->src_type < 0) {
            t->out_type = -1;
            t->out_bytes = t->nbytes;
            continue;
        }
        t->out_type = out_type_for(t, o);
        t->out_bytes = (uint64_t)ft_quant_bytes(t->out_type, t->numel);
        if ((t->src_perm || t->out_perm) && t->rows % s->cfg.head_dim) {
            free(v);
            return ft_err(FT_E_INVALID, "%s: tensor \"%s\" has %lld rows, not a multiple of "
                          "head_dim %lld", s->path, t->src_name, (long long)t->rows,
                          (long long)s->cfg.head_dim);
        }
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* ---- the row pipeline ------------------------------------------------------------------ */

/* HF row of output row o, and the source row holding it. */
static int64_t inv_qk_row(int64_t x, int64_t hd)
{
    int64_t h = x / hd, r = x % hd, j = r / (hd / 2), i = r % (hd / 2);
    return h * hd + 2 * i + j;
}

int mg_write_tensor(mg_sink *k, const mg_src *s, const mg_tensor *t, const ft_peft_file *a)
{
    const char *path = s->path;
    int merge = a && t->proj >= 0 && t->layer >= 0 && t->layer < a->n_layers &&
                (a->cfg.targets & (1u << t->proj));
    if (t->src_type < 0 || (!merge && t->src_perm == t->out_perm && t->src_type == t->out_type)) {
        /* bytes unchanged */
        const uint8_t *p = t->data;
        for (size_t off = 0; off < t->nbytes; off += RAW_CHUNK) {
            size_t m = t->nbytes - off < RAW_CHUNK ? t->nbytes - off : RAW_CHUNK;
            FT_TRY(k->write(k, p + off, m));
            drop_pages(p + off, m);
        }
        return 0;
    }
    if (!ft_quant_can_dequant(t->src_type))
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor \"%s\" has type %s, which ftune cannot convert "
                      "(" FT_QUANT_DEQUANT_LIST ")", path, t->src_name, ft_quant_name(t->src_type));
    const int64_t rows = t->rows, cols = t->cols, hd = s->cfg.head_dim;
    const int64_t row_bytes = ft_quant_bytes(t->src_type, cols);
    if (row_bytes < 0)
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\": %lld columns are not whole %s blocks", path,
                      t->src_name, (long long)cols, ft_quant_name(t->src_type));
    const int perm = t->src_perm || t->out_perm;
    int64_t rpc = CHUNK_ELEMS / cols;
    if (rpc < 1) rpc = 1;
    if (perm) rpc = rpc < hd ? hd : rpc / hd * hd;
    if (rpc > rows) rpc = rows;
    const int64_t r = merge ? a->cfg.r : 0;
    if (merge && (a->out_n[t->proj] != rows || a->in_n[t->proj] != cols))
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\" is (%lld x %lld) but the adapter's %s is "
                      "(%lld x %lld)", path, t->src_name, (long long)rows, (long long)cols,
                      ft_proj_name[t->proj], (long long)a->out_n[t->proj], (long long)a->in_n[t->proj]);
    float *w = malloc((size_t)(rpc * cols) * sizeof *w);
    double *A = merge ? malloc((size_t)(r * cols) * sizeof *A) : NULL;
    double *B = merge ? malloc((size_t)(rows * r) * sizeof *B) : NULL;
    double *Bc = merge ? malloc((size_t)(rpc * r) * sizeof *Bc) : NULL;
    double *D = merge ? malloc((size_t)(rpc * cols) * sizeof *D) : NULL;
    int rc = 0;
    if (!w || (merge && (!A || !B || !Bc || !D))) rc = ft_err(-ENOMEM, "out of memory merging %s", t->src_name);
    if (!rc && merge) rc = ft_peft_tensor_f64(a, t->layer, t->proj, 0, A);
    if (!rc && merge) rc = ft_peft_tensor_f64(a, t->layer, t->proj, 1, B);
    if (!rc && merge)
        for (int ab = 0; ab < 2; ab++) /* the adapter's pages too: it may be gigabytes */
            drop_pages(a->t[t->layer][t->proj][ab]->data, a->t[t->layer][t->proj][ab]->nbytes);
    const float scale = a ? a->scale : 0.0f;
    const uint8_t *src = t->data;
    for (int64_t o0 = 0; o0 < rows && !rc; o0 += rpc) {
        int64_t m = rows - o0 < rpc ? rows - o0 : rpc;
        for (int64_t i = 0; i < m && !rc; i++) {
            int64_t o = o0 + i, hf = t->out_perm ? ft_export_qk_row(o, hd) : o;
            int64_t sr = t->src_perm ? inv_qk_row(hf, hd) : hf;
            rc = ft_quant_dequant(t->src_type, src + sr * row_bytes, w + i * cols, cols);
            if (merge) memcpy(Bc + i * r, B + hf * r, (size_t)r * sizeof *Bc);
        }
        if (rc) {
            ft_err_prefix(rc, "%s: tensor \"%s\"", path, t->src_name);
            break;
        }
        if (merge) {
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)cols, (int)r, 1.0,
                        Bc, (int)r, A, (int)cols, 0.0, D, (int)cols);
            for (int64_t i = 0; i < m * cols; i++) {
                float d = (float)D[i];
                w[i] = w[i] + scale * d;
            }
        }
        rc = k->write_f32(k, t, w, m * cols);
        /* rows o0..o0+m come from source rows o0..o0+m: a permutation stays within whole heads */
        drop_pages(src + o0 * row_bytes, (size_t)(m * row_bytes));
    }
    free(w);
    free(A);
    free(B);
    free(Bc);
    free(D);
    return rc;
}
