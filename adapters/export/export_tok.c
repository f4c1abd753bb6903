/* export_tok.c - tokenizer.ggml.* metadata from a Hugging Face tokenizer.json, for merged GGUF
 * models (ft_export_tokenizer_kv in export_gguf.h). Keys and token types as llama.cpp reads
 * them (formats.md 4.3; gguf-py constants.py Keys.Tokenizer, TokenType; convert_hf_to_gguf.py
 * get_vocab_base / _set_vocab_llama_hf). Two families:
 *  - byte-level BPE ("gpt2"): tokens by id, merges "a b", token_type 1 normal, 3 control
 *    (special added tokens), 4 user-defined (other added tokens), 5 unused (ids with no token);
 *  - SentencePiece-style BPE with byte fallback ("llama"): scores, since llama.cpp merges by
 *    score: score = -rank of the first merge that yields the token (the HF merge order);
 *    token_type 6 for <0xHH> byte tokens and 2 for the unknown token.
 * The pre-tokenizer name (gpt2) and add_space_prefix (llama) are not parsed from the JSON:
 * each candidate spec is built into a tokenizer (ft_tok_from_spec, the way GGUF files are
 * read back) and must encode a probe text set exactly like tokenizer.json itself
 * (ft_tok_load_dir); the first that does is written, and if none does the export stops with
 * FT_E_UNSUPPORTED rather than write a GGUF that would tokenize differently. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/export/export_gguf.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/tokenizer/tokenizer.h"

/* Probe texts: whitespace runs, digits, contractions, CJK, emoji, Cyrillic, punctuation
 * (after llama.cpp's convert_hf_to_gguf.py chktxt), and chat-like text. */
static const char *const k_probe[] = {
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 1314151",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "\xF0\x9F\x9A\x80 (normal) \xE2\x9C\x85 \xF0\x9F\xA6\x99\xF0\x9F\xA6\x99 \xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8" "apple\xE5\xB7\xA5\xE4\xBD\x9C" "1314151\xE5\xA4\xA9\xEF\xBD\x9E",
    "------======= \xD0\xBD\xD0\xB5\xD1\x89\xD0\xBE \xD0\xBD\xD0\xB0 \xD0\x91\xD1\x8A\xD0\xBB\xD0\xB3\xD0\xB0\xD1\x80\xD1\x81\xD0\xBA\xD0\xB8 ''''''```````\"\"\"\"......!!!!!!??????",
    "  leading spaces and trailing   ",
    "def f(x):\n    return x**2  # comment\n",
    "Below is an instruction. ### Response: Sure, here is the answer.",
};

typedef struct {
    int64_t n;
    char **tokens;
    int32_t *types;
    float *scores;
    int64_t n_merges;
    char **merges;
} tok_arrays;

static void arrays_free(tok_arrays *t)
{
    for (int64_t i = 0; i < t->n; i++) free(t->tokens[i]);
    for (int64_t i = 0; i < t->n_merges; i++) free(t->merges[i]);
    free(t->tokens);
    free(t->types);
    free(t->scores);
    free(t->merges);
}

static int same_encoding(const ft_tokenizer *a, const ft_tokenizer *b, int *which)
{
    for (size_t i = 0; i < sizeof k_probe / sizeof k_probe[0]; i++) {
        int32_t *x = NULL, *y = NULL;
        int64_t nx = 0, ny = 0;
        int rc = ft_tok_encode(a, k_probe[i], strlen(k_probe[i]), 1, &x, &nx);
        if (!rc) rc = ft_tok_encode(b, k_probe[i], strlen(k_probe[i]), 1, &y, &ny);
        int same = !rc && nx == ny && (nx == 0 || !memcmp(x, y, (size_t)nx * sizeof *x));
        free(x);
        free(y);
        if (rc < 0) return rc;
        if (!same) {
            *which = (int)i;
            return 0;
        }
    }
    return 1;
}

static int64_t vocab_id(const cJSON *vocab, const char *s)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(vocab, s);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

/* Fills tokens/types/merges (and scores for SPM) from the parsed tokenizer.json. */
static int build_arrays(const cJSON *root, const char *path, int64_t vocab_size, int spm,
                        tok_arrays *t)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (!cJSON_IsObject(vocab) || (merges && !cJSON_IsArray(merges)))
        return ft_err(FT_E_INVALID, "%s: model.vocab / model.merges missing or malformed", path);
    int64_t n = vocab_size, id;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > (1 << 26))
            return ft_err(FT_E_INVALID, "%s: model.vocab[\"%s\"] is not a token id", path, it->string);
        if ((int64_t)it->valuedouble + 1 > n) n = (int64_t)it->valuedouble + 1;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *i = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (cJSON_IsNumber(i) && i->valuedouble >= 0 && i->valuedouble < (1 << 26) &&
            (int64_t)i->valuedouble + 1 > n)
            n = (int64_t)i->valuedouble + 1;
    }
    t->n = n;
    t->tokens = calloc((size_t)n, sizeof *t->tokens);
    t->types = calloc((size_t)n, sizeof *t->types);
    t->scores = spm ? calloc((size_t)n, sizeof *t->scores) : NULL;
    if (!t->tokens || !t->types || (spm && !t->scores)) return ft_err(-ENOMEM, "out of memory");
    cJSON_ArrayForEach(it, vocab) {
        id = (int64_t)it->valuedouble;
        free(t->tokens[id]);
        if (!(t->tokens[id] = strdup(it->string))) return ft_err(-ENOMEM, "out of memory");
        int byte = spm && strlen(it->string) == 6 && !strncmp(it->string, "<0x", 3) && it->string[5] == '>';
        t->types[id] = byte ? 6 : 1;
    }
    if (cJSON_IsString(unk) && (id = vocab_id(vocab, unk->valuestring)) >= 0) t->types[id] = 2;
    cJSON_ArrayForEach(it, added) {
        const cJSON *i = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "special");
        if (!cJSON_IsNumber(i) || !cJSON_IsString(c) || i->valuedouble < 0) continue;
        id = (int64_t)i->valuedouble;
        free(t->tokens[id]);
        if (!(t->tokens[id] = strdup(c->valuestring))) return ft_err(-ENOMEM, "out of memory");
        if (t->types[id] != 2) t->types[id] = cJSON_IsTrue(sp) ? 3 : 4;
    }
    for (int64_t i = 0; i < n; i++)
        if (!t->tokens[i]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i); /* convert_hf_to_gguf.py */
            if (!(t->tokens[i] = strdup(pad))) return ft_err(-ENOMEM, "out of memory");
            t->types[i] = 5;
        }
    int64_t nm = merges ? cJSON_GetArraySize(merges) : 0, k = 0;
    t->merges = calloc((size_t)(nm ? nm : 1), sizeof *t->merges);
    if (!t->merges) return ft_err(-ENOMEM, "out of memory");
    if (spm)
        for (int64_t i = 0; i < n; i++) t->scores[i] = t->types[i] == 1 ? (float)-(nm + i) : 0.0f;
    cJSON_ArrayForEach(it, merges) {
        char buf[1024];
        if (cJSON_IsString(it)) {
            snprintf(buf, sizeof buf, "%s", it->valuestring);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) && cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            snprintf(buf, sizeof buf, "%s %s", cJSON_GetArrayItem(it, 0)->valuestring,
                     cJSON_GetArrayItem(it, 1)->valuestring);
        } else {
            return ft_err(FT_E_INVALID, "%s: model.merges[%lld] is not \"a b\" or [a, b]", path, (long long)k);
        }
        if (!(t->merges[k] = strdup(buf))) return ft_err(-ENOMEM, "out of memory");
        if (spm) {
            /* the merged token: the pair with the separating space removed */
            char *sp = strchr(buf + (buf[0] ? 1 : 0), ' ');
            if (sp) {
                memmove(sp, sp + 1, strlen(sp + 1) + 1);
                id = vocab_id(vocab, buf);
                if (id >= 0 && t->types[id] == 1 && t->scores[id] < -(float)nm + 0.5f)
                    t->scores[id] = (float)-k;
            }
        }
        k++;
    }
    t->n_merges = k;
    return 0;
}

static int pad_id_of(const char *dir, const ft_tokenizer *hf, int64_t *pad)
{
    *pad = -1;
    char p[4200];
    FT_TRY(ft_path_join(p, sizeof p, dir, "tokenizer_config.json"));
    char *txt;
    size_t len;
    if (ft_read_file(p, &txt, &len) < 0) return 0; /* optional file */
    cJSON *o = cJSON_ParseWithLength(txt, len);
    free(txt);
    const cJSON *pt = o ? cJSON_GetObjectItemCaseSensitive(o, "pad_token") : NULL;
    if (cJSON_IsObject(pt)) pt = cJSON_GetObjectItemCaseSensitive(pt, "content");
    if (cJSON_IsString(pt)) *pad = ft_tok_id(hf, pt->valuestring);
    cJSON_Delete(o);
    return 0;
}

int ft_export_tokenizer_kv(ft_gguf_w *w, const char *dir, const ft_model_config *c)
{
    char path[4200];
    FT_TRY(ft_path_join(path, sizeof path, dir, "tokenizer.json"));
    ft_tokenizer *hf = NULL, *back = NULL;
    FT_TRY(ft_tok_load_dir(&hf, dir));
    char *txt = NULL;
    size_t len;
    tok_arrays t;
    memset(&t, 0, sizeof t);
    cJSON *root = NULL;
    int rc = ft_read_file(path, &txt, &len);
    if (!rc && !(root = cJSON_ParseWithLength(txt, len)))
        rc = ft_err(FT_E_INVALID, "%s: not valid JSON", path);
    free(txt);
    const cJSON *model = root ? cJSON_GetObjectItemCaseSensitive(root, "model") : NULL;
    const cJSON *ty = model ? cJSON_GetObjectItemCaseSensitive(model, "type") : NULL;
    if (!rc && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "BPE")))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: model.type is not \"BPE\"", path);
    int spm = !rc && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    if (!rc) rc = build_arrays(root, path, c->vocab_size, spm, &t);

    ft_tok_spec sp;
    memset(&sp, 0, sizeof sp);
    int64_t bos = ft_tok_bos(hf), eos = ft_tok_eos(hf), unk = -1, pad = -1;
    if (bos < 0) bos = c->bos_token_id;
    if (eos < 0 && c->n_eos > 0) eos = c->eos_token_id[0];
    for (int64_t i = 0; i < t.n; i++)
        if (t.types[i] == 2) unk = i;
    if (!rc) rc = pad_id_of(dir, hf, &pad);
    int add_bos = 0, add_eos = 0;
    if (!rc) {
        int32_t *x = NULL;
        int64_t nx = 0;
        rc = ft_tok_encode(hf, "a", 1, 1, &x, &nx);
        add_bos = !rc && nx > 0 && bos >= 0 && x[0] == bos;
        add_eos = !rc && nx > 1 && eos >= 0 && x[nx - 1] == eos;
        free(x);
    }
    sp.model = spm ? "llama" : "gpt2";
    sp.n_tokens = t.n;
    sp.tokens = (const char *const *)t.tokens;
    sp.scores = t.scores;
    sp.token_type = t.types;
    sp.n_merges = spm ? 0 : t.n_merges;
    sp.merges = (const char *const *)t.merges;
    sp.bos_id = bos;
    sp.eos_id = eos;
    sp.unk_id = unk;
    sp.pad_id = pad;
    sp.add_bos = add_bos;
    sp.add_eos = add_eos;
    sp.chat_template = ft_tok_chat_template(hf);
    static const char *const pres[] = {"llama-bpe", "qwen2", "smollm", "gpt2"};
    int n_cand = spm ? 2 : 4, found = -1, bad = 0;
    for (int k = 0; k < n_cand && !rc && found < 0; k++) {
        if (spm) sp.add_space_prefix = k == 0;
        else sp.pre = pres[k];
        ft_tok_free(back);
        back = NULL;
        if (ft_tok_from_spec(&back, &sp) < 0) continue;
        int which = 0;
        int same = same_encoding(hf, back, &which);
        if (same < 0) rc = same;
        else if (same) found = k;
        else bad = which;
    }
    if (!rc && found < 0)
        rc = ft_err(FT_E_UNSUPPORTED, "%s: no GGUF tokenizer spec (model %s%s) encodes like this "
                    "tokenizer.json (first differing probe text: #%d); the merged GGUF would "
                    "tokenize differently, so it is not written", path, sp.model,
                    spm ? ", add_space_prefix 0/1" : ", pre llama-bpe/qwen2/smollm/gpt2", bad);
    if (!rc) {
#define KV(x) do { int e_ = (x); if (e_ < 0 && !rc) rc = e_; } while (0)
        KV(ft_gguf_w_kv_str(w, "tokenizer.ggml.model", sp.model));
        if (!spm) KV(ft_gguf_w_kv_str(w, "tokenizer.ggml.pre", sp.pre));
        KV(ft_gguf_w_kv_arr_str(w, "tokenizer.ggml.tokens", sp.tokens, t.n));
        if (spm) KV(ft_gguf_w_kv_arr(w, "tokenizer.ggml.scores", FT_GGUF_F32, t.scores, t.n));
        KV(ft_gguf_w_kv_arr(w, "tokenizer.ggml.token_type", FT_GGUF_I32, t.types, t.n));
        if (!spm) KV(ft_gguf_w_kv_arr_str(w, "tokenizer.ggml.merges", sp.merges, t.n_merges));
        if (bos >= 0) KV(ft_gguf_w_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos));
        if (eos >= 0) KV(ft_gguf_w_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos));
        if (unk >= 0) KV(ft_gguf_w_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk));
        if (pad >= 0) KV(ft_gguf_w_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad));
        KV(ft_gguf_w_kv_bool(w, "tokenizer.ggml.add_bos_token", add_bos));
        KV(ft_gguf_w_kv_bool(w, "tokenizer.ggml.add_eos_token", add_eos));
        if (spm) KV(ft_gguf_w_kv_bool(w, "tokenizer.ggml.add_space_prefix", sp.add_space_prefix));
        if (sp.chat_template) KV(ft_gguf_w_kv_str(w, "tokenizer.chat_template", sp.chat_template));
#undef KV
    }
    ft_tok_free(back);
    ft_tok_free(hf);
    arrays_free(&t);
    cJSON_Delete(root);
    return rc;
}
