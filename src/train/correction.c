/* correction.c - the quantized base's correction of a training run (see correction.h). */
#include "src/train/correction.h"

#include <stdlib.h>
#include <string.h>

#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"

typedef struct pack_base {
    ft_pack_file *p;
    void *buf;
    size_t buf_bytes;
    float *dst;
} pack_base;

/* ft_qcorr_base_fn over a pack: reads and dequantizes layer l. */
static int base_from_pack(void *ctx, int64_t l, ft_layer_weights *w)
{
    pack_base *b = ctx;
    FT_TRY(ft_pack_read_block(b->p, l, b->buf, b->buf_bytes, 1));
    return ft_pack_layer_weights(b->p, l, b->buf, b->dst, w);
}

int ft_correction_compute(ft_lora *l, const ft_model *m, ft_pack_file *pack, const ft_batch *b,
                          int64_t n_b, const ft_qcorr_cfg *c, const char *out_dir,
                          const char *base_name, ft_qcorr_stats *st)
{
    pack_base pb = {pack, NULL, 0, NULL};
    pb.buf_bytes = (ft_pack_max_layer_bytes(pack) + 4095) / 4096 * 4096;
    size_t dst_bytes = ((size_t)ft_pack_layer_floats(&m->cfg) * sizeof(float) + 63) / 64 * 64;
    pb.buf = aligned_alloc(4096, pb.buf_bytes);
    pb.dst = aligned_alloc(64, dst_bytes);
    float *vals = malloc((size_t)l->n_params * sizeof(float));
    int rc = 0;
    if (!pb.buf || !pb.dst || !vals)
        rc = ft_err(-ENOMEM, "out of memory for the base correction (%zu + %zu bytes)", pb.buf_bytes, dst_bytes);
    if (!rc) rc = ft_qcorr_compute(m, l, base_from_pack, &pb, b, n_b, c, vals, st);
    free(pb.buf);
    free(pb.dst);
    if (!rc) rc = ft_lora_set_fixed(l, vals);
    char dir[4200];
    if (!rc) rc = ft_path_join(dir, sizeof dir, out_dir, FT_QCORR_DIR);
    if (!rc) rc = ft_peft_save_values(dir, l, vals, base_name);
    free(vals);
    return rc;
}
