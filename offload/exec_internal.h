/* exec_internal.h - shared by the executor's files (exec.c: sizing and the weights' fetch;
 * exec_step.c: the schedule; resident.c: where the base weights live on a device backend;
 * tiers.c: streamed tiers). Not a public interface. */
#ifndef FT_EXEC_INTERNAL_H
#define FT_EXEC_INTERNAL_H

#include "offload/exec_impl.h"
#include "src/core/align.h"

/* The block dims of a micro-batch of T rows of model m, activations sized for rank r. */
static inline ft_block_dims ft_exec_dims_for(const ft_model *m, int64_t r, int64_t T)
{
    const ft_model_config *c = &m->cfg;
    ft_block_dims d = {T, c->hidden_size, c->num_attention_heads, c->num_key_value_heads,
                       c->head_dim, c->intermediate_size, r};
    return d;
}

/* ... of executor e (its r_max). */
static inline ft_block_dims ft_exec_dims(const ft_exec *e, int64_t T)
{
    return ft_exec_dims_for(e->m, e->r_max, T);
}

/* Points e at the base weights (resident.c): in place on a host-memory backend; on a device
 * backend one allocation with the embeddings, final norm and LM head in fp32 and, when
 * with_layers, every layer (projections in bf16 where the backend takes it). */
int ft_exec_place_weights(ft_exec *e, int with_layers);
/* The base weights of layer l, ready for compute (exec.c): the model's resident arrays, or
 * the layer's pack block read and dequantized (host), bound in its tier (device); counted in
 * e->layer_fetches. */
int ft_exec_fetch_layer(ft_exec *e, int64_t l, const ft_layer_weights **w);

/* Device backends: makes every layer block of the pack resident in device memory (read and
 * checksummed once) and replaces the copied layer weights by it; fetches then dequantize a
 * layer's NF4 projections to bf16 in one staging buffer (resident.c). */
int ft_exec_pack_to_device(ft_exec *e, ft_pack_file *pack);
int ft_exec_fetch_device(ft_exec *e, int64_t l, const ft_layer_weights **w);
/* An operation starts (tiers.c): a forward over layers 0..L-1, then with train = 1 the
 * backward over L-1..0; streamed blocks are prefetched in that order, and with a timeline
 * its origin is taken here. */
int ft_exec_begin_op(ft_exec *e, int train);
/* The operation's work is all queued: resolves its timeline marks (tiers.c). */
int ft_exec_op_end(ft_exec *e);
/* Pack-only models on a device backend: the embeddings of micro-batch mb gathered on the host
 * from the pack into ckpt (device). */
int ft_exec_embed_from_pack(ft_exec *e, const int32_t *ids, int64_t T, float *out);
/* Frees e (ft_exec_free: what it holds, e zeroed) after a failure rc, keeping the failure's
 * message (a device backend's free may record errors of its own). Returns rc. */
int ft_exec_free_keeping_err(ft_exec *e, int rc);
/* Timeline marks around queued work (no-ops without a timeline): begin returns a mark id
 * (-1 when not recording), end closes it. */
int ft_exec_tl_begin(ft_exec *e, int lane, int kind, int64_t layer);
void ft_exec_tl_end(ft_exec *e, int mark);
/* Pack-only models (no host weights): the global tensors from the pack (tiers.c); on a
 * host-memory backend with lm_head_logits_bf16 the embeddings and LM head in bf16 (exec.h
 * globals_lazy). */
int ft_exec_globals_from_pack(ft_exec *e, ft_pack_file *pack);
/* The fp32 embeddings and LM head for the readers that take them (training and eval heads,
 * logits, the embedding gather, a generation head of many rows): with globals_lazy and no fp32
 * tables yet, frees the bf16 copy and reads them from e->pack (tiers.c); else nothing.
 * Returns 0, -ENOMEM or a pack read error (then still without them: a later call retries). */
int ft_exec_globals_f32(ft_exec *e);
/* Bytes of the bf16 staging one layer's projections are dequantized into on backend be
 * (tiers.c; the projections the fused NF4 GEMM takes need none). */
size_t ft_exec_staging_bytes(const ft_model *m, const ft_pack_file *pack, int nf4_fused);
/* Frees what tiers.c allocated. */
void ft_exec_tiers_free(ft_exec *e);

#endif
