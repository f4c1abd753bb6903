/* dpo_refcache.c - OUT/dpo_reference.bin (see dpo_refcache.h). */
#include "src/train/dpo_refcache.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/train/checkpoint.h"

#define MAGIC "FTDPOREF"
#define VERSION 1u
#define HEADER 104

/* The fixed-size header fields (dpo_refcache.h's layout). */
typedef struct {
    char magic[8];
    uint32_t version, zero;
    char run_id[24], eval_set[20], backend[16];
    int32_t quant;
    uint64_t model_id;
    int64_t np_train, np_eval;
} header;
_Static_assert(sizeof(header) == HEADER, "dpo_reference.bin header layout");

static void key_fields(header *h, const ft_dpo_ref_key *k)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, MAGIC, 8);
    h->version = VERSION;
    snprintf(h->run_id, sizeof h->run_id, "%s", k->run_id);
    snprintf(h->eval_set, sizeof h->eval_set, "%s", k->eval_set);
    snprintf(h->backend, sizeof h->backend, "%s", k->backend);
    h->quant = k->quant;
    h->model_id = k->model_id;
}

int ft_dpo_ref_save(const char *out_dir, const ft_dpo_ref_key *k, const double *train,
                    int64_t np_train, const double *eval, int64_t np_eval)
{
    char path[4096];
    FT_TRY(ft_path_join(path, sizeof path, out_dir, FT_DPO_REF_FILE));
    size_t nt = (size_t)(2 * np_train), ne = (size_t)(2 * np_eval);
    size_t len = HEADER + (nt + ne) * sizeof(double) + sizeof(uint64_t);
    unsigned char *buf = malloc(len);
    if (!buf) return ft_err(-ENOMEM, "%s: out of memory (%zu bytes)", path, len);
    header h;
    key_fields(&h, k);
    h.np_train = np_train;
    h.np_eval = np_eval;
    memcpy(buf, &h, HEADER);
    if (nt) memcpy(buf + HEADER, train, nt * sizeof(double));
    if (ne) memcpy(buf + HEADER + nt * sizeof(double), eval, ne * sizeof(double));
    uint64_t sum = ft_ckpt_hash(FT_CKPT_HASH_INIT, buf, len - sizeof sum);
    memcpy(buf + len - sizeof sum, &sum, sizeof sum);
    int rc = ft_write_file_atomic(path, buf, len);
    free(buf);
    return rc;
}

/* A fixed-size text field of the file for a message: up to n bytes before a NUL, each byte
 * outside printable ASCII shown as '?' (a damaged or hostile file must not put control
 * sequences on the user's terminal). */
static void show_field(char *out, const char *f, size_t n)
{
    size_t i = 0;
    for (; i < n && f[i]; i++) out[i] = f[i] >= 0x20 && f[i] < 0x7f ? f[i] : '?';
    out[i] = 0;
}

/* The index of the first non-finite double of the n at p (unaligned), or -1. */
static int64_t first_nonfinite(const char *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double v;
        memcpy(&v, p + (size_t)i * sizeof v, sizeof v);
        if (!isfinite(v)) return i;
    }
    return -1;
}

int ft_dpo_ref_load(const char *out_dir, const ft_dpo_ref_key *k, double *train, int64_t np_train,
                    double *eval, int64_t np_eval, int *got_train, int *got_eval, char *why,
                    size_t n)
{
    *got_train = *got_eval = 0;
    snprintf(why, n, "%s", "");
    char path[4096];
    if (ft_path_join(path, sizeof path, out_dir, FT_DPO_REF_FILE) < 0) return 0;
    char *data = NULL;
    size_t len = 0;
    int rc = ft_read_file(path, &data, &len);
    if (rc == -ENOMEM) return ft_err(rc, "%s: out of memory reading it", path);
    if (rc < 0) {
        if (rc != -ENOENT) snprintf(why, n, "%s", ft_errmsg());
        return 0;
    }
    header h, want;
    key_fields(&want, k);
    uint64_t sum, got;
    if (len < HEADER + sizeof sum) {
        snprintf(why, n, "%s: truncated (%zu bytes, the header alone is %d)", path, len,
                 HEADER + (int)sizeof sum);
        goto out;
    }
    memcpy(&h, data, HEADER);
    memcpy(&sum, data + len - sizeof sum, sizeof sum);
    if (memcmp(h.magic, MAGIC, 8) || h.version != VERSION || h.zero != 0) {
        snprintf(why, n, "%s: not a version %u DPO reference file (offset 0: magic, 8: version, 12: reserved 0)",
                 path, VERSION);
        goto out;
    }
    /* each count is at most len / 16, so the sum below cannot overflow */
    if (h.np_train < 0 || h.np_eval < 0 || h.np_train > (int64_t)(len / 16) ||
        h.np_eval > (int64_t)(len / 16) ||
        len != HEADER + (size_t)(2 * (h.np_train + h.np_eval)) * sizeof(double) + sizeof sum) {
        snprintf(why, n, "%s: %zu bytes, not the size its header gives (offset 88: %lld train and %lld eval pairs)",
                 path, len, (long long)h.np_train, (long long)h.np_eval);
        goto out;
    }
    if ((got = ft_ckpt_hash(FT_CKPT_HASH_INIT, data, len - sizeof sum)) != sum) {
        snprintf(why, n, "%s: checksum mismatch at offset %zu (stored %016llx, computed %016llx)",
                 path, len - sizeof sum, (unsigned long long)sum, (unsigned long long)got);
        goto out;
    }
    if (memcmp(h.run_id, want.run_id, sizeof h.run_id) || memcmp(h.backend, want.backend, sizeof h.backend) ||
        h.quant != want.quant || h.model_id != want.model_id || h.np_train != np_train) {
        char run[sizeof h.run_id + 1], be[sizeof h.backend + 1];
        show_field(run, h.run_id, sizeof h.run_id - 1);
        show_field(be, h.backend, sizeof h.backend - 1);
        snprintf(why, n, "%s: of another run, model, backend or base (run %s, model %016llx, on %s)",
                 path, run, (unsigned long long)h.model_id, be);
        goto out;
    }
    /* a reference pass gives finite sums; anything else is computed again, not trained on */
    const char *tp = data + HEADER, *ep = tp + (size_t)(2 * np_train) * sizeof(double);
    int64_t bad = first_nonfinite(tp, 2 * np_train);
    if (bad >= 0) {
        snprintf(why, n, "%s: offset %zu: train value %lld is not finite", path,
                 (size_t)HEADER + (size_t)bad * sizeof(double), (long long)bad);
        goto out;
    }
    if (np_train) memcpy(train, tp, (size_t)(2 * np_train) * sizeof(double));
    *got_train = 1;
    if (memcmp(h.eval_set, want.eval_set, sizeof h.eval_set) || h.np_eval != np_eval) {
        snprintf(why, n, "%s: its eval part is of another held-out set", path);
    } else if ((bad = first_nonfinite(ep, 2 * np_eval)) >= 0) {
        snprintf(why, n, "%s: offset %zu: eval value %lld is not finite", path,
                 (size_t)(ep - data) + (size_t)bad * sizeof(double), (long long)bad);
    } else {
        if (np_eval) memcpy(eval, ep, (size_t)(2 * np_eval) * sizeof(double));
        *got_eval = 1;
    }
out:
    free(data);
    return 0;
}
