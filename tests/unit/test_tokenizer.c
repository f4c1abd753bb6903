/* test_tokenizer.c - the tokenizer (src/tokenizer/tokenizer.h) on the real Llama-2 and Llama-3
 * tokenizer.json fixtures, the GGUF-style spec path, and malformed input.
 *
 * Expected ids were produced once with the Python `tokenizers` package 0.23:
 *   Tokenizer.from_file("tests/fixtures/tokenizers/<name>/tokenizer.json").encode(text).ids
 * (add_special_tokens=True). tests/ref/test_tokenizer_ref.py compares every record of the
 * example data against the same package. Run from the repository root.
 */
#include "tests/unit/harness.h"

#include <time.h>

#include <cjson/cJSON.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/tokenizer/tokenizer.h"

#define LLAMA2_DIR "tests/fixtures/tokenizers/llama2"
#define LLAMA3_DIR "tests/fixtures/tokenizers/llama3"
#define SEED_JSONL "examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl"
#define ZH_JSON "examples/data/alpaca-zh/alpaca_zh_1000.json"

typedef struct { ft_tokenizer *l2, *l3; } tok_state;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int group_setup(void **state)
{
    tok_state *s = calloc(1, sizeof *s);
    double t0 = now_s();
    int rc = ft_tok_load_dir(&s->l2, LLAMA2_DIR);
    double t1 = now_s();
    if (rc == 0) rc = ft_tok_load_dir(&s->l3, LLAMA3_DIR);
    double t2 = now_s();
    if (rc < 0) {
        fprintf(stderr, "tokenizer fixtures: %s\n", ft_errmsg());
        return -1;
    }
    printf("load time: llama2 %.3f s, llama3 %.3f s (128k vocab, 280k merges)\n", t1 - t0, t2 - t1);
    *state = s;
    return 0;
}

static int group_teardown(void **state)
{
    tok_state *s = *state;
    if (s) {
        ft_tok_free(s->l2);
        ft_tok_free(s->l3);
        free(s);
    }
    return 0;
}

static void expect_ids(const ft_tokenizer *t, const char *text, int add_special, const int32_t *exp,
                       int64_t n_exp)
{
    int32_t *ids;
    int64_t n;
    assert_int_equal(ft_tok_encode(t, text, strlen(text), add_special, &ids, &n), 0);
    int same = n == n_exp;
    for (int64_t i = 0; same && i < n; i++) same = ids[i] == exp[i];
    if (!same) {
        printf("text %s\n  got     ", text);
        for (int64_t i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n  expected");
        for (int64_t i = 0; i < n_exp; i++) printf(" %d", exp[i]);
        printf("\n");
    }
    free(ids);
    assert_true(same);
}

#define EXPECT(t, text, ...) do { \
        static const int32_t e_[] = {__VA_ARGS__}; \
        expect_ids(t, text, 1, e_, (int64_t)(sizeof e_ / sizeof e_[0])); \
    } while (0)

/* ---- known encodings ----------------------------------------------------------------------- */

static void test_llama2_known(void **state)
{
    const ft_tokenizer *t = ((tok_state *)*state)->l2;
    EXPECT(t, "Hello world", 1, 22557, 1526);
    EXPECT(t, "The quick brown fox jumps over the lazy dog.",
           1, 415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898, 3914, 28723);
    EXPECT(t, "  two  spaces\nnew line\ttab", 1, 259, 989, 28705, 10599, 13, 1095, 1407, 12, 4252);
    EXPECT(t, "I'm 42 years old; it's 3.14.",
           1, 315, 28742, 28719, 28705, 28781, 28750, 1267, 1571, 28745, 378, 28742, 28713, 28705,
           28770, 28723, 28740, 28781, 28723);
    /* special tokens written in the text; the piece after each gets its own "▁" (legacy) */
    EXPECT(t, "<s>[INST] Hi there! [/INST] Fine.</s>",
           1, 1, 733, 16289, 28793, 15359, 736, 28808, 733, 28748, 16289, 28793, 24105, 28723, 2);
    static const int32_t none[1] = {0};
    expect_ids(t, "", 0, none, 0);
}

static void test_llama3_known(void **state)
{
    const ft_tokenizer *t = ((tok_state *)*state)->l3;
    /* this Llama-3 tokenizer.json's post-processor is ByteLevel only: no BOS is added */
    EXPECT(t, "Hello world", 9906, 1917);
    EXPECT(t, "The quick brown fox jumps over the lazy dog.",
           791, 4062, 14198, 39935, 35308, 927, 279, 16053, 5679, 13);
    EXPECT(t, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
           128000, 128006, 882, 128007, 271, 13347, 0, 128009);
    EXPECT(t, "\xE4\xB8\xAD\xE6\x96\x87\xF0\xA0\x80\x8B \xF0\x9F\x98\x80 \xE2\x98\x83", /* 中文𠀋 😀 ☃ */
           108891, 172, 64319, 233, 91416, 26182, 225);
    EXPECT(t, "  two  spaces\nnew line\ttab", 220, 1403, 220, 12908, 198, 943, 1584, 59249);
    EXPECT(t, "I'm 42 years old; it's 3.14159265.",
           40, 2846, 220, 2983, 1667, 2362, 26, 433, 596, 220, 18, 13, 9335, 20128, 2397, 13);
    EXPECT(t, "DON'T WE'LL they've", 85741, 17773, 20255, 6, 4178, 814, 3077); /* (?i:'t|'ll) */
}

static void test_accessors(void **state)
{
    tok_state *s = *state;
    assert_int_equal(ft_tok_vocab_size(s->l2), 32000);
    assert_int_equal(ft_tok_bos(s->l2), 1);
    assert_int_equal(ft_tok_eos(s->l2), 2);
    assert_string_equal(ft_tok_bos_str(s->l2), "<s>");
    assert_string_equal(ft_tok_eos_str(s->l2), "</s>");
    assert_null(ft_tok_chat_template(s->l2));
    assert_int_equal(ft_tok_vocab_size(s->l3), 128256);
    assert_int_equal(ft_tok_bos(s->l3), 128000);
    assert_int_equal(ft_tok_eos(s->l3), 128001);
    assert_string_equal(ft_tok_bos_str(s->l3), "<|begin_of_text|>");
    assert_non_null(ft_tok_chat_template(s->l3));
    assert_non_null(strstr(ft_tok_chat_template(s->l3), "<|start_header_id|>"));
    assert_int_equal(ft_tok_id(s->l3, "<|eot_id|>"), 128009);
    assert_int_equal(ft_tok_id(s->l3, "Hello"), 9906);
    assert_int_equal(ft_tok_id(s->l3, "no such token at all"), -1);
    assert_string_equal(ft_tok_str(s->l3, 9906), "Hello");
    assert_string_equal(ft_tok_str(s->l2, 243), "<0xF0>");
    assert_null(ft_tok_str(s->l3, 128256));
    assert_null(ft_tok_str(s->l3, -1));
}

static void test_llama2_byte_fallback(void **state)
{
    const ft_tokenizer *t = ((tok_state *)*state)->l2;
    /* U+2000B is not a piece: its 4 UTF-8 bytes become <0xF0><0xA0><0x80><0x8B> */
    const char *text = "\xE4\xB8\xAD\xE6\x96\x87\xF0\xA0\x80\x8B \xF0\x9F\x98\x80 \xE2\x98\x83";
    EXPECT(t, text, 1, 28705, 28991, 29019, 243, 163, 131, 142, 28705, 30575, 28705, 31666);
    int32_t *ids;
    int64_t n;
    char *back;
    assert_int_equal(ft_tok_encode(t, text, strlen(text), 1, &ids, &n), 0);
    assert_int_equal(ft_tok_decode(t, ids, n, 1, &back), 0);
    assert_string_equal(back, text);
    free(back);
    /* an incomplete byte sequence decodes to U+FFFD per byte (ByteFallback decoder) */
    const int32_t partial[] = {243, 163};
    assert_int_equal(ft_tok_decode(t, partial, 2, 1, &back), 0);
    assert_string_equal(back, "\xEF\xBF\xBD\xEF\xBF\xBD");
    free(back);
    free(ids);
}

static void test_decode_roundtrip(void **state)
{
    tok_state *s = *state;
    static const char *texts[] = {
        "Hello world", "  two  spaces\nnew line\ttab\r\n", "I'm 42; it's 3.14159.",
        "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 caf\xC3\xA9", "<|eot_id|> between <|begin_of_text|>", "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        for (int which = 0; which < 2; which++) {
            const ft_tokenizer *t = which ? s->l3 : s->l2;
            if (!which && strstr(texts[i], "<|")) continue;
            int32_t *ids;
            int64_t n;
            char *back;
            assert_int_equal(ft_tok_encode(t, texts[i], strlen(texts[i]), 1, &ids, &n), 0);
            assert_int_equal(ft_tok_decode(t, ids, n, !which, &back), 0);
            if (strcmp(back, texts[i])) printf("round trip (%s): '%s' -> '%s'\n", which ? "llama3" : "llama2", texts[i], back);
            assert_string_equal(back, texts[i]);
            free(back);
            free(ids);
        }
    }
    /* skip_special drops special tokens, keeps the text */
    const int32_t ids[] = {128000, 9906, 1917, 128009};
    char *back;
    assert_int_equal(ft_tok_decode(s->l3, ids, 4, 1, &back), 0);
    assert_string_equal(back, "Hello world");
    free(back);
    assert_int_equal(ft_tok_decode(s->l3, ids, 4, 0, &back), 0);
    assert_string_equal(back, "<|begin_of_text|>Hello world<|eot_id|>");
    free(back);
}

/* ft_tok_token_bytes: each token's bytes, joined, give the text back (Llama-3's byte-level
 * tokens exactly; Llama-2's with the space its Metaspace pre-tokenizer puts before the first
 * word, which ft_tok_decode drops at the start of a text), byte-fallback pieces included;
 * a special token gives its content; ft_tok_utf8_lossy as Python's decode("utf-8", "replace"). */
static void test_token_bytes(void **state)
{
    tok_state *s = *state;
    static const char *texts[] = {
        "Hello world", "  two  spaces\nnew line\ttab", "I'm 42; it's 3.14159.",
        "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 caf\xC3\xA9",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        for (int which = 0; which < 2; which++) {
            const ft_tokenizer *t = which ? s->l3 : s->l2;
            int32_t *ids;
            int64_t n;
            assert_int_equal(ft_tok_encode(t, texts[i], strlen(texts[i]), 0, &ids, &n), 0);
            char joined[512];
            size_t k = 0;
            for (int64_t j = 0; j < n; j++) {
                char *b;
                size_t bn;
                assert_int_equal(ft_tok_token_bytes(t, ids[j], &b, &bn), 0);
                assert_true(k + bn < sizeof joined);
                memcpy(joined + k, b, bn);
                k += bn;
                free(b);
            }
            joined[k] = 0;
            char want[512];
            snprintf(want, sizeof want, "%s%s", which ? "" : " ", texts[i]);
            if (strcmp(joined, want)) printf("token bytes (%s): '%s' -> '%s'\n", which ? "llama3" : "llama2", want, joined);
            assert_string_equal(joined, want);
            free(ids);
        }
    }
    char *b;
    size_t bn;
    assert_int_equal(ft_tok_token_bytes(s->l3, 128009, &b, &bn), 0);
    assert_string_equal(b, "<|eot_id|>");
    free(b);
    assert_int_equal(ft_tok_token_bytes(s->l3, -1, &b, &bn), FT_E_INVALID);
    assert_int_equal(ft_tok_token_bytes(s->l3, 1 << 30, &b, &bn), FT_E_INVALID);
    /* a cut 4-byte character is one U+FFFD; a stray continuation byte another */
    assert_int_equal(ft_tok_utf8_lossy("a\xF0\x9F\x98" "b\x80", 6, &b, &bn), 0);
    assert_string_equal(b, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
    assert_int_equal(bn, 8);
    free(b);
}

/* Invalid UTF-8 and random bytes: no crash, ids in range, byte-level decode gives bytes back. */
static void test_random_bytes(void **state)
{
    tok_state *s = *state;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    char buf[256];
    for (int iter = 0; iter < 300; iter++) {
        size_t len = (size_t)(iter % 97);
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            buf[i] = (char)(iter % 3 ? (x & 0xFF) : (0x20 + (x % 0x60)));
        }
        for (int which = 0; which < 2; which++) {
            const ft_tokenizer *t = which ? s->l3 : s->l2;
            int32_t *ids;
            int64_t n;
            char *back;
            assert_int_equal(ft_tok_encode(t, buf, len, 1, &ids, &n), 0);
            for (int64_t i = 0; i < n; i++) assert_true(ids[i] >= 0 && ids[i] < ft_tok_vocab_size(t));
            assert_int_equal(ft_tok_decode(t, ids, n, 0, &back), 0);
            free(back);
            free(ids);
        }
    }
}

/* ---- a small hand-made tokenizer.json ----------------------------------------------------- */

static char *write_dir(const char *tok_json, const char *cfg_json)
{
    char *dir = t_tmpdir();
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    FILE *f = fopen(p, "wb");
    fputs(tok_json, f);
    fclose(f);
    if (cfg_json) {
        snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
        f = fopen(p, "wb");
        fputs(cfg_json, f);
        fclose(f);
    }
    return dir;
}

static void rm_dir(char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    rmdir(dir);
    free(dir);
}

static const char SMALL_JSON[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":5,\"content\":\"<x>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
    "{\"id\":6,\"content\":\"[M]\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,\"special\":false}],"
    "\"normalizer\":null,\"pre_tokenizer\":null,"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<x>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{\"<x>\":{\"id\":\"<x>\",\"ids\":[5],\"tokens\":[\"<x>\"]}}},"
    "\"decoder\":null,"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\",\"fuse_unk\":true,\"byte_fallback\":false,"
    "\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,\"?\":7,\" \":8},"
    "\"merges\":[[\"a\",\"b\"],[\"ab\",\"c\"]]}}";

static void test_small_json(void **state)
{
    (void)state;
    char *dir = write_dir(SMALL_JSON, "{\"bos_token\":{\"content\":\"<x>\"},\"eos_token\":null,"
                                      "\"chat_template\":[{\"name\":\"tool\",\"template\":\"T\"},{\"name\":\"default\",\"template\":\"D\"}]}");
    ft_tokenizer *t;
    assert_int_equal(ft_tok_load_dir(&t, dir), 0);
    /* a b c a b: (a,b) rank 0 twice, then (ab,c): abc ab */
    static const int32_t e1[] = {5, 4, 3};
    expect_ids(t, "abcab", 1, e1, 3);
    expect_ids(t, "abcab", 0, e1 + 1, 2);
    /* added tokens split first; [M] takes the spaces around it (lstrip/rstrip) */
    static const int32_t e2[] = {3, 5, 2, 6, 0};
    expect_ids(t, "ab<x>c  [M]  a", 0, e2, 5);
    /* unknown chars fuse into one unk */
    static const int32_t e3[] = {0, 7, 1};
    expect_ids(t, "axyzb", 0, e3, 3);
    assert_int_equal(ft_tok_bos(t), 5);
    assert_int_equal(ft_tok_eos(t), -1);
    assert_string_equal(ft_tok_eos_str(t), "");
    assert_string_equal(ft_tok_chat_template(t), "D");
    char *back;
    const int32_t ids[] = {4, 3, 5};
    assert_int_equal(ft_tok_decode(t, ids, 3, 0, &back), 0);
    assert_string_equal(back, "abc ab <x>"); /* no decoder: tokens joined by spaces */
    free(back);
    assert_int_equal(ft_tok_decode(t, ids, 3, 1, &back), 0);
    assert_string_equal(back, "abc ab");
    free(back);
    ft_tok_free(t);
    /* add_bos_token false removes the template's BOS */
    rm_dir(dir);
    dir = write_dir(SMALL_JSON, "{\"bos_token\":\"<x>\",\"add_bos_token\":false}");
    assert_int_equal(ft_tok_load_dir(&t, dir), 0);
    expect_ids(t, "abcab", 1, e1 + 1, 2);
    ft_tok_free(t);
    rm_dir(dir);
}

static void expect_token_bytes(const ft_tokenizer *t, int32_t id, const char *want, size_t want_n)
{
    char *b;
    size_t bn;
    assert_true(id >= 0);
    assert_int_equal(ft_tok_token_bytes(t, id, &b, &bn), 0);
    assert_int_equal(bn, want_n);
    assert_memory_equal(b, want, want_n);
    assert_int_equal(b[bn], 0);
    free(b);
}

static void expect_decode(const ft_tokenizer *t, const int32_t *ids, int64_t n, const char *want)
{
    char *back;
    assert_int_equal(ft_tok_decode(t, ids, n, 0, &back), 0);
    assert_string_equal(back, want);
    free(back);
}

#define MS "\xE2\x96\x81" /* U+2581, the Metaspace character */

/* Where ft_tok_token_bytes (one token in the middle of a text, raw bytes) and ft_tok_decode
 * (a whole text) part, on the same decoder chain: a byte piece of a character gives its raw
 * byte, not U+FFFD; a Metaspace token keeps the space of its replacement character; a Strip
 * after Fuse (Llama-2's Strip(' ', 1, 0)) does not strip a token, while a Strip before Fuse
 * strips each token in both. */
static void test_token_bytes_mid_text(void **state)
{
    tok_state *s = *state;
    /* Llama-2: Replace(MS -> ' '), ByteFallback, Fuse, Strip(' ', 1, 0) */
    int32_t hello = ft_tok_id(s->l2, MS "Hello");
    expect_token_bytes(s->l2, hello, " Hello", 6);
    expect_decode(s->l2, &hello, 1, "Hello");
    int32_t e4 = ft_tok_id(s->l2, "<0xE4>");
    expect_token_bytes(s->l2, e4, "\xE4", 1);
    expect_decode(s->l2, &e4, 1, "\xEF\xBF\xBD");
    /* Llama-3: ByteLevel; U+00E4 is byte 0xE4 (GPT-2 bytes_to_unicode) */
    int32_t l3_e4 = ft_tok_id(s->l3, "\xC3\xA4");
    expect_token_bytes(s->l3, l3_e4, "\xE4", 1);
    expect_decode(s->l3, &l3_e4, 1, "\xEF\xBF\xBD");

    /* Metaspace decoder (prepend_scheme "first") and a Strip on each side of Fuse */
    static const char json[] =
        "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":null,"
        "\"post_processor\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":["
        "{\"type\":\"Strip\",\"content\":\"x\",\"start\":1,\"stop\":0},"
        "{\"type\":\"Metaspace\",\"replacement\":\"" MS "\",\"prepend_scheme\":\"first\",\"split\":false},"
        "{\"type\":\"Fuse\"},"
        "{\"type\":\"Strip\",\"content\":\"b\",\"start\":0,\"stop\":1}]},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":null,\"vocab\":{\"" MS "a\":0,\"b\":1,\"x" MS "a\":2},"
        "\"merges\":[]}}";
    char *dir = write_dir(json, NULL);
    ft_tokenizer *t;
    assert_int_equal(ft_tok_load_dir(&t, dir), 0);
    expect_token_bytes(t, 0, " a", 2);  /* mid-text: the space stays */
    expect_token_bytes(t, 1, "b", 1);   /* the Strip after Fuse leaves a token alone */
    expect_token_bytes(t, 2, " a", 2);  /* the Strip before Fuse strips each token */
    const int32_t ids[] = {0, 0, 1};
    expect_decode(t, ids, 3, "a a");    /* first token's MS dropped; "a ab" loses its end 'b' */
    const int32_t ids2[] = {2, 0};
    expect_decode(t, ids2, 2, "a a");   /* 'x' stripped, then the first token's MS dropped */
    ft_tok_free(t);
    rm_dir(dir);
}

/* ---- malformed input ------------------------------------------------------------------------- */

static void expect_load_error(const char *json, int code, const char *needle)
{
    char *dir = write_dir(json, NULL);
    ft_tokenizer *t = (ft_tokenizer *)0x1;
    ft_err_clear();
    int rc = ft_tok_load_dir(&t, dir);
    if (rc != code || !strstr(ft_errmsg(), "tokenizer.json") || (needle && !strstr(ft_errmsg(), needle)))
        printf("rc %d (expected %d), message: %s\n", rc, code, ft_errmsg());
    assert_int_equal(rc, code);
    assert_null(t);
    assert_non_null(strstr(ft_errmsg(), dir));
    assert_non_null(strstr(ft_errmsg(), "tokenizer.json"));
    if (needle) assert_non_null(strstr(ft_errmsg(), needle));
    rm_dir(dir);
}

static void test_malformed(void **state)
{
    (void)state;
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merg", FT_E_INVALID, "invalid JSON at byte");
    expect_load_error("{\"version\":\"1.0\",\"added_tokens\":[]}", FT_E_INVALID, "\"model\"");
    expect_load_error("[1,2,3]", FT_E_INVALID, "top level");
    expect_load_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", FT_E_UNSUPPORTED, "Unigram");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", FT_E_INVALID, "'b'");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a a a\"]}}", FT_E_INVALID, "merges[0]");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"zero\"},\"merges\":[]}}", FT_E_INVALID, "'a'");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3},\"merges\":[]}}", FT_E_INVALID, "-3");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
                      FT_E_UNSUPPORTED, "Whitespace");
    expect_load_error("{\"normalizer\":{\"type\":\"NFKD\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
                      FT_E_UNSUPPORTED, "NFKD");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\",\"invert\":false},"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", FT_E_INVALID, "regex");

    /* every truncation of a valid file is an error, never a crash */
    size_t n = strlen(SMALL_JSON);
    int errors = 0;
    for (size_t cut = 0; cut < n; cut++) {
        char *part = strndup(SMALL_JSON, cut);
        char *dir = write_dir(part, NULL);
        ft_tokenizer *t = NULL;
        int rc = ft_tok_load_dir(&t, dir);
        errors += rc == FT_E_INVALID && t == NULL && strstr(ft_errmsg(), "tokenizer.json") != NULL;
        ft_tok_free(t);
        free(part);
        rm_dir(dir);
    }
    printf("truncated tokenizer.json: %d of %zu cut points rejected with FT_E_INVALID\n", errors, n);
    assert_int_equal(errors, (int)n);

    ft_tokenizer *t = NULL;
    int rc = ft_tok_load_dir(&t, "/nonexistent/dir");
    assert_int_equal(rc, -ENOENT);
    assert_null(t);
}

/* ---- the GGUF-style spec path ----------------------------------------------------------------- */

typedef struct { char **v; int64_t n, cap; } strvec;

static void sv_push(strvec *s, const char *x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
    }
    s->v[s->n++] = strdup(x);
}

static void sv_free(strvec *s)
{
    for (int64_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
}

static void add_record(strvec *texts, const cJSON *r)
{
    static const char *keys[] = {"instruction", "input", "output"};
    for (int k = 0; k < 3; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, keys[k]);
        if (cJSON_IsString(v)) sv_push(texts, v->valuestring);
    }
}

/* instruction/input/output of every record of both example data sets */
static void load_texts(strvec *texts)
{
    char *data;
    size_t len;
    assert_int_equal(ft_read_file(SEED_JSONL, &data, &len), 0);
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *r = cJSON_Parse(line);
        assert_non_null(r);
        add_record(texts, r);
        cJSON_Delete(r);
    }
    free(data);
    assert_int_equal(ft_read_file(ZH_JSON, &data, &len), 0);
    cJSON *arr = cJSON_Parse(data);
    assert_non_null(arr);
    for (const cJSON *r = arr->child; r; r = r->next) add_record(texts, r);
    cJSON_Delete(arr);
    free(data);
}

/* merges of a fixture's tokenizer.json ("a b" strings) */
static void load_merges(const char *dir, strvec *merges)
{
    char path[512], *data;
    size_t len;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(ft_read_file(path, &data, &len), 0);
    cJSON *root = cJSON_Parse(data);
    free(data);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "merges");
    assert_true(cJSON_IsArray(m));
    for (const cJSON *e = m->child; e; e = e->next) sv_push(merges, e->valuestring);
    cJSON_Delete(root);
}

static int64_t compare_on_texts(const ft_tokenizer *a, const ft_tokenizer *b, const strvec *texts, int add_special)
{
    int64_t diff = 0, n_ids = 0;
    for (int64_t i = 0; i < texts->n; i++) {
        int32_t *x, *y;
        int64_t nx, ny;
        assert_int_equal(ft_tok_encode(a, texts->v[i], strlen(texts->v[i]), add_special, &x, &nx), 0);
        assert_int_equal(ft_tok_encode(b, texts->v[i], strlen(texts->v[i]), add_special, &y, &ny), 0);
        int same = nx == ny && !memcmp(x, y, (size_t)nx * sizeof *x);
        if (!same && diff < 3) printf("  differs: '%.60s' (%lld vs %lld ids)\n", texts->v[i], (long long)nx, (long long)ny);
        diff += !same;
        n_ids += nx;
        free(x);
        free(y);
    }
    printf("  %lld texts, %lld ids, %lld differ\n", (long long)texts->n, (long long)n_ids, (long long)diff);
    return diff;
}

/* Llama-2 as llama.cpp stores it (model "llama"): merge priority from piece scores. The
 * tokenizer.json has no scores; its merges are ordered by SentencePiece score, so the score of
 * a piece is minus the rank of the merge producing it (pieces no merge produces: lowest). */
static void test_spec_spm_equals_llama2(void **state)
{
    const ft_tokenizer *ref = ((tok_state *)*state)->l2;
    int64_t n = ft_tok_vocab_size(ref);
    strvec merges = {0}, texts = {0};
    load_merges(LLAMA2_DIR, &merges);
    load_texts(&texts);
    const char **toks = malloc((size_t)n * sizeof *toks);
    float *scores = malloc((size_t)n * sizeof *scores);
    int32_t *types = malloc((size_t)n * sizeof *types);
    for (int64_t i = 0; i < n; i++) {
        toks[i] = ft_tok_str(ref, (int32_t)i);
        scores[i] = -1e9f;
        types[i] = i == 0 ? 2 : i <= 2 ? 3 : (!strncmp(toks[i], "<0x", 3) && strlen(toks[i]) == 6) ? 6 : 1;
    }
    for (int64_t r = merges.n - 1; r >= 0; r--) {
        char *sp = strchr(merges.v[r], ' ');
        char merged[256];
        snprintf(merged, sizeof merged, "%.*s%s", (int)(sp - merges.v[r]), merges.v[r], sp + 1);
        int32_t id = ft_tok_id(ref, merged);
        if (id >= 0) scores[id] = (float)-r;
    }
    ft_tok_spec sp = {.model = "llama", .pre = "default", .n_tokens = n, .tokens = toks, .scores = scores,
                      .token_type = types, .bos_id = 1, .eos_id = 2, .unk_id = 0, .pad_id = -1,
                      .add_bos = 1, .add_space_prefix = 1};
    ft_tokenizer *t;
    assert_int_equal(ft_tok_from_spec(&t, &sp), 0);
    assert_int_equal(ft_tok_bos(t), 1);
    assert_string_equal(ft_tok_eos_str(t), "</s>");
    printf("spec 'llama' (SPM scores) vs llama2 tokenizer.json:\n");
    int64_t diff = compare_on_texts(t, ref, &texts, 1);
    EXPECT(t, "<s>[INST] Hi there! [/INST] Fine.</s>",
           1, 1, 733, 16289, 28793, 15359, 736, 28808, 733, 28748, 16289, 28793, 24105, 28723, 2);
    char *back;
    const int32_t ids[] = {1, 28705, 28991, 29019, 243, 163, 131, 142};
    assert_int_equal(ft_tok_decode(t, ids, 8, 1, &back), 0);
    assert_string_equal(back, "\xE4\xB8\xAD\xE6\x96\x87\xF0\xA0\x80\x8B");
    free(back);
    ft_tok_free(t);
    free(toks);
    free(scores);
    free(types);
    sv_free(&merges);
    sv_free(&texts);
    assert_int_equal(diff, 0);
}

/* Llama-3 as GGUF stores it (model "gpt2", pre "llama-bpe"). */
static void test_spec_gpt2_equals_llama3(void **state)
{
    const ft_tokenizer *ref = ((tok_state *)*state)->l3;
    int64_t n = ft_tok_vocab_size(ref);
    strvec merges = {0}, texts = {0};
    load_merges(LLAMA3_DIR, &merges);
    load_texts(&texts);
    sv_push(&texts, "<|begin_of_text|>Hi<|eot_id|> 12345 DON'T");
    const char **toks = malloc((size_t)n * sizeof *toks);
    int32_t *types = malloc((size_t)n * sizeof *types);
    for (int64_t i = 0; i < n; i++) {
        toks[i] = ft_tok_str(ref, (int32_t)i);
        types[i] = i >= 128000 ? 3 : 1;
    }
    ft_tok_spec sp = {.model = "gpt2", .pre = "llama-bpe", .n_tokens = n, .tokens = toks,
                      .token_type = types, .n_merges = merges.n, .merges = (const char *const *)merges.v,
                      .bos_id = 128000, .eos_id = 128009, .unk_id = -1, .pad_id = -1, .add_bos = 1,
                      .chat_template = "{{ x }}"};
    ft_tokenizer *t;
    assert_int_equal(ft_tok_from_spec(&t, &sp), 0);
    assert_string_equal(ft_tok_chat_template(t), "{{ x }}");
    assert_string_equal(ft_tok_eos_str(t), "<|eot_id|>");
    printf("spec 'gpt2'/'llama-bpe' vs llama3 tokenizer.json:\n");
    int64_t diff = compare_on_texts(t, ref, &texts, 0);
    EXPECT(t, "Hello world", 128000, 9906, 1917); /* add_bos from the spec */
    ft_tok_free(t);

    /* unknown pre-tokenizer and model names are refused by name */
    sp.pre = "deepseek-coder";
    assert_int_equal(ft_tok_from_spec(&t, &sp), FT_E_UNSUPPORTED);
    assert_non_null(strstr(ft_errmsg(), "deepseek-coder"));
    sp.pre = "smollm";
    sp.model = "bert";
    assert_int_equal(ft_tok_from_spec(&t, &sp), FT_E_UNSUPPORTED);
    assert_non_null(strstr(ft_errmsg(), "bert"));
    sp.model = "gpt2";
    merges.v[5][0] = 0; /* an empty merge string */
    assert_int_equal(ft_tok_from_spec(&t, &sp), FT_E_INVALID);
    assert_null(t);
    free(toks);
    free(types);
    sv_free(&merges);
    sv_free(&texts);
    assert_int_equal(diff, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2_known),
        cmocka_unit_test(test_llama3_known),
        cmocka_unit_test(test_accessors),
        cmocka_unit_test(test_llama2_byte_fallback),
        cmocka_unit_test(test_decode_roundtrip),
        cmocka_unit_test(test_token_bytes),
        cmocka_unit_test(test_token_bytes_mid_text),
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_small_json),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_spec_spm_equals_llama2),
        cmocka_unit_test(test_spec_gpt2_equals_llama3),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
