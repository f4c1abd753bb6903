/* fuzz_dataset.c - libFuzzer target: data files through every schema and chat template
 * (src/data/records.c, dataset.c, chat.c) and the packer (src/data/batch.c).
 *
 * Input: two control bytes, then the data file (JSONL or a JSON array).
 *   byte 0: bits 0-2 --data-format (value % 6: auto, alpaca, messages, sharegpt,
 *           prompt-completion, text); bits 3-5 --chat-template (% 5: auto, llama3, chatml,
 *           llama2, alpaca); bit 6 --train-on-prompt; bit 7 --skip-bad-records.
 *   byte 1: bit 0 tokenizer (0: SentencePiece-style Llama-2 subset, 1: byte-level Llama-3
 *           subset with ChatML tokens, both in tests/fuzz/data/); bit 1 no shuffle;
 *           bits 2-3 eval fraction (0, 0.1, 0.5, 0.25); bits 4-5 seq_len (16 << k); bit 6
 *           preference records (DPO: the data format is then auto and train-on-prompt off,
 *           as the loader requires).
 * Per input: ft_dataset_load, then every train example is checked (1 <= n <= seq_len, ids
 * inside the vocabulary, labels either -100 or the id) and packed with ft_pack (2 rows);
 * each batch's targets/pos/seq_start must be consistent. Preference mode: both sets hold
 * whole pairs (an even count, each side with a trained token), packed with ft_pack_pairs,
 * whose pairs must tile each batch (chosen then rejected, in order) and name each pair once.
 * The tokenizers are loaded once from tests/fuzz/data (run from the repository root, or
 * set FTUNE_FUZZ_DATA to that folder). Seeds: tests/fuzz/corpus/dataset/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/data/dataset.h"
#include "src/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

static ft_tokenizer *g_tok[2];

static void free_toks(void)
{
    ft_tok_free(g_tok[0]);
    ft_tok_free(g_tok[1]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *base = getenv("FTUNE_FUZZ_DATA");
    if (!base) base = "tests/fuzz/data";
    static const char *const names[2] = {"tok_spm", "tok_bytelevel"};
    for (int i = 0; i < 2; i++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", base, names[i]);
        if (ft_tok_load_dir(&g_tok[i], dir) < 0) {
            fprintf(stderr, "fuzz_dataset: cannot load the tokenizer in %s: %s\n"
                    "(run from the repository root or set FTUNE_FUZZ_DATA)\n", dir, ft_errmsg());
            exit(2);
        }
    }
    atexit(free_toks);
    return 0;
}

static void check_batch(const ft_batch *b)
{
    if (b->T < 1 || b->T > b->rows * b->seq_len) abort();
    int64_t nt = 0;
    for (int64_t t = 0; t < b->T; t++) {
        int32_t s = b->seq_start[t];
        if (s < 0 || s > t || (t > 0 && s != t && s != b->seq_start[t - 1])) abort();
        if (b->pos[t] != t - s) abort();
        nt += b->targets[t] >= 0;
    }
    if (nt != b->n_targets) abort();
}

static int64_t n_trained(const ft_example *e)
{
    int64_t n = 0;
    for (int64_t k = 1; k < e->n; k++) n += e->labels[k] != FT_IGNORE_INDEX;
    return n;
}

/* ft_pack_pairs' batches: each a tiling of its pairs, every pair index < n_pairs once. */
static void check_pairs(const ft_batch *b, int64_t nb, const ft_example *ex, int64_t n_pairs)
{
    char *seen = calloc((size_t)(n_pairs ? n_pairs : 1), 1);
    if (!seen) abort();
    for (int64_t i = 0; i < nb; i++) {
        check_batch(&b[i]);
        if (b[i].n_pairs < 1 || !b[i].pairs) abort();
        int64_t off = 0;
        for (int64_t k = 0; k < b[i].n_pairs; k++) {
            const int64_t *r = b[i].pairs + k * FT_PAIR_FIELDS;
            int64_t p = r[FT_PAIR_INDEX];
            if (p < 0 || p >= n_pairs || seen[p]) abort();
            seen[p] = 1;
            if (r[FT_PAIR_CHOSEN_START] != off || r[FT_PAIR_CHOSEN_LEN] != ex[2 * p].n) abort();
            off += r[FT_PAIR_CHOSEN_LEN];
            if (r[FT_PAIR_REJECTED_START] != off || r[FT_PAIR_REJECTED_LEN] != ex[2 * p + 1].n) abort();
            off += r[FT_PAIR_REJECTED_LEN];
        }
        if (off != b[i].T) abort();
    }
    for (int64_t p = 0; p < n_pairs; p++)
        if (!seen[p]) abort();
    free(seen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    static const double k_eval[4] = {0, 0.1, 0.5, 0.25};
    ft_data_cfg cfg = {
        .format = (data[0] & 7) % 6,
        .chat_template = ((data[0] >> 3) & 7) % 5,
        .train_on_prompt = (data[0] >> 6) & 1,
        .skip_bad_records = (data[0] >> 7) & 1,
        .no_shuffle = (data[1] >> 1) & 1,
        .eval_fraction = k_eval[(data[1] >> 2) & 3],
        .seq_len = (int64_t)16 << ((data[1] >> 4) & 3),
        .seed = 42,
        .preference = (data[1] >> 6) & 1,
    };
    if (cfg.preference) {
        cfg.format = FT_DATA_AUTO;
        cfg.train_on_prompt = 0;
    }
    const ft_tokenizer *tok = g_tok[data[1] & 1];
    fuzz_write("data.jsonl", data + 2, size - 2);
    char path[512];
    fuzz_path(path, sizeof path, "data.jsonl");

    ft_dataset ds;
    int rc;
    FUZZ_CALL(rc, ft_dataset_load(&ds, path, &cfg, tok));
    if (rc < 0) return 0;
    int64_t nv = ft_tok_vocab_size(tok);
    for (int part = 0; part < 2; part++) {
        const ft_example *ex = part ? ds.eval : ds.train;
        int64_t n = part ? ds.n_eval : ds.n_train;
        if (cfg.preference && n % 2) abort();
        for (int64_t i = 0; i < n; i++) {
            if (ex[i].n < 1 || ex[i].n > cfg.seq_len) abort();
            if (cfg.preference && n_trained(&ex[i]) < 1) abort();
            for (int64_t k = 0; k < ex[i].n; k++) {
                if (ex[i].ids[k] < 0 || ex[i].ids[k] >= nv) abort();
                if (ex[i].labels[k] != FT_IGNORE_INDEX && ex[i].labels[k] != ex[i].ids[k]) abort();
            }
        }
    }
    ft_batch *b = NULL;
    int64_t nb = 0;
    if (cfg.preference) {
        FUZZ_CALL(rc, ft_batch_pack_pairs(&b, &nb, ds.train, ds.n_train / 2, cfg.seq_len, 1, 7));
        if (rc == 0) {
            check_pairs(b, nb, ds.train, ds.n_train / 2);
            ft_batches_free(b, nb);
        }
        ft_dataset_free(&ds);
        return 0;
    }
    FUZZ_CALL(rc, ft_batch_pack(&b, &nb, ds.train, ds.n_train, cfg.seq_len, 2, 7));
    if (rc == 0) {
        for (int64_t i = 0; i < nb; i++) check_batch(&b[i]);
        ft_batches_free(b, nb);
    }
    ft_dataset_free(&ds);
    return 0;
}
