/* tok_spec.c - ft_tok_from_spec: a tokenizer from GGUF-style arrays (formats.md 4.3;
 * llama.cpp tokenizer.ggml.* keys, src/llama-vocab.cpp).
 *
 *  model "gpt2": byte-level BPE; merges "a b" in rank order; `pre` selects the pre-tokenizer
 *    as the equivalent tokenizer.json would have it:
 *      smollm              Sequence[Digits(individual), ByteLevel(use_regex)] (SmolLM2's file)
 *      llama-bpe, llama3   Split(Llama-3 regex, Isolated), ByteLevel(no regex); ignore_merges
 *      qwen2               Split(Qwen2 regex, Isolated), ByteLevel(no regex); NFC
 *      gpt2, default       ByteLevel(use_regex)
 *    Characters missing from the vocabulary are dropped (no unk), as tokenizers and llama.cpp
 *    do for byte-level vocabularies.
 *  model "llama": SentencePiece-style BPE as llama.cpp llm_tokenizer_spm: spaces -> U+2581,
 *    a leading U+2581 on each text piece when add_space_prefix (like the Llama-2 legacy
 *    Prepend normalizer), merges by highest piece score, <0xHH> byte tokens.
 *  Token types 2 (unknown), 3 (control) and 4 (user-defined) become added tokens matched
 *  literally (unknown and control ones are special), as llama.cpp's special-token partition
 *  takes them (UNKNOWN | CONTROL | USER_DEFINED) and as Llama-2's tokenizer.json lists <unk>.
 *  BOS is added when add_bos and add_special, EOS at the end when add_eos and add_special (as
 *  llama.cpp's llama_tokenize does, and as export_tok.c sets add_eos_token for a tokenizer.json
 *  whose post-processor appends EOS).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/tokenizer/tok_internal.h"

#define SPEC_WHERE "tokenizer.ggml"

static int add_split(ft_tokenizer *t, const char *re)
{
    tk_pre *z = &t->pre[t->n_pre];
    memset(z, 0, sizeof *z);
    z->type = TK_PRE_SPLIT;
    z->behavior = TK_SPLIT_ISOLATED;
    FT_TRY(tk_re_compile(&z->re, re, strlen(re), 0, SPEC_WHERE ".pre"));
    t->n_pre++;
    return 0;
}

static int add_bytelevel(ft_tokenizer *t, int use_regex)
{
    tk_pre *z = &t->pre[t->n_pre];
    memset(z, 0, sizeof *z);
    z->type = TK_PRE_BYTELEVEL;
    z->use_regex = use_regex;
    if (use_regex) FT_TRY(tk_re_compile(&z->re, TK_RE_GPT2, strlen(TK_RE_GPT2), 0, SPEC_WHERE ".pre"));
    t->n_pre++;
    return 0;
}

static int gpt2_pre(ft_tokenizer *t, const char *pre)
{
    if (!pre) pre = "default";
    if (!strcmp(pre, "smollm")) {
        FT_TRY(add_split(t, "\\p{N}"));
        return add_bytelevel(t, 1);
    }
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) {
        t->ignore_merges = 1;
        FT_TRY(add_split(t, TK_RE_LLAMA3));
        return add_bytelevel(t, 0);
    }
    if (!strcmp(pre, "qwen2")) {
        t->norm[t->n_norm++].type = TK_NORM_NFC;
        FT_TRY(add_split(t, TK_RE_QWEN2));
        return add_bytelevel(t, 0);
    }
    if (!strcmp(pre, "gpt2") || !strcmp(pre, "default")) return add_bytelevel(t, 1);
    return ft_err(FT_E_UNSUPPORTED, SPEC_WHERE ".pre: pre-tokenizer '%s' is not supported "
                  "(smollm, llama-bpe, llama3, qwen2, gpt2, default)", pre);
}

static int gpt2_merges(ft_tokenizer *t, const ft_tok_spec *s)
{
    if (s->n_merges < 0 || (s->n_merges > 0 && !s->merges))
        return ft_err(FT_E_INVALID, SPEC_WHERE ".merges: missing");
    FT_TRY(tk_pairmap_init(&t->merges, s->n_merges));
    for (int64_t i = 0; i < s->n_merges; i++) {
        const char *m = s->merges[i];
        /* llama.cpp splits at the first space after the first byte */
        const char *sp = m && m[0] ? strchr(m + 1, ' ') : NULL;
        if (!sp)
            return ft_err(FT_E_INVALID, SPEC_WHERE ".merges[%lld]: expected \"a b\", found '%s'",
                          (long long)i, m ? m : "(null)");
        FT_TRY(tk_merge_add(t, m, (size_t)(sp - m), sp + 1, strlen(sp + 1), (uint32_t)i, SPEC_WHERE ".merges"));
    }
    t->dec[t->n_dec++].type = TK_DEC_BYTELEVEL;
    t->has_decoder = 1;
    return 0;
}

static int spm_setup(ft_tokenizer *t, const ft_tok_spec *s)
{
    static const char metaspace[] = "\xE2\x96\x81"; /* U+2581 */
    t->model = TK_MODEL_SPM;
    t->score = calloc((size_t)s->n_tokens, sizeof *t->score);
    if (!t->score) return -ENOMEM;
    for (int64_t i = 0; s->scores && i < s->n_tokens; i++)
        if (isnan(s->scores[i])) /* a NaN priority orders merges by chance (-inf: last) */
            return ft_err(FT_E_INVALID, SPEC_WHERE ".scores[%lld] (token '%.64s') is NaN: a "
                          "merge priority is a number", (long long)i, s->tokens[i]);
    if (s->scores) memcpy(t->score, s->scores, (size_t)s->n_tokens * sizeof *t->score);
    if (s->unk_id >= 0 && s->unk_id < s->n_tokens) t->unk_id = (int32_t)s->unk_id;
    if (s->add_space_prefix) {
        tk_norm *p = &t->norm[t->n_norm++];
        p->type = TK_NORM_PREPEND;
        p->a = (char *)metaspace;
        p->a_n = 3;
    }
    tk_norm *r = &t->norm[t->n_norm++];
    r->type = TK_NORM_REPLACE;
    r->a = (char *)" ";
    r->a_n = 1;
    r->b = (char *)metaspace;
    r->b_n = 3;
    tk_dec *d = t->dec;
    d[0] = (tk_dec){.type = TK_DEC_REPLACE, .a = (char *)metaspace, .a_n = 3, .b = (char *)" ", .b_n = 1};
    d[1] = (tk_dec){.type = TK_DEC_BYTEFALLBACK};
    d[2] = (tk_dec){.type = TK_DEC_FUSE};
    d[3] = (tk_dec){.type = TK_DEC_STRIP, .ch = ' ', .start = 1, .stop = 0};
    t->n_dec = s->add_space_prefix ? 4 : 3;
    t->has_decoder = 1;
    return 0;
}

/* A special token id of the spec: -1 (absent) or an id of its vocabulary; anything else is
 * refused, as tokenizer.json's post-processor ids are (tok_json.c): a BOS or EOS past the
 * vocabulary would vanish from every example (and with EOS gone the model never learns to
 * stop). */
static int check_special(int64_t id, int64_t n_tokens, const char *key)
{
    if (id == -1 || (id >= 0 && id < n_tokens)) return 0;
    return ft_err(FT_E_INVALID, SPEC_WHERE ".%s = %lld is no token of the vocabulary (%lld "
                  "tokens in " SPEC_WHERE ".tokens, ids 0..%lld)", key, (long long)id,
                  (long long)n_tokens, (long long)(n_tokens - 1));
}

static int build(ft_tokenizer *t, const ft_tok_spec *s)
{
    if (!s->model) return ft_err(FT_E_INVALID, SPEC_WHERE ".model: missing");
    int gpt2 = !strcmp(s->model, "gpt2"), llama = !strcmp(s->model, "llama");
    if (!gpt2 && !llama)
        return ft_err(FT_E_UNSUPPORTED, SPEC_WHERE ".model: tokenizer model '%s' is not supported (gpt2 or llama)", s->model);
    if (s->n_tokens <= 0 || s->n_tokens > TK_MAX_ID || !s->tokens)
        return ft_err(FT_E_INVALID, SPEC_WHERE ".tokens: %lld tokens (expected 1..%d)", (long long)s->n_tokens, TK_MAX_ID);
    FT_TRY(check_special(s->bos_id, s->n_tokens, "bos_token_id"));
    FT_TRY(check_special(s->eos_id, s->n_tokens, "eos_token_id"));
    FT_TRY(check_special(s->unk_id, s->n_tokens, "unknown_token_id"));
    FT_TRY(tk_vocab_init(t, s->n_tokens));
    for (int64_t i = 0; i < s->n_tokens; i++) {
        if (!s->tokens[i]) return ft_err(FT_E_INVALID, SPEC_WHERE ".tokens[%lld]: NULL", (long long)i);
        FT_TRY(tk_vocab_add(t, s->tokens[i], strlen(s->tokens[i]), i, SPEC_WHERE ".tokens"));
    }
    if (gpt2) {
        t->model = TK_MODEL_BPE;
        FT_TRY(gpt2_pre(t, s->pre));
        FT_TRY(gpt2_merges(t, s));
    } else {
        FT_TRY(spm_setup(t, s));
    }
    for (int64_t i = 0; s->token_type && i < s->n_tokens; i++) {
        int ty = s->token_type[i];
        if (ty == 2 || ty == 3 || ty == 4)
            FT_TRY(tk_added_add(t, s->tokens[i], strlen(s->tokens[i]), i, 0, 0, 0, 0, ty != 4, SPEC_WHERE ".tokens"));
    }
    if (s->bos_id >= 0 && s->bos_id < s->n_tokens) t->bos = (int32_t)s->bos_id;
    if (s->eos_id >= 0 && s->eos_id < s->n_tokens) t->eos = (int32_t)s->eos_id;
    if (s->add_bos && t->bos >= 0) {
        if (!(t->post_pre = malloc(sizeof *t->post_pre))) return -ENOMEM;
        t->post_pre[0] = t->bos;
        t->n_post_pre = 1;
    }
    if (s->add_eos && t->eos >= 0) {
        if (!(t->post_suf = malloc(sizeof *t->post_suf))) return -ENOMEM;
        t->post_suf[0] = t->eos;
        t->n_post_suf = 1;
    }
    if (s->chat_template) FT_TRY(tk_set_str(t, &t->chat_template, s->chat_template));
    return tk_finalize(t, SPEC_WHERE);
}

int ft_tok_from_spec(ft_tokenizer **out, const ft_tok_spec *spec)
{
    *out = NULL;
    if (!spec) return ft_err(FT_E_INVALID, SPEC_WHERE ": NULL spec");
    ft_tokenizer *t = tk_new();
    if (!t) return -ENOMEM;
    int rc = build(t, spec);
    if (rc < 0) {
        ft_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}
