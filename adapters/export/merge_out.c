/* merge_out.c - the outputs of ft_merge (see merge.h): safetensors shards streamed from the
 * row pipeline of merge.c with their index, or one GGUF file; config.json, tokenizer and
 * generation files; and ft_merge itself. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapters/export/export_gguf.h"
#include "adapters/export/hf_tok.h"
#include "adapters/export/merge_internal.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/numeric/quant.h"

static int ggml_to_st(int t)
{
    switch (t) {
    case FT_GGML_F32: return FT_ST_F32;
    case FT_GGML_F16: return FT_ST_F16;
    case FT_GGML_BF16: return FT_ST_BF16;
    default: return -1;
    }
}

/* ---- sinks ----------------------------------------------------------------------------- */

static int gguf_raw(mg_sink *k, const void *d, size_t n) { return ft_gguf_w_data(k->gw, d, n); }

static int gguf_f32(mg_sink *k, const mg_tensor *t, const float *x, int64_t n)
{
    (void)t;
    return ft_gguf_w_data_f32(k->gw, x, n);
}

static int st_raw(mg_sink *k, const void *data, size_t len)
{
    const char *p = data;
    while (len) {
        ssize_t w = write(k->fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            return ft_err(-e, "%s: write failed at offset %lld: %s", k->path, (long long)k->pos,
                          strerror(e));
        }
        p += w;
        len -= (size_t)w;
        k->pos += w;
    }
    return 0;
}

static int st_f32(mg_sink *k, const mg_tensor *t, const float *x, int64_t n)
{
    int64_t nb = ft_quant_bytes(t->out_type, n);
    if (nb < 0) return ft_err(FT_E_INVALID, "%s: bad element count", k->path);
    if ((size_t)nb > k->conv_cap) {
        uint8_t *c = realloc(k->conv, (size_t)nb);
        if (!c) return ft_err(-ENOMEM, "out of memory");
        k->conv = c;
        k->conv_cap = (size_t)nb;
    }
    FT_TRY(ft_gguf_from_f32(t->out_type, x, k->conv, n));
    return st_raw(k, k->conv, (size_t)nb);
}

/* ---- safetensors output ---------------------------------------------------------------- */

static int st_dtype_of(const mg_tensor *t)
{
    return t->out_type >= 0 ? ggml_to_st(t->out_type) : t->raw_st_dtype;
}

/* Writes one shard: header (compact JSON, "__metadata__" first, padded with spaces to a
 * multiple of 8, formats.md 1.1), then each tensor streamed; temp name, fsync, rename. */
static int write_shard(const char *path, const mg_src *s, const mg_tensor *v, int64_t lo,
                       int64_t hi, const ft_peft_file *a, int64_t *bytes)
{
    cJSON *h = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0;
    for (int64_t i = lo; i < hi; i++) {
        cJSON *e = cJSON_AddObjectToObject(h, v[i].out_name);
        cJSON_AddStringToObject(e, "dtype", ft_st_dtype_name(st_dtype_of(&v[i])));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < v[i].n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)v[i].shape[d]));
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        off += v[i].out_bytes;
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!js) return ft_err(-ENOMEM, "%s: out of memory", path);
    size_t jl = strlen(js), pad = (8 - jl % 8) % 8;
    char *hb = malloc(jl + pad + 8);
    if (!hb) {
        free(js);
        return ft_err(-ENOMEM, "%s: out of memory", path);
    }
    uint64_t hl = jl + pad;
    memcpy(hb, &hl, 8);
    memcpy(hb + 8, js, jl);
    memset(hb + 8 + jl, ' ', pad);
    free(js);
    char tmp[4300];
    mg_sink k = {.write = st_raw, .write_f32 = st_f32, .path = path};
    k.fd = ft_tmp_open(path, tmp, sizeof tmp);
    if (k.fd < 0) {
        free(hb);
        return k.fd;
    }
    int rc = st_raw(&k, hb, hl + 8);
    free(hb);
    for (int64_t i = lo; i < hi && !rc; i++) {
        int64_t before = k.pos;
        rc = mg_write_tensor(&k, s, &v[i], a);
        if (!rc && (uint64_t)(k.pos - before) != v[i].out_bytes)
            rc = ft_err(FT_E_INVALID, "%s: tensor \"%s\": %lld bytes written, %llu planned", path,
                        v[i].out_name, (long long)(k.pos - before), (unsigned long long)v[i].out_bytes);
    }
    free(k.conv);
    FT_TRY(ft_tmp_commit(k.fd, tmp, path, rc));
    *bytes += k.pos;
    return 0;
}

/* Removes weight files of an earlier save that the new set does not include, as
 * transformers' save_pretrained does. */
static void remove_stale(const char *dir, int n_shards)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4200];
    while ((e = readdir(d))) {
        int a, b;
        char tail[32];
        int stale = 0;
        if (sscanf(e->d_name, "model-%5d-of-%5d.safetensor%31s", &a, &b, tail) == 3 && !strcmp(tail, "s"))
            stale = n_shards == 1 || b != n_shards;
        else if (!strcmp(e->d_name, "model.safetensors"))
            stale = n_shards > 1;
        else if (!strcmp(e->d_name, "model.safetensors.index.json"))
            stale = n_shards == 1;
        if (stale && ft_path_join(p, sizeof p, dir, e->d_name) == 0) unlink(p);
    }
    closedir(d);
}

static int write_safetensors(const char *dir, const mg_src *s, const mg_tensor *v, int64_t n,
                             const ft_peft_file *a, const ft_merge_opts *o, ft_merge_report *rep)
{
    int64_t limit = o->shard_bytes > 0 ? o->shard_bytes : FT_MERGE_DEFAULT_SHARD_BYTES;
    int *shard = malloc((size_t)(n ? n : 1) * sizeof *shard);
    if (!shard) return ft_err(-ENOMEM, "out of memory");
    int ns = 0;
    uint64_t cur = 0, total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ns == 0 || (cur > 0 && cur + v[i].out_bytes > (uint64_t)limit)) {
            ns++;
            cur = 0;
        }
        shard[i] = ns - 1;
        cur += v[i].out_bytes;
        total += v[i].out_bytes;
    }
    if (ns == 0) ns = 1;
    int rc = 0;
    char name[64], path[4200];
    cJSON *idx = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(idx, "metadata");
    cJSON_AddNumberToObject(md, "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
    for (int sh = 0; sh < ns && !rc; sh++) {
        int64_t lo = 0, hi;
        while (lo < n && shard[lo] != sh) lo++;
        for (hi = lo; hi < n && shard[hi] == sh; hi++) {}
        if (ns == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", sh + 1, ns);
        rc = ft_path_join(path, sizeof path, dir, name);
        if (!rc) rc = write_shard(path, s, v, lo, hi, a, &rep->bytes_out);
        for (int64_t i = lo; i < hi; i++) cJSON_AddStringToObject(wm, v[i].out_name, name);
        rep->n_files++;
    }
    free(shard);
    if (!rc && ns > 1) {
        char *js = cJSON_Print(idx);
        rc = js ? ft_path_join(path, sizeof path, dir, "model.safetensors.index.json") : -ENOMEM;
        if (!rc) rc = ft_write_file_atomic(path, js, strlen(js));
        free(js);
    }
    cJSON_Delete(idx);
    if (!rc) remove_stale(dir, ns);
    return rc;
}

/* ---- GGUF output ----------------------------------------------------------------------- */

static uint32_t file_type_of(int t)
{
    switch (t) { /* gguf-py LlamaFileType */
    case FT_GGML_F32: return 0;
    case FT_GGML_F16: return 1;
    case FT_GGML_Q8_0: return 7;
    default: return 32; /* MOSTLY_BF16 */
    }
}

static const char *base_of(const char *p)
{
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    const char *s = p + n;
    while (s > p && s[-1] != '/') s--;
    static char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)(p + n - s), s);
    char *dot = strrchr(buf, '.');
    if (dot && !strcmp(dot, ".gguf")) *dot = 0;
    return buf;
}

static int write_gguf(const char *file, const mg_src *s, const mg_tensor *v, int64_t n,
                      const ft_peft_file *a, const ft_merge_opts *o, ft_merge_report *rep)
{
    ft_gguf_w *w;
    FT_TRY(ft_gguf_w_open(&w, file, 0));
    int rc = 0;
    uint32_t ft = file_type_of(o->dtype);
    if (s->is_gguf) {
        for (int64_t i = 0; i < ft_gguf_n_kv(s->g) && !rc; i++) {
            const ft_gguf_kv *kv = ft_gguf_kv_at(s->g, i);
            if (!strcmp(kv->key, "general.alignment") || !strcmp(kv->key, "general.file_type") ||
                !strcmp(kv->key, "general.quantization_version"))
                continue;
            rc = ft_gguf_w_kv_copy(w, kv);
        }
        if (!rc) rc = ft_gguf_w_kv_u32(w, "general.file_type", ft);
        if (!rc) rc = ft_gguf_w_kv_u32(w, "general.quantization_version", 2);
    } else {
        rc = ft_export_model_kv(w, &s->cfg, s->arch, base_of(s->path), ft);
        if (!rc) rc = ft_export_tokenizer_kv(w, s->path, &s->cfg);
    }
    float *rf = NULL;
    int64_t half = s->cfg.head_dim / 2;
    if (!rc && !s->is_gguf && s->cfg.rope_type == FT_ROPE_LLAMA3) {
        rf = malloc((size_t)half * sizeof *rf);
        if (!rf) rc = ft_err(-ENOMEM, "out of memory");
        else {
            ft_export_rope_freqs(&s->cfg, rf);
            rc = (int)ft_gguf_w_tensor(w, "rope_freqs.weight", FT_GGML_F32, 1, &half);
        }
    }
    for (int64_t i = 0; i < n && rc >= 0; i++) {
        int64_t ne[8];
        for (int d = 0; d < v[i].n_dims; d++) ne[d] = v[i].shape[v[i].n_dims - 1 - d];
        rc = (int)ft_gguf_w_tensor(w, v[i].out_name, v[i].out_type, v[i].n_dims, ne);
    }
    if (rc >= 0) rc = ft_gguf_w_begin_data(w);
    if (!rc && rf) rc = ft_gguf_w_data_f32(w, rf, half);
    for (int64_t i = 0; i < n && !rc; i++) {
        mg_sink k = {.write = gguf_raw, .write_f32 = gguf_f32, .gw = w, .path = file};
        rc = mg_write_tensor(&k, s, &v[i], a);
    }
    free(rf);
    rep->bytes_out = ft_gguf_w_bytes(w);
    if (rc < 0) {
        ft_gguf_w_abort(w);
        return rc;
    }
    rep->n_files = 1;
    return ft_gguf_w_close(w);
}

/* ---- config, tokenizer and generation files --------------------------------------------- */

/* Removes DIR/NAME if it is there: a side file of an earlier merge into the same folder
 * that this merge does not write (the source has none, or the GGUF tokenizer could not be
 * rebuilt) would otherwise be loaded with the new weights. */
static int unlink_stale(const char *dir, const char *name)
{
    char p[4200];
    FT_TRY(ft_path_join(p, sizeof p, dir, name));
    if (unlink(p) != 0 && errno != ENOENT)
        return ft_err(-errno, "%s: cannot remove the earlier merge's file: %s", p, strerror(errno));
    return 0;
}

/* Copies FROM_DIR/NAME to TO_DIR/NAME (atomically); 1 when the source has no such file, in
 * which case a stale TO_DIR/NAME is removed. */
static int copy_file(const char *from_dir, const char *to_dir, const char *name)
{
    char a[4200], b[4200];
    FT_TRY(ft_path_join(a, sizeof a, from_dir, name));
    FT_TRY(ft_path_join(b, sizeof b, to_dir, name));
    if (access(a, R_OK) != 0) {
        FT_TRY(unlink_stale(to_dir, name));
        return 1;
    }
    char *d;
    size_t n;
    FT_TRY(ft_read_file(a, &d, &n));
    int rc = ft_write_file_atomic(b, d, n);
    free(d);
    return rc;
}

/* A model folder's tokenizer files (copied from an HF source; from a GGUF source only the
 * last two are written, rebuilt from its metadata). */
static const char *const k_tok_files[] = {
    "special_tokens_map.json", "tokenizer.model", "added_tokens.json", "vocab.json",
    "merges.txt", "chat_template.jinja", "chat_template.json",
    "tokenizer.json", "tokenizer_config.json",
};
#define N_TOK_FILES (sizeof k_tok_files / sizeof k_tok_files[0])

static const char *torch_dtype(int t)
{
    return t == FT_GGML_F16 ? "float16" : t == FT_GGML_F32 ? "float32" : "bfloat16";
}

static int write_json(const char *dir, const char *name, cJSON *o)
{
    char p[4200];
    char *js = cJSON_Print(o);
    if (!js) return ft_err(-ENOMEM, "out of memory");
    int rc = ft_path_join(p, sizeof p, dir, name);
    if (!rc) rc = ft_write_file_atomic(p, js, strlen(js));
    free(js);
    return rc;
}

/* config.json from a GGUF file's metadata (transformers LlamaConfig / Qwen2Config keys). */
static cJSON *config_from_gguf(const mg_src *s, int dtype)
{
    const ft_model_config *c = &s->cfg;
    int qwen = !strcmp(s->arch, "qwen2"), qwen3 = !strcmp(s->arch, "qwen3");
    cJSON *o = cJSON_CreateObject(), *ar = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(ar, cJSON_CreateString(qwen ? "Qwen2ForCausalLM" : qwen3 ? "Qwen3ForCausalLM"
                                                                           : "LlamaForCausalLM"));
    cJSON_AddBoolToObject(o, "attention_bias", !qwen && c->attention_bias);
    if (c->bos_token_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", (double)c->bos_token_id);
    if (c->n_eos > 0) cJSON_AddNumberToObject(o, "eos_token_id", (double)c->eos_token_id[0]);
    cJSON_AddNumberToObject(o, "head_dim", (double)c->head_dim);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", (double)c->hidden_size);
    cJSON_AddNumberToObject(o, "intermediate_size", (double)c->intermediate_size);
    cJSON_AddNumberToObject(o, "max_position_embeddings", (double)c->max_position_embeddings);
    cJSON_AddStringToObject(o, "model_type", qwen ? "qwen2" : qwen3 ? "qwen3" : "llama");
    cJSON_AddNumberToObject(o, "num_attention_heads", (double)c->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", (double)c->num_hidden_layers);
    cJSON_AddNumberToObject(o, "num_key_value_heads", (double)c->num_key_value_heads);
    cJSON_AddNumberToObject(o, "rms_norm_eps", (double)c->rms_norm_eps);
    if (c->rope_type == FT_ROPE_LINEAR || c->rope_type == FT_ROPE_YARN) {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", c->rope_type == FT_ROPE_LINEAR ? "linear" : "yarn");
        cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
        if (c->rope_type == FT_ROPE_YARN && c->rope_original_max_position_embeddings)
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                    (double)c->rope_original_max_position_embeddings);
    } else {
        cJSON_AddNullToObject(o, "rope_scaling");
    }
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddStringToObject(o, "torch_dtype", torch_dtype(dtype));
    cJSON_AddBoolToObject(o, "use_cache", 1);
    cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
    return o;
}

static int write_side_files(const char *dir, const mg_src *s, const ft_merge_opts *o,
                            ft_merge_report *rep)
{
    if (!s->is_gguf) {
        char p[4200];
        char *txt;
        size_t len;
        FT_TRY(ft_path_join(p, sizeof p, s->path, "config.json"));
        FT_TRY(ft_read_file(p, &txt, &len));
        cJSON *c = cJSON_ParseWithLength(txt, len);
        free(txt);
        if (!cJSON_IsObject(c)) {
            cJSON_Delete(c);
            return ft_err(FT_E_INVALID, "%s: not a JSON object", p);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(c, "torch_dtype");
        cJSON_AddStringToObject(c, "torch_dtype", torch_dtype(o->dtype));
        if (cJSON_GetObjectItemCaseSensitive(c, "dtype")) {
            cJSON_DeleteItemFromObjectCaseSensitive(c, "dtype");
            cJSON_AddStringToObject(c, "dtype", torch_dtype(o->dtype));
        }
        cJSON_DeleteItemFromObjectCaseSensitive(c, "quantization_config");
        int rc = write_json(dir, "config.json", c);
        cJSON_Delete(c);
        FT_TRY(rc);
        for (size_t i = 0; i < N_TOK_FILES; i++) FT_TRY(copy_file(s->path, dir, k_tok_files[i]));
        FT_TRY(copy_file(s->path, dir, "generation_config.json"));
        return 0;
    }
    cJSON *c = config_from_gguf(s, o->dtype);
    int rc = write_json(dir, "config.json", c);
    cJSON_Delete(c);
    FT_TRY(rc);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddBoolToObject(g, "_from_model_config", 1);
    if (s->cfg.bos_token_id >= 0) cJSON_AddNumberToObject(g, "bos_token_id", (double)s->cfg.bos_token_id);
    if (s->cfg.n_eos > 0) cJSON_AddNumberToObject(g, "eos_token_id", (double)s->cfg.eos_token_id[0]);
    rc = write_json(dir, "generation_config.json", g);
    cJSON_Delete(g);
    FT_TRY(rc);
    /* A GGUF source gives tokenizer.json and tokenizer_config.json at most: the other
     * tokenizer files, left by an earlier merge into DIR, would override them. */
    for (size_t i = 0; i + 2 < N_TOK_FILES; i++) FT_TRY(unlink_stale(dir, k_tok_files[i]));
    char why[320]; /* + the note's text fits rep->note */
    rc = ft_hf_tok_from_gguf(dir, s->g, s->cfg.max_position_embeddings, why, sizeof why);
    FT_TRY(rc);
    if (rc == 1) {
        for (size_t i = N_TOK_FILES - 2; i < N_TOK_FILES; i++) FT_TRY(unlink_stale(dir, k_tok_files[i]));
        snprintf(rep->note, sizeof rep->note, "the source is a GGUF file: config.json and "
                 "generation_config.json were written from its metadata, but no tokenizer files "
                 "(%s); copy them from the original model", why);
    }
    return 0;
}

/* ---- driver ---------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int ft_merge_out_is_file(int format, const char *out)
{
    return format == FT_MERGE_GGUF && ends_with(out, ".gguf");
}

static int check_opts(const ft_merge_opts *o)
{
    if (o->format == FT_MERGE_SAFETENSORS) {
        if (o->dtype != FT_GGML_BF16 && o->dtype != FT_GGML_F16 && o->dtype != FT_GGML_F32)
            return ft_err(FT_E_INVALID, "merge: safetensors output is bf16, f16 or f32, not %s",
                          ft_quant_name(o->dtype));
    } else if (o->format == FT_MERGE_GGUF) {
        if (o->dtype != FT_GGML_BF16 && o->dtype != FT_GGML_F16 && o->dtype != FT_GGML_Q8_0 &&
            o->dtype != FT_GGML_F32)
            return ft_err(FT_E_INVALID, "merge: GGUF output is f16, bf16, q8_0 or f32, not %s",
                          ft_quant_name(o->dtype));
    } else {
        return ft_err(FT_E_INVALID, "merge: unknown output format %d", o->format);
    }
    return 0;
}

int ft_merge(const char *model, const char *adapter_dir, const char *out,
             const ft_merge_opts *o, ft_merge_report *rep)
{
    memset(rep, 0, sizeof *rep);
    FT_TRY(check_opts(o));
    ft_peft_file a;
    mg_src s;
    mg_tensor *v = NULL;
    int64_t n = 0;
    FT_TRY(ft_peft_open(&a, adapter_dir));
    int rc = mg_src_open(&s, model);
    if (!rc) rc = ft_peft_check_base(&a, &s.cfg, model);
    if (!rc) rc = mg_plan(&s, o, &v, &n, &rep->n_skipped);
    if (rc < 0) goto done;
    snprintf(rep->arch, sizeof rep->arch, "%s", s.arch);
    rep->scale = a.scale;
    /* every adapted projection must exist in the base, once */
    for (int64_t i = 0; i < n; i++) {
        rep->src_bytes += (int64_t)v[i].nbytes;
        if (v[i].proj >= 0 && (a.cfg.targets & (1u << v[i].proj)) && v[i].layer < a.n_layers)
            rep->n_merged++;
    }
    int n_t = 0;
    for (int p = 0; p < FT_N_PROJ; p++) n_t += (a.cfg.targets >> p) & 1;
    if (rep->n_merged != a.n_layers * n_t) {
        rc = ft_err(FT_E_INVALID, "%s: %lld of the adapter's %lld projections have a weight in the "
                    "base model", model, (long long)rep->n_merged, (long long)(a.n_layers * n_t));
        goto done;
    }
    rep->n_tensors = n;
    if (o->format == FT_MERGE_GGUF) {
        if (ft_merge_out_is_file(o->format, out)) {
            snprintf(rep->out_path, sizeof rep->out_path, "%s", out);
        } else {
            if ((rc = ft_mkdir_p(out)) < 0) goto done;
            if ((rc = ft_path_join(rep->out_path, sizeof rep->out_path, out, "model.gguf")) < 0) goto done;
        }
        rc = write_gguf(rep->out_path, &s, v, n, &a, o, rep);
    } else {
        snprintf(rep->out_path, sizeof rep->out_path, "%s", out);
        if ((rc = ft_mkdir_p(out)) < 0) goto done;
        rc = write_safetensors(out, &s, v, n, &a, o, rep);
        if (!rc) rc = write_side_files(out, &s, o, rep);
    }
done:
    free(v);
    if (s.path[0] || s.g || s.files) mg_src_close(&s);
    ft_peft_close(&a);
    return rc;
}
