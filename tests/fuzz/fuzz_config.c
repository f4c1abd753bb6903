/* fuzz_config.c - libFuzzer target: HF config.json (src/formats/config.c).
 *
 * Input: the text of a config.json. Per input: ft_config_parse on an exact-size copy (no
 * NUL terminator, so ASan sees any read past `len`), then ft_config_load on the same bytes
 * written to a file (the CLI's path); both must agree. On success the RoPE inverse
 * frequencies are computed for two sequence lengths (every scaling type's code runs).
 * Seeds: tests/fuzz/corpus/config/. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/formats/config.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    ft_model_config a, b;
    int rc_a, rc_b;
    FUZZ_CALL(rc_a, ft_config_parse(&a, copy, size, "config.json"));
    free(copy);

    fuzz_write("config.json", data, size);
    char path[512];
    fuzz_path(path, sizeof path, "config.json");
    FUZZ_CALL(rc_b, ft_config_load(&b, path));
    /* Same bytes, same length: the two entry points must agree. */
    if (rc_a != rc_b) {
        fprintf(stderr, "fuzz_config: parse gave %d, load gave %d (%s)\n", rc_a, rc_b,
                ft_errmsg());
        abort();
    }
    if (rc_a == 0 && a.head_dim <= 65536) {
        int64_t half = a.head_dim / 2;
        float *inv = malloc((size_t)half * sizeof *inv);
        if (!inv) return 0;
        int64_t lens[2] = {a.max_position_embeddings, 2 * a.max_position_embeddings + 1};
        for (int k = 0; k < 2; k++) {
            ft_rope_inv_freq(&a, lens[k], inv);
            volatile float sink = 0;
            for (int64_t i = 0; i < half; i++) sink += inv[i];
            (void)sink;
        }
        free(inv);
    }
    return 0;
}
