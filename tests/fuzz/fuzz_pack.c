/* fuzz_pack.c - libFuzzer target: the pack file (offload/pack.c), as `ftune train --quant
 * nf4` and `ftune pack` open a cached pack and the executor reads its layers.
 *
 * Input: a whole pack file. Before writing it, the target repairs the checksums a mutation
 * breaks, so that inputs get past them to the parsing behind: each block's xxh64 in the
 * block table (for every entry whose offset and size lie inside the input) and then the
 * header checksum over [0, header_bytes) with `complete` and `header_sum` read as 0 (pack.h).
 * What stays mutated is everything the checksums cannot vouch for: header fields, the stored
 * config.json, the block table, tensor records, NF4 quant state, the complete flag, the size.
 * (Checksum failures themselves are covered by tests/unit/test_pack.c.)
 * Per input: ft_pack_open(verify = 1), and when it refuses the file ft_pack_open_partial (the
 * probe pack of `ftune plan`: the first layer blocks only, FT_PACK_PARTIAL); when either
 * succeeds, every block is read with its checksum checked, its tensor directory validated
 * (ft_pack_block_dir), and each layer turned into fp32 weights (ft_pack_layer_weights: NF4
 * dequantization, bf16 widening), which must either succeed or fail with a message; in a
 * partial pack the blocks it lacks and the global block must be refused. A layer larger than
 * FUZZ_MAX_ELEMS floats is skipped.
 * Seeds (tests/fuzz/corpus/pack/): packs of 1- and 2-layer models written by `ftune
 * init-model --pack` (NF4 and BF16; tied/untied head, attention biases, qwen2), a pack of a
 * bitsandbytes-style checkpoint with fp32 absmax (nested_blocksize 0), damaged copies, and
 * partial packs (layer_limit 1) of a 2-layer model with biases, NF4 and BF16. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "offload/pack.h"
#include "src/model/model.h"
#include "tests/fuzz/fuzz_util.h"

/* Recomputes the block checksums and the header checksum of a pack image in place. */
static void fix_checksums(uint8_t *d, size_t size)
{
    ft_pack_hdr h;
    if (size < sizeof h) return;
    memcpy(&h, d, sizeof h);
    if ((uint64_t)h.header_bytes > size || h.header_bytes < sizeof h) return;
    if (h.block_table_off >= (int64_t)sizeof h && h.n_blocks <= 4096 &&
        (uint64_t)h.block_table_off + (uint64_t)h.n_blocks * sizeof(ft_pack_block) <= h.header_bytes) {
        for (uint32_t i = 0; i < h.n_blocks; i++) {
            ft_pack_block b;
            uint8_t *e = d + h.block_table_off + (size_t)i * sizeof b;
            memcpy(&b, e, sizeof b);
            if (b.offset > size || b.bytes > size - b.offset) continue;
            b.checksum = ft_xxh64(d + b.offset, (size_t)b.bytes, 0);
            memcpy(e, &b, sizeof b);
        }
    }
    uint32_t complete = h.complete;
    h.complete = 0;
    h.header_sum = 0;
    memcpy(d, &h, sizeof h);
    h.header_sum = (uint32_t)ft_xxh64(d, h.header_bytes, 0);
    h.complete = complete;
    memcpy(d, &h, sizeof h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *img = malloc(size ? size : 1);
    if (!img) abort();
    memcpy(img, data, size);
    fix_checksums(img, size);
    fuzz_write("model.ftpack", img, size);
    free(img);
    char path[512];
    fuzz_path(path, sizeof path, "model.ftpack");

    ft_pack_file *p = NULL;
    int rc, partial = 0;
    FUZZ_CALL(rc, ft_pack_open(&p, path, 1));
    if (rc < 0) {
        FUZZ_CALL(rc, ft_pack_open_partial(&p, path));
        partial = 1;
    }
    if (rc < 0) return 0;
    const ft_pack_hdr *h = ft_pack_header(p);
    const ft_model_config *cfg = ft_pack_config(p);
    int64_t L = (int64_t)h->n_layers;
    int64_t held = partial ? (int64_t)h->n_blocks : L; /* the layer blocks in the file */
    if (partial && (held < 1 || held > L || ft_pack_block_bytes(p, -1) != 0)) {
        fprintf(stderr, "fuzz_pack: partial pack of %lld of %lld layers (global block %zu "
                "bytes) accepted\n", (long long)held, (long long)L, ft_pack_block_bytes(p, -1));
        abort();
    }
    int64_t floats = ft_pack_layer_floats(cfg);
    size_t maxb = ft_pack_block_bytes(p, -1);
    if (ft_pack_max_layer_bytes(p) > maxb) maxb = ft_pack_max_layer_bytes(p);
    if (maxb == 0 || maxb > size) { /* open() checked every block lies inside the file */
        fprintf(stderr, "fuzz_pack: block of %zu bytes in a %zu-byte file accepted\n", maxb, size);
        abort();
    }
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, maxb)) abort();
    float *w32 = floats > 0 && floats <= FUZZ_MAX_ELEMS ? malloc((size_t)floats * sizeof(float)) : NULL;
    for (int64_t l = -1; l < L; l++) {
        FUZZ_CALL(rc, ft_pack_read_block(p, l, buf, maxb, 1));
        if (partial && (l < 0 || l >= held)) {
            if (rc == 0) {
                fprintf(stderr, "fuzz_pack: block %lld of a partial pack of %lld layers read\n",
                        (long long)l, (long long)held);
                abort();
            }
            continue;
        }
        if (rc < 0) continue;
        const ft_pack_tensor *dir;
        int64_t n;
        FUZZ_CALL(rc, ft_pack_block_dir(p, l, buf, &dir, &n));
        if (rc < 0 || l < 0 || !w32) continue;
        ft_layer_weights w;
        FUZZ_CALL(rc, ft_pack_layer_weights(p, l, buf, w32, &w));
    }
    free(w32);
    free(buf);
    ft_pack_close(p);
    return 0;
}
