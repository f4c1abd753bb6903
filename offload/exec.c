/* exec.c - the per-layer executor (see exec.h). Checkpoints are addressed through ck_*()
 * below: in the arena by default ((L + 1) * n_micro buffers), or through the host tier
 * (offload/actckpt.h) when e->ckt is set. */
#include "offload/exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/actckpt.h"
#include "offload/exec_internal.h"
#include "offload/timeline.h"
#include "src/core/err.h"
#include "src/numeric/quant.h"

static ft_block_dims dims_of(const ft_exec *e, int64_t T)
{
    const ft_model_config *c = &e->m->cfg;
    ft_block_dims d = {T, c->hidden_size, c->num_attention_heads, c->num_key_value_heads,
                       c->head_dim, c->intermediate_size, e->lora ? e->lora->cfg.r : 1};
    return d;
}

/* Floats of every region, in carving order. */
typedef struct { int64_t ckpt, dx, acts, scr, xf, rstdf, dxf, ce, inv, ints; } layout;

/* ckpt_bufs: device checkpoint buffers of T * C floats; < 0: all (L + 1) * n_micro. */
static layout plan(const ft_model *m, const ft_lora *lora, int64_t T, int64_t n_micro,
                   int64_t chunk, int64_t ckpt_bufs)
{
    const ft_model_config *c = &m->cfg;
    ft_block_dims d = {T, c->hidden_size, c->num_attention_heads, c->num_key_value_heads,
                       c->head_dim, c->intermediate_size, lora ? lora->cfg.r : 1};
    layout L;
    if (ckpt_bufs < 0) ckpt_bufs = (c->num_hidden_layers + 1) * n_micro;
    L.ckpt = ckpt_bufs * T * c->hidden_size;
    /* one d(hidden) per micro-batch, each on 64 bytes (dx_stride): it is the dy of the down and
     * o projections' input gradients, which CUDA rounds to bf16 with float4 reads */
    L.dx = n_micro * ft_pad16(T * c->hidden_size);
    L.acts = ft_block_acts_floats(&d);
    L.scr = ft_block_scratch_floats(&d);
    L.xf = T * c->hidden_size;
    L.rstdf = T;
    L.dxf = T * c->hidden_size;
    L.ce = chunk * c->vocab_size;
    L.inv = c->head_dim / 2 + 1;
    L.ints = 4 * n_micro * T; /* int32 arrays stored in float-sized slots */
    return L;
}

static int64_t total(const layout *L)
{
    int64_t t = L->ckpt + L->dx + L->acts + L->scr + L->xf + L->rstdf + L->dxf + L->ce +
                L->inv + L->ints;
    return t + 16 * 11; /* 64-byte alignment slack per region */
}

/* LM-head rows per chunk: small on the CPU (the chunk's logits stay in cache), large on a
 * GPU (a (chunk, V) GEMM needs many rows to fill the tensor cores; 1024 x 128256 fp32 is
 * 0.5 GB of scratch). */
static int64_t ce_chunk_for(const ft_backend *be, int64_t T_max)
{
    int64_t c = be->ops->host_memory ? 64 : 1024;
    return c < T_max ? c : T_max;
}

size_t ft_exec_bytes(const ft_backend *be, const ft_model *m, const ft_lora *lora, int64_t T_max,
                     int64_t n_micro)
{
    layout L = plan(m, lora, T_max, n_micro, ce_chunk_for(be, T_max), -1);
    return (size_t)total(&L) * sizeof(float) + (be->ops->host_memory ? 0 : ft_exec_weight_bytes(be, m));
}

int ft_exec_init(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora, int64_t T_max,
                 int64_t n_micro, int64_t rope_seq_len)
{
    return ft_exec_init_ex(e, be, m, lora, T_max, n_micro, rope_seq_len, 1);
}

/* Allocates the arena with ckpt_bufs checkpoint buffers (< 0: all) and carves it. */
static int carve_arena(ft_exec *e, int64_t ckpt_bufs)
{
    ft_backend *be = e->be;
    int64_t T_max = e->T_max, n_micro = e->n_micro_max;
    layout L = plan(e->m, e->lora, T_max, n_micro, e->ce_chunk, ckpt_bufs);
    e->arena_bytes = (size_t)total(&L) * sizeof(float);
    e->arena = be->ops->alloc(be, e->arena_bytes);
    if (!e->arena)
        return ft_err(-ENOMEM, "out of memory: the executor needs %.1f MiB for %lld micro-batches "
                      "of %lld tokens (try a smaller --batch-size, --seq-len or --grad-accum)",
                      e->arena_bytes / 1048576.0, (long long)n_micro, (long long)T_max);
    float *p = e->arena;
    e->ckpt = ft_carve16(&p, L.ckpt);
    e->dx = ft_carve16(&p, L.dx);
    ft_block_dims d = dims_of(e, T_max);
    ft_block_acts_carve(&e->acts, ft_carve16(&p, L.acts), &d, e->lora ? e->lora->cfg.targets : 0);
    ft_block_scratch_carve(&e->scr, ft_carve16(&p, L.scr), &d);
    e->xf = ft_carve16(&p, L.xf);
    e->rstdf = ft_carve16(&p, L.rstdf);
    e->dxf = ft_carve16(&p, L.dxf);
    e->ce_scratch = ft_carve16(&p, L.ce);
    e->inv_freq = ft_carve16(&p, L.inv);
    int32_t *ip = (int32_t *)ft_carve16(&p, L.ints);
    e->ids = ip;
    e->targets = ip + n_micro * T_max;
    e->pos = ip + 2 * n_micro * T_max;
    e->seq_start = ip + 3 * n_micro * T_max;
    return 0;
}

static int init_impl(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora, int64_t T_max,
                     int64_t n_micro, int64_t rope_seq_len, int place_layers, int64_t ckpt_bufs);

int ft_exec_free_keeping_err(ft_exec *e, int rc)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ft_errmsg());
    ft_exec_free(e);
    return ft_err(rc, "%s", msg);
}

int ft_exec_init_ex(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora, int64_t T_max,
                    int64_t n_micro, int64_t rope_seq_len, int place_layers)
{
    int rc = init_impl(e, be, m, lora, T_max, n_micro, rope_seq_len, place_layers, -1);
    return rc < 0 ? ft_exec_free_keeping_err(e, rc) : rc; /* a failed init frees its own */
}

int ft_exec_init_ckpt_host(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora,
                           int64_t T_max, int64_t n_micro, int64_t rope_seq_len, int place_layers,
                           int64_t dev_layers, int n_sets)
{
    memset(e, 0, sizeof *e);
    FT_TRY(ft_ckpt_tier_check(m->cfg.num_hidden_layers, dev_layers, n_sets));
    int rc = init_impl(e, be, m, lora, T_max, n_micro, rope_seq_len, place_layers,
                       ft_ckpt_tier_dev_buffers(n_micro, dev_layers, n_sets));
    if (!rc) rc = ft_ckpt_tier_init(e, dev_layers, n_sets);
    return rc < 0 ? ft_exec_free_keeping_err(e, rc) : rc;
}

int ft_exec_ckpt_to_host(ft_exec *e, int64_t dev_layers, int n_sets)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    if (e->ckt)
        return ft_err(FT_E_INVALID, "ft_exec_ckpt_to_host: the checkpoints are in host memory already");
    FT_TRY(ft_ckpt_tier_check(c->num_hidden_layers, dev_layers, n_sets));
    float inv[1024]; /* the one arena content set at init (head_dim / 2 <= 1024 there) */
    size_t inv_bytes = (size_t)(c->head_dim / 2) * sizeof(float);
    FT_TRY(be->ops->copy(be, inv, e->inv_freq, inv_bytes));
    be->ops->free(be, e->arena); /* first, so that the device never holds both */
    e->arena = NULL;
    FT_TRY(carve_arena(e, ft_ckpt_tier_dev_buffers(e->n_micro_max, dev_layers, n_sets)));
    FT_TRY(be->ops->copy(be, e->inv_freq, inv, inv_bytes));
    return ft_ckpt_tier_init(e, dev_layers, n_sets);
}

static int init_impl(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora, int64_t T_max,
                     int64_t n_micro, int64_t rope_seq_len, int place_layers, int64_t ckpt_bufs)
{
    memset(e, 0, sizeof *e);
    if (T_max < 1 || n_micro < 1)
        return ft_err(FT_E_INVALID, "executor: bad sizes T=%lld micro-batches=%lld",
                      (long long)T_max, (long long)n_micro);
    e->be = be;
    e->nf4_fused = ft_exec_nf4_gemm_mode(be) == FT_NF4_GEMM_FUSED;
    e->m = m;
    e->lora = lora;
    e->T_max = T_max;
    e->n_micro_max = n_micro;
    e->ce_chunk = ce_chunk_for(be, T_max);
    FT_TRY(carve_arena(e, ckpt_bufs));

    float inv[1024];
    if (m->cfg.head_dim / 2 > 1024)
        return ft_err(FT_E_UNSUPPORTED, "head_dim %lld too large", (long long)m->cfg.head_dim);
    ft_rope_inv_freq(&m->cfg, rope_seq_len, inv);
    FT_TRY(be->ops->copy(be, e->inv_freq, inv, (size_t)(m->cfg.head_dim / 2) * sizeof(float)));
    if (be->ops->prepare)
        FT_TRY(be->ops->prepare(be, T_max, m->cfg.num_attention_heads, m->cfg.num_key_value_heads,
                                m->cfg.head_dim));
    return ft_exec_place_weights(e, place_layers);
}

void ft_exec_free(ft_exec *e)
{
    if (e && e->be) {
        e->be->ops->free(e->be, e->arena);
        e->be->ops->free(e->be, e->layer_f32);
        e->be->ops->free(e->be, e->weights);
        e->be->ops->free(e->be, e->globals_bf16);
        e->be->ops->free(e->be, e->globals_f32);
        e->be->ops->free(e->be, e->pack_dev);
        for (int64_t l = 0; e->pack_dir && l < e->m->cfg.num_hidden_layers; l++) free(e->pack_dir[l]);
        free(e->pack_dir);
        free(e->pack_dir_n);
        free(e->pack_dev_off);
        e->be->ops->free(e->be, e->kept_mem);
        ft_exec_tiers_free(e);
        ft_ckpt_tier_free(e);
        free(e->kept);
        if (e->layers && e->layers != e->m->layers) free(e->layers);
    }
    if (e) {
        free(e->pack_raw);
        free(e->pack_host);
        free(e->seq_buf);
    }
    if (e) memset(e, 0, sizeof *e);
}

size_t ft_exec_kept_bytes(const ft_exec *e)
{
    ft_block_dims d = dims_of(e, e->T_max);
    int64_t per = ft_pad16(ft_block_acts_floats(&d));
    return (size_t)(per * e->m->cfg.num_hidden_layers * e->n_micro_max) * sizeof(float);
}

int ft_exec_keep_activations(ft_exec *e, size_t budget_bytes)
{
    size_t need = ft_exec_kept_bytes(e);
    if (e->kept || !e->lora) return e->kept != NULL;
    if (need > budget_bytes) return 0;
    int64_t n = e->m->cfg.num_hidden_layers * e->n_micro_max;
    e->kept = calloc((size_t)n, sizeof *e->kept);
    e->kept_mem = e->kept ? e->be->ops->alloc(e->be, need) : NULL;
    if (!e->kept_mem) {
        free(e->kept);
        e->kept = NULL;
        return ft_err(-ENOMEM, "out of memory keeping activations (%.1f GiB)", need / 1073741824.0);
    }
    e->kept_bytes = need;
    ft_block_dims d = dims_of(e, e->T_max);
    int64_t per = ft_pad16(ft_block_acts_floats(&d));
    for (int64_t i = 0; i < n; i++)
        ft_block_acts_carve(&e->kept[i], e->kept_mem + i * per, &d, e->lora->cfg.targets);
    return 1;
}

size_t ft_exec_pack_bytes(const ft_pack_file *pack)
{
    return ft_pack_max_layer_bytes(pack) +
           (size_t)ft_pack_layer_floats(ft_pack_config(pack)) * sizeof(float);
}

int ft_exec_use_pack(ft_exec *e, ft_pack_file *pack)
{
    return ft_exec_use_pack_ex(e, pack, 0);
}

int ft_exec_use_pack_ex(ft_exec *e, ft_pack_file *pack, int resident)
{
    const ft_model_config *a = &e->m->cfg, *b = ft_pack_config(pack);
    if (a->num_hidden_layers != b->num_hidden_layers || a->hidden_size != b->hidden_size ||
        a->intermediate_size != b->intermediate_size || a->head_dim != b->head_dim ||
        a->num_attention_heads != b->num_attention_heads ||
        a->num_key_value_heads != b->num_key_value_heads ||
        a->attention_bias != b->attention_bias || strcmp(a->model_type, b->model_type))
        return ft_err(FT_E_INVALID, "%s: the pack is of another architecture (%lld layers, hidden "
                      "%lld, intermediate %lld) than the model (%lld, %lld, %lld)",
                      ft_pack_path(pack), (long long)b->num_hidden_layers, (long long)b->hidden_size,
                      (long long)b->intermediate_size, (long long)a->num_hidden_layers,
                      (long long)a->hidden_size, (long long)a->intermediate_size);
    if (!e->be->ops->host_memory) return ft_exec_pack_to_device(e, pack);
    size_t raw = ft_pack_max_layer_bytes(pack);
    size_t f32 = (size_t)ft_pack_layer_floats(b) * sizeof(float);
    void *r = NULL;
    if (posix_memalign(&r, FT_PACK_ALIGN, raw)) r = NULL;
    float *w = r ? e->be->ops->alloc(e->be, f32) : NULL;
    if (!w) {
        free(r);
        return ft_err(-ENOMEM, "out of memory: the packed base needs %.1f MiB (one layer block "
                      "and one layer in fp32)", (raw + f32) / 1048576.0);
    }
    e->be->ops->free(e->be, e->layer_f32);
    free(e->pack_raw);
    e->pack = pack;
    e->pack_raw = r;
    e->pack_raw_bytes = raw;
    e->layer_f32 = w;
    e->fetched_layer = -1;
    if (!e->m->embed) FT_TRY(ft_exec_globals_from_pack(e, pack));
    /* a second call (another pack) drops the first one's resident copy */
    free(e->pack_host);
    free(e->pack_dev_off);
    e->pack_host = NULL;
    e->pack_dev_off = NULL;
    if (!resident) return 0;
    /* every block once, back to back; pack_dev_off holds their offsets */
    int64_t L = b->num_hidden_layers;
    size_t total = 0;
    for (int64_t l = 0; l < L; l++) total += ft_pack_block_bytes(pack, l);
    void *h = NULL;
    int64_t *offs = calloc((size_t)L, sizeof *offs);
    if (!offs || posix_memalign(&h, FT_PACK_ALIGN, total ? total : 1)) {
        free(offs);
        return ft_err(-ENOMEM, "out of memory: the resident pack needs %.1f MiB of host memory",
                      total / 1048576.0);
    }
    size_t off = 0;
    int rc = 0;
    for (int64_t l = 0; l < L && !rc; l++) {
        rc = ft_pack_read_block(pack, l, (uint8_t *)h + off, ft_pack_block_bytes(pack, l), 1);
        offs[l] = (int64_t)off;
        e->pack_reads++;
        off += ft_pack_block_bytes(pack, l);
    }
    if (rc) { /* not half a copy: the blocks are then read from the file as they are needed */
        free(h);
        free(offs);
        return rc;
    }
    e->pack_host = h;
    e->pack_dev_off = offs;
    return 0;
}

/* *blk = layer l's pack block in host memory: its copy in pack_host (a resident pack), or
 * read from the file into pack_raw (counted in pack_reads). */
static int host_block(ft_exec *e, int64_t l, const void **blk)
{
    if (e->pack_host) {
        *blk = e->pack_host + e->pack_dev_off[l];
        return 0;
    }
    FT_TRY(ft_pack_read_block(e->pack, l, e->pack_raw, e->pack_raw_bytes, 1));
    e->pack_reads++;
    *blk = e->pack_raw;
    return 0;
}

/* The base weights of layer l, ready for compute: the model's resident fp32 arrays, or
 * (ft_exec_use_pack) the layer's pack block read and dequantized into layer_f32 - kept when
 * the same layer is fetched again right away (the last layer of the forward pass is the
 * first of the backward pass). The CPU backend's memory is host memory, so the block is
 * dequantized in place; a device backend will fuse dequantization into its GEMMs. */
static int fetch_layer(ft_exec *e, int64_t l, const ft_layer_weights **w)
{
    e->layer_fetches++;
    if (!e->pack) {
        *w = &e->layers[l];
        return 0;
    }
    if (e->pack_dev) return ft_exec_fetch_device(e, l, w);
    if (e->fetched_layer != l) {
        e->fetched_layer = -1;
        const void *blk;
        FT_TRY(host_block(e, l, &blk));
        FT_TRY(ft_pack_layer_weights(e->pack, l, blk, e->layer_f32, &e->fetched));
        e->fetched_layer = l;
    }
    *w = &e->fetched;
    return 0;
}

/* Generation visits of at most this many tokens read an NF4 pack's projections in place on
 * the host (ft_exec_gen_source). At 8 rows the in-place product was still 1.5-2.4x faster than
 * dequantizing the layer and running sgemm (kernels/cpu/nf4_gemv.c's measurements); past a
 * few more, sgemm's reuse of each dequantized weight wins, and a longer prompt's prefill stays
 * bit-identical to ft_exec_logits. */
#define GEN_NF4_ROWS 8

/* Layer l for a generation visit of n tokens: on a host-memory backend over an NF4 pack with
 * n <= GEN_NF4_ROWS, the block's projections as stored (ft_pack_layer_weights_nf4; norms and
 * biases in layer_f32, which then no longer holds a whole layer); else fetch_layer. */
static int gen_layer(void *ctx, int64_t l, int64_t n, const ft_layer_weights **w)
{
    ft_exec *e = ctx;
    if (!e->pack || e->pack_dev || !e->be->ops->host_memory || n > GEN_NF4_ROWS ||
        ft_pack_header(e->pack)->quant != FT_PACK_QUANT_NF4)
        return fetch_layer(e, l, w);
    e->layer_fetches++;
    e->fetched_layer = -1;
    const void *blk;
    FT_TRY(host_block(e, l, &blk));
    FT_TRY(ft_pack_layer_weights_nf4(e->pack, l, blk, e->layer_f32, &e->fetched, e->fetched_nf4));
    e->gen_nf4_fetches++;
    *w = &e->fetched;
    return 0;
}

static int gen_begin(void *e) { return ft_exec_begin_op(e, 0); }
static int gen_end(void *e) { return ft_exec_op_end(e); }

/* The embedding rows of n ids (host) into out (n, C): with globals_lazy the bf16 table's rows
 * widened (exact: the fp32 table's values), or once the fp32 table is read, embedding_fwd on
 * it (host memory: ids in place; a read of it that failed, e.g. in gen_head, freed the bf16
 * table first: retried here); on a device, gathered from the pack T_max at a time (the
 * gather's host buffer). */
static int gen_embed_rows(void *ctx, const int32_t *ids, int64_t n, float *out)
{
    ft_exec *e = ctx;
    const int64_t C = e->m->cfg.hidden_size, V = e->m->cfg.vocab_size;
    if (e->embed_bf16) {
        for (int64_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= V)
                return ft_err(FT_E_INVALID, "generate: token %lld has id %d, expected 0..%lld",
                              (long long)i, ids[i], (long long)V - 1);
            const uint16_t *r = e->embed_bf16 + (int64_t)ids[i] * C;
            ft_quant_bf16_to_f32_n(out + i * C, r, C);
        }
        return 0;
    }
    FT_TRY(ft_exec_globals_f32(e)); /* globals_lazy: the bf16 table is gone (nothing otherwise) */
    if (e->embed) return e->be->ops->embedding_fwd(e->be, out, ids, e->embed, n, C, V);
    for (int64_t i = 0; i < n; i += e->T_max) {
        int64_t k = n - i < e->T_max ? n - i : e->T_max;
        FT_TRY(ft_exec_embed_from_pack(e, ids + i, k, out + i * C));
    }
    return 0;
}

/* The LM head of a globals_lazy executor: logits (rows, V) = x (rows, C) W^T, W the bf16 table
 * through lm_head_logits_bf16 for at most FT_LM_HEAD_BF16_ROWS rows (lm_head_logits' bits), else
 * the fp32 table (read from the pack at the first such call) through lm_head_logits. */
static int gen_head(void *ctx, float *logits, const float *x, int64_t rows)
{
    ft_exec *e = ctx;
    ft_backend *be = e->be;
    const int64_t C = e->m->cfg.hidden_size, V = e->m->cfg.vocab_size;
    if (e->lm_head_bf16 && be->ops->lm_head_logits_bf16 && rows <= FT_LM_HEAD_BF16_ROWS)
        return be->ops->lm_head_logits_bf16(be, logits, x, e->lm_head_bf16, rows, C, V);
    FT_TRY(ft_exec_globals_f32(e));
    return be->ops->lm_head_logits(be, logits, x, e->lm_head, rows, C, V);
}

int ft_exec_gen_source(ft_exec *e, ft_gen_source *s)
{
    memset(s, 0, sizeof *s);
    if (!e->pack && !(e->layers && e->layers[0].attn_norm))
        return ft_err(FT_E_INVALID, "generate: the executor holds no layer weights and reads no "
                      "pack (ft_exec_use_pack first)");
    *s = (ft_gen_source){e, gen_begin, gen_layer, gen_end, e->embed ? NULL : gen_embed_rows,
                         e->embed, e->final_norm, e->lm_head};
    if (e->globals_lazy && !e->lm_head) s->head = gen_head; /* lm_head NULL: the bf16 table */
    return 0;
}

/* Checkpoints: ck_*() give the device buffers of checkpoint j (micro-batch mb at
 * + mb * ck_stride(e)): the arena's when every checkpoint stays on the device, the host
 * tier's otherwise (offload/actckpt.h; its hooks order the copies around compute). */
static int64_t ck_stride(const ft_exec *e) { return e->T_max * e->m->cfg.hidden_size; }

/* Floats between micro-batches in e->dx: T_max x hidden rounded up to 16 (see plan). */
static int64_t dx_stride(const ft_exec *e)
{
    return ft_pad16(e->T_max * e->m->cfg.hidden_size);
}

static int ck_write(ft_exec *e, int64_t j, float **out)
{
    if (e->ckt) return ft_ckpt_tier_write(e, j, out);
    *out = e->ckpt + j * e->n_micro_max * ck_stride(e);
    return 0;
}

static int ck_read(ft_exec *e, int64_t j, float **at)
{
    if (e->ckt) return ft_ckpt_tier_read(e, j, at);
    *at = e->ckpt + j * e->n_micro_max * ck_stride(e);
    return 0;
}

static int ck_written(ft_exec *e, int64_t j) { return e->ckt ? ft_ckpt_tier_written(e, j) : 0; }
static int ck_used(ft_exec *e, int64_t j) { return e->ckt ? ft_ckpt_tier_used(e, j) : 0; }

static int upload(ft_exec *e, const ft_batch *b, int64_t mb)
{
    if (b->T > e->T_max)
        return ft_err(FT_E_RANGE, "micro-batch of %lld tokens exceeds the planned %lld",
                      (long long)b->T, (long long)e->T_max);
    ft_backend *be = e->be;
    size_t n = (size_t)b->T * sizeof(int32_t);
    int64_t o = mb * e->T_max;
    FT_TRY(be->ops->copy(be, e->ids + o, b->ids, n));
    FT_TRY(be->ops->copy(be, e->targets + o, b->targets, n));
    FT_TRY(be->ops->copy(be, e->pos + o, b->pos, n));
    return be->ops->copy(be, e->seq_start + o, b->seq_start, n);
}

static ft_block_io io_of(ft_exec *e, int64_t mb, uint64_t seed)
{
    ft_block_io io = {e->pos + mb * e->T_max, e->seq_start + mb * e->T_max, e->inv_freq, 0};
    if (seed) io.dropout_seed = seed ^ ((uint64_t)(mb + 1) * 0xd1b54a32d192ed03ull);
    return io;
}

/* NEFTune (Jain et al. 2023, arXiv 2310.05914; transformers' neftune_post_forward_hook):
 * adds uniform(-mag, mag) noise to the embeddings x (T, C) of training micro-batch mb, where
 * the hook's mag = alpha / sqrt(L * d) for a (B, L, d) embedding output. ftune packs examples
 * into rows of seq_len tokens (as TRL with packing), so L = the batch's seq_len (T when a
 * hand-made batch leaves it 0) and d = hidden_size. The draw is a pure function of
 * (neftune_seed, mb, element): a resumed run draws the same noise, and as the noise lands
 * before checkpoint 0 is stored (ck_written), the backward of layer 0 (its recompute, or the
 * kept activations) starts from the same noisy values. The embedding is frozen, so the
 * backward needs nothing else: the noise is additive. */
static int neftune(ft_exec *e, const ft_batch *b, int64_t mb, float *x)
{
    const int64_t C = e->m->cfg.hidden_size;
    if (b->T < 1) return 0;
    const int64_t L = b->seq_len > 0 ? b->seq_len : b->T;
    const float mag = (float)(e->neftune_alpha / sqrt((double)L * (double)C));
    /* another odd constant than io_of's: the noise of micro-batch mb is unrelated to the
     * dropout masks even when the two seeds coincide */
    const uint64_t seed = e->neftune_seed ^ ((uint64_t)(mb + 1) * 0x9e6c63d0676a9a99ull);
    return e->be->ops->noise_uniform_add(e->be, x, b->T * C, mag, seed);
}

/* Forward of all layers for micro-batches [0, n_mb), vertical order; checkpoint L holds
 * each final hidden state. With train and e->neftune_alpha > 0, the embeddings get NEFTune
 * noise (neftune above). */
static int forward_all(ft_exec *e, const ft_batch *mbs, int64_t n_mb, uint64_t seed, int train)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t st = ck_stride(e);
    FT_TRY(ft_exec_globals_f32(e)); /* a pack-only model on the host: its fp32 tables, once */
    for (int64_t mb = 0; mb < n_mb; mb++) FT_TRY(upload(e, &mbs[mb], mb));
    if (e->ckt) ft_ckpt_tier_begin(e, mbs, n_mb, train);
    float *x0;
    FT_TRY(ck_write(e, 0, &x0));
    for (int64_t mb = 0; mb < n_mb; mb++) {
        if (!e->embed) /* a pack-only model on a device: rows gathered from the pack file */
            FT_TRY(ft_exec_embed_from_pack(e, mbs[mb].ids, mbs[mb].T, x0 + mb * st));
        else
            FT_TRY(be->ops->embedding_fwd(be, x0 + mb * st, e->ids + mb * e->T_max, e->embed,
                                          mbs[mb].T, c->hidden_size, c->vocab_size));
        if (train && e->neftune_alpha > 0) FT_TRY(neftune(e, &mbs[mb], mb, x0 + mb * st));
    }
    FT_TRY(ft_exec_begin_op(e, train)); /* the layer order, for prefetching and the timeline */
    FT_TRY(ck_written(e, 0)); /* its store: after the timeline's origin */
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const ft_layer_weights *w;
        float *x, *y;
        FT_TRY(fetch_layer(e, l, &w));
        FT_TRY(ck_read(e, l, &x));
        FT_TRY(ck_write(e, l + 1, &y));
        int mk = ft_exec_tl_begin(e, FT_TL_COMPUTE, FT_TL_FWD, l);
        for (int64_t mb = 0; mb < n_mb; mb++) {
            ft_block_dims d = dims_of(e, mbs[mb].T);
            ft_block_io io = io_of(e, mb, seed);
            ft_block_acts *a = train && e->kept ? &e->kept[l * e->n_micro_max + mb] : &e->acts;
            FT_TRY(ft_block_fwd(be, c, w, e->lora, l, &d, &io, x + mb * st, y + mb * st, a, &e->scr,
                                train));
        }
        ft_exec_tl_end(e, mk);
        FT_TRY(ck_used(e, l));
        FT_TRY(ck_written(e, l + 1));
    }
    return 0;
}

/* The start of a head: micro-batch mb's final hidden state (checkpoint L) into *xL, the
 * timeline mark into *mk, and the final norm of its T rows into e->xf / e->rstdf. */
static int head_begin(ft_exec *e, const ft_batch *b, int64_t mb, float **xL, int *mk)
{
    const ft_model_config *c = &e->m->cfg;
    FT_TRY(ck_read(e, c->num_hidden_layers, xL));
    *xL += mb * ck_stride(e);
    *mk = ft_exec_tl_begin(e, FT_TL_COMPUTE, FT_TL_HEAD, -1);
    return e->be->ops->rmsnorm_fwd(e->be, e->xf, e->rstdf, *xL, e->final_norm, b->T,
                                   c->hidden_size, c->rms_norm_eps);
}

/* The end of a head: with dx, the gradient in e->dxf (T rows) through the final norm into dx
 * (T, C); then the timeline mark mk closes and checkpoint L is released. */
static int head_end(ft_exec *e, const ft_batch *b, const float *xL, float *dx, int mk)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t T = b->T, C = c->hidden_size;
    if (dx) {
        FT_TRY(be->ops->zero(be, dx, (size_t)(T * C) * sizeof(float)));
        FT_TRY(be->ops->rmsnorm_bwd(be, dx, e->dxf, xL, e->final_norm, e->rstdf, T, C));
    }
    ft_exec_tl_end(e, mk);
    return ck_used(e, c->num_hidden_layers);
}

/* Final norm + LM head + CE for micro-batch mb; dx (if non-NULL) gets d(final hidden). */
static int head(ft_exec *e, const ft_batch *b, int64_t mb, float grad_scale, float *dx,
                double *loss, int64_t *n)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t T = b->T, C = c->hidden_size;
    float *xL;
    int mk;
    FT_TRY(head_begin(e, b, mb, &xL, &mk));
    FT_TRY(be->ops->lm_head_ce(be, loss, n, dx ? e->dxf : NULL, e->xf, e->lm_head,
                               e->targets + mb * e->T_max, T, C, c->vocab_size, grad_scale,
                               e->ce_scratch, e->ce_chunk));
    return head_end(e, b, xL, dx, mk);
}

/* Room for n sequences in e->seq_buf: nll, scale (doubles) and n_tok (int64). */
static int seq_room(ft_exec *e, int64_t n)
{
    if (n <= e->seq_cap) return 0;
    double *p = realloc(e->seq_buf, (size_t)n * (2 * sizeof(double) + sizeof(int64_t)));
    if (!p) return ft_err(-ENOMEM, "out of memory for %lld sequence losses", (long long)n);
    e->seq_buf = p;
    e->seq_cap = n;
    return 0;
}

/* A preference micro-batch's pairs tile whole sequences within its T tokens: checked before
 * the forward, so that a bad batch stops no operation half way. */
/* Sequence s of a preference micro-batch (2k: pair k's chosen, 2k+1: its rejected): its
 * first token *t0 and length *n. */
static void seq_span(const ft_batch *b, int64_t s, int64_t *t0, int64_t *n)
{
    const int64_t *pr = b->pairs + (s / 2) * FT_PAIR_FIELDS;
    *t0 = pr[s % 2 ? FT_PAIR_REJECTED_START : FT_PAIR_CHOSEN_START];
    *n = pr[s % 2 ? FT_PAIR_REJECTED_LEN : FT_PAIR_CHOSEN_LEN];
}

static int check_pairs(const ft_batch *b)
{
    if (b->n_pairs < 1 || !b->pairs)
        return ft_err(FT_E_INVALID, "a sequence objective on a micro-batch without preference pairs");
    for (int64_t s = 0; s < 2 * b->n_pairs; s++) {
        int64_t t0, n;
        seq_span(b, s, &t0, &n);
        if (t0 < 0 || n < 1 || t0 + n > b->T)
            return ft_err(FT_E_INVALID, "preference pair %lld: sequence [%lld, +%lld) outside the %lld-token micro-batch",
                          (long long)(s / 2), (long long)t0, (long long)n, (long long)b->T);
    }
    return 0;
}

/* The LM head + CE of the rows [t0, t0 + n) of micro-batch mb on their own, from the final
 * norm's output in e->xf: *nll (nats) and *n_tok of their targets; with grad, d nll / d x of
 * those rows into the same rows of e->dxf. The op chunks the rows by e->ce_chunk into
 * e->ce_scratch, as a whole micro-batch's head does. */
static int span_ce(ft_exec *e, int64_t mb, int64_t t0, int64_t n, int grad, double *nll,
                   int64_t *n_tok)
{
    const ft_model_config *c = &e->m->cfg;
    const int64_t C = c->hidden_size;
    return e->be->ops->lm_head_ce(e->be, nll, n_tok, grad ? e->dxf + t0 * C : NULL, e->xf + t0 * C,
                                  e->lm_head, e->targets + mb * e->T_max + t0, n, C,
                                  c->vocab_size, 1.0f, e->ce_scratch, e->ce_chunk);
}

/* The head of a preference micro-batch: final norm, then the LM head + CE of each sequence
 * on its own rows (nll[s], n_tok[s]); with dx: d nll[s] / d x of each sequence's rows,
 * scaled by fn's scale[s], then through the final norm into dx. */
static int head_seq(ft_exec *e, const ft_batch *b, int64_t mb, float *dx, double *nll,
                    int64_t *n_tok, ft_exec_seq_grad_fn fn, void *user)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t T = b->T, C = c->hidden_size;
    float *xL;
    int mk;
    FT_TRY(head_begin(e, b, mb, &xL, &mk));
    if (dx) FT_TRY(be->ops->zero(be, e->dxf, (size_t)(T * C) * sizeof(float)));
    for (int64_t s = 0; s < 2 * b->n_pairs; s++) {
        int64_t t0, n;
        seq_span(b, s, &t0, &n);
        FT_TRY(span_ce(e, mb, t0, n, dx != NULL, &nll[s], &n_tok[s]));
    }
    if (dx) {
        double *scale = nll + 2 * b->n_pairs;
        FT_TRY(fn(user, mb, b, nll, n_tok, scale));
        for (int64_t s = 0; s < 2 * b->n_pairs; s++) {
            int64_t t0, n;
            seq_span(b, s, &t0, &n);
            FT_TRY(be->ops->scale(be, e->dxf + t0 * C, (float)scale[s], n * C));
        }
    }
    return head_end(e, b, xL, dx, mk);
}

/* The backward of all layers for micro-batches [0, n_mb), from the d(final hidden) in e->dx
 * that the head left. */
static int backward_all(ft_exec *e, const ft_batch *mbs, int64_t n_mb, uint64_t dropout_seed);

int ft_exec_train_step_seq(ft_exec *e, const ft_batch *mbs, int64_t n_mb, ft_exec_seq_grad_fn fn,
                           void *user, uint64_t dropout_seed)
{
    if (n_mb < 1 || n_mb > e->n_micro_max)
        return ft_err(FT_E_RANGE, "step of %lld micro-batches exceeds the planned %lld",
                      (long long)n_mb, (long long)e->n_micro_max);
    if (!e->lora) return ft_err(FT_E_INVALID, "train step without an adapter");
    if (!fn) return ft_err(FT_E_INVALID, "a sequence objective without its gradient function");
    for (int64_t mb = 0; mb < n_mb; mb++) FT_TRY(check_pairs(&mbs[mb]));
    /* room for the most sequences a micro-batch can hold (one token each), so that the
     * buffer is sized at the first step and never again */
    FT_TRY(seq_room(e, e->T_max));
    FT_TRY(forward_all(e, mbs, n_mb, dropout_seed, 1));
    for (int64_t mb = 0; mb < n_mb; mb++) {
        double *nll = e->seq_buf;
        int64_t *n_tok = (int64_t *)(e->seq_buf + 2 * e->seq_cap);
        FT_TRY(head_seq(e, &mbs[mb], mb, e->dx + mb * dx_stride(e), nll, n_tok, fn, user));
    }
    return backward_all(e, mbs, n_mb, dropout_seed);
}

int ft_exec_eval_seq(ft_exec *e, const ft_batch *mb, double *nll, int64_t *n_tok)
{
    FT_TRY(check_pairs(mb));
    FT_TRY(forward_all(e, mb, 1, 0, 0));
    FT_TRY(head_seq(e, mb, 0, NULL, nll, n_tok, NULL, NULL));
    return ft_exec_op_end(e);
}

int ft_exec_train_step(ft_exec *e, const ft_batch *mbs, int64_t n_mb, int64_t grad_norm_tokens,
                       uint64_t dropout_seed, double *loss_sum, int64_t *n_tokens)
{
    if (n_mb < 1 || n_mb > e->n_micro_max)
        return ft_err(FT_E_RANGE, "step of %lld micro-batches exceeds the planned %lld",
                      (long long)n_mb, (long long)e->n_micro_max);
    if (!e->lora) return ft_err(FT_E_INVALID, "train step without an adapter");
    float gs = grad_norm_tokens > 0 ? 1.0f / (float)grad_norm_tokens : 0.0f;
    FT_TRY(forward_all(e, mbs, n_mb, dropout_seed, 1));
    *loss_sum = 0;
    *n_tokens = 0;
    for (int64_t mb = 0; mb < n_mb; mb++) {
        double ls = 0;
        int64_t nv = 0;
        FT_TRY(head(e, &mbs[mb], mb, gs, e->dx + mb * dx_stride(e), &ls, &nv));
        *loss_sum += ls;
        *n_tokens += nv;
    }
    return backward_all(e, mbs, n_mb, dropout_seed);
}

static int backward_all(ft_exec *e, const ft_batch *mbs, int64_t n_mb, uint64_t dropout_seed)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    if (e->ckt) FT_TRY(ft_ckpt_tier_bwd_begin(e));
    int64_t st = ck_stride(e);
    for (int64_t l = c->num_hidden_layers - 1; l >= 0; l--) {
        const ft_layer_weights *w;
        float *xl, *out;
        FT_TRY(fetch_layer(e, l, &w));
        if (e->ckt) {
            FT_TRY(ft_ckpt_tier_bwd_in(e, l, &xl));
            out = e->xf; /* the recompute's output is not used: the head's scratch takes it */
        } else {
            FT_TRY(ck_read(e, l, &xl));
            FT_TRY(ck_read(e, l + 1, &out)); /* checkpoint l+1 is no longer needed */
        }
        int mk = ft_exec_tl_begin(e, FT_TL_COMPUTE, FT_TL_BWD, l);
        for (int64_t mb = 0; mb < n_mb; mb++) {
            ft_block_dims d = dims_of(e, mbs[mb].T);
            ft_block_io io = io_of(e, mb, dropout_seed);
            const float *x = xl + mb * st;
            float *dx = e->dx + mb * dx_stride(e);
            ft_block_acts *a = &e->acts;
            if (e->kept)
                a = &e->kept[l * e->n_micro_max + mb];
            else /* recompute */
                FT_TRY(ft_block_fwd(be, c, w, e->lora, l, &d, &io, x, e->ckt ? out : out + mb * st,
                                    a, &e->scr, 1));
            FT_TRY(ft_block_bwd(be, c, w, e->lora, l, &d, &io, x, dx, dx, a, &e->scr));
        }
        ft_exec_tl_end(e, mk);
        if (e->ckt) FT_TRY(ft_ckpt_tier_bwd_done(e, l));
    }
    return ft_exec_op_end(e);
}

int ft_exec_eval(ft_exec *e, const ft_batch *mb, double *loss_sum, int64_t *n_tokens)
{
    FT_TRY(forward_all(e, mb, 1, 0, 0));
    FT_TRY(head(e, mb, 0, 0.0f, NULL, loss_sum, n_tokens));
    return ft_exec_op_end(e);
}

int ft_exec_eval_spans(ft_exec *e, const ft_batch *mb, const int64_t *spans, int64_t n_spans,
                       double *nll, int64_t *n_tok, double *loss_sum, int64_t *n_tokens)
{
    if (n_spans < 0 || (n_spans > 0 && (!spans || !nll || !n_tok)))
        return ft_err(FT_E_INVALID, "ft_exec_eval_spans: %lld spans%s", (long long)n_spans,
                      n_spans < 0 ? "" : " without their arrays");
    for (int64_t s = 0; s < n_spans; s++) {
        int64_t t0 = spans[2 * s], n = spans[2 * s + 1];
        if (t0 < 0 || n < 1 || t0 > mb->T - n)
            return ft_err(FT_E_INVALID, "span %lld: rows [%lld, +%lld) outside the %lld-token micro-batch",
                          (long long)s, (long long)t0, (long long)n, (long long)mb->T);
    }
    FT_TRY(forward_all(e, mb, 1, 0, 0));
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    float *xL;
    int mk;
    FT_TRY(head_begin(e, mb, 0, &xL, &mk));
    if (loss_sum || n_tokens) { /* ft_exec_eval's head: the same call on the same rows */
        double ls;
        int64_t nv;
        FT_TRY(be->ops->lm_head_ce(be, &ls, &nv, NULL, e->xf, e->lm_head, e->targets, mb->T,
                                   c->hidden_size, c->vocab_size, 0.0f, e->ce_scratch, e->ce_chunk));
        if (loss_sum) *loss_sum = ls;
        if (n_tokens) *n_tokens = nv;
    }
    for (int64_t s = 0; s < n_spans; s++)
        FT_TRY(span_ce(e, 0, spans[2 * s], spans[2 * s + 1], 0, &nll[s], &n_tok[s]));
    FT_TRY(head_end(e, mb, xL, NULL, mk));
    return ft_exec_op_end(e);
}

int ft_exec_logits(ft_exec *e, const ft_batch *mb, float *logits)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t T = mb->T, C = c->hidden_size, V = c->vocab_size;
    float *xL;
    FT_TRY(forward_all(e, mb, 1, 0, 0));
    FT_TRY(ck_read(e, c->num_hidden_layers, &xL));
    FT_TRY(be->ops->rmsnorm_fwd(be, e->xf, e->rstdf, xL, e->final_norm, T, C, c->rms_norm_eps));
    FT_TRY(ck_used(e, c->num_hidden_layers));
    float *out = be->ops->alloc(be, (size_t)(T * V) * sizeof(float));
    if (!out) return ft_err(-ENOMEM, "out of memory for (%lld, %lld) logits", (long long)T, (long long)V);
    int rc = be->ops->lm_head_logits(be, out, e->xf, e->lm_head, T, C, V);
    if (!rc) rc = be->ops->copy(be, logits, out, (size_t)(T * V) * sizeof(float));
    be->ops->free(be, out);
    return rc;
}
