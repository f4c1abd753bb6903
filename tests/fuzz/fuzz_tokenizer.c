/* fuzz_tokenizer.c - libFuzzer target: HF tokenizer.json + tokenizer_config.json
 * (src/tokenizer/tok_json.c, tokenizer.c, tok_bpe.c, tok_pretok.c, tok_decode.c).
 *
 * Input: tokenizer.json, optionally followed by FUZZ_SEP and tokenizer_config.json.
 * Per input: ft_tok_load_dir on a folder holding them; on success every fixed text below is
 * encoded with and without special tokens and decoded both ways, each id must be inside
 * the vocabulary, and the lookups (ft_tok_id/str, bos/eos, chat template detection) run;
 * every prefix of the special-token text encoded through a piece memo of the whole text
 * (ft_tok_memo) must give ft_tok_encode's ids of that prefix (abort otherwise).
 * Seeds: tests/fuzz/corpus/tokenizer/ (minimized Llama-2 SentencePiece-style and Llama-3
 * byte-level tokenizers plus one per normalizer / pre-tokenizer / decoder type). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/data/dataset.h"
#include "src/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

static const char *const k_texts[] = {
    "Hello world! The quick brown fox jumps over the lazy dog 1234567 times.",
    "  leading spaces,\ttabs\nand\r\nnewlines   ",
    "<s>[INST] special <|im_start|>user\n tokens </s><|eot_id|><unk> [/INST]",
    "naïve café 東京 Привет 🦙 ﬁ ÅÅ",
    "\xff\xfe invalid \xc3 utf-8 \xe2\x82",
    "",
    "a",
    "don't I'm we'll they've 3.14159 1,000,000",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *tj, *tc;
    size_t tjn, tcn;
    int has_cfg = fuzz_split(data, size, &tj, &tjn, &tc, &tcn);
    fuzz_write("tokenizer.json", tj, tjn);
    if (has_cfg) fuzz_write("tokenizer_config.json", tc, tcn);
    else fuzz_unlink("tokenizer_config.json");

    ft_tokenizer *t = NULL;
    int rc;
    FUZZ_CALL(rc, ft_tok_load_dir(&t, fuzz_dir()));
    if (rc < 0) return 0;
    int64_t nv = ft_tok_vocab_size(t);
    for (size_t k = 0; k < sizeof k_texts / sizeof k_texts[0]; k++) {
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            int64_t n = 0;
            FUZZ_CALL(rc, ft_tok_encode(t, k_texts[k], strlen(k_texts[k]), special, &ids, &n));
            if (rc < 0) continue;
            for (int64_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= nv) {
                    fprintf(stderr, "fuzz_tokenizer: id %d outside [0, %lld)\n", ids[i],
                            (long long)nv);
                    abort();
                }
            for (int skip = 0; skip < 2; skip++) {
                char *txt = NULL;
                FUZZ_CALL(rc, ft_tok_decode(t, ids, n, skip, &txt));
                free(txt);
            }
            free(ids);
        }
    }
    /* the piece memo against plain encodes of every cut, whatever the added tokens' flags */
    ft_tok_memo *m = ft_tok_memo_new();
    const char *mt = k_texts[2];
    size_t mn = strlen(mt);
    for (size_t b = mn + 1; m && b-- > 0;) {
        int32_t *a = NULL, *c = NULL;
        int64_t na = 0, nc = 0;
        int ra, rc2;
        FUZZ_CALL(ra, ft_tok_encode_memo(t, NULL, m, mt, b, 1, &a, &na));
        FUZZ_CALL(rc2, ft_tok_encode(t, mt, b, 1, &c, &nc));
        if (ra == 0 && rc2 == 0 && (na != nc || memcmp(a, c, (size_t)na * sizeof *a))) {
            fprintf(stderr, "fuzz_tokenizer: memo ids differ for the first %zu bytes\n", b);
            abort();
        }
        free(a);
        free(c);
    }
    ft_tok_memo_free(m);
    const char *probe[] = {"<s>", "</s>", "<unk>", "<|eot_id|>", "a", ""};
    for (size_t k = 0; k < sizeof probe / sizeof probe[0]; k++) {
        int32_t id = ft_tok_id(t, probe[k]);
        if (id >= 0 && !ft_tok_str(t, id)) abort();
    }
    for (int32_t id = -1; id < 4; id++) (void)ft_tok_str(t, id);
    (void)ft_tok_str(t, (int32_t)nv);
    (void)ft_tok_bos(t);
    (void)ft_tok_eos(t);
    if (!ft_tok_bos_str(t) || !ft_tok_eos_str(t)) abort();
    (void)ft_tok_chat_template(t);
    (void)ft_chat_template_detect(t);
    ft_tok_free(t);
    return 0;
}
