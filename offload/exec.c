/* exec.c - the per-layer executor (see exec.h): sizing, the arena, the base weights as each
 * layer visit fetches them, the generation source. The schedule of an operation (forward,
 * head, backward over passes of one or more adapters) is in exec_step.c. */
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

/* Floats of every region, in carving order. */
typedef struct { int64_t ckpt, dx, acts, scr, xf, rstdf, dxf, ce, inv, ints; } layout;

/* T: rows of a micro-batch (a pass's: every adapter's); r: the largest LoRA rank (1 without an
 * adapter); ckpt_bufs: device checkpoint buffers of T * C floats; < 0: all (L + 1) * n_micro. */
static layout plan(const ft_model *m, int64_t r, int64_t T, int64_t n_micro, int64_t chunk,
                   int64_t ckpt_bufs)
{
    const ft_model_config *c = &m->cfg;
    ft_block_dims d = ft_exec_dims_for(m, r, T);
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

size_t ft_exec_bytes_multi(const ft_backend *be, const ft_model *m, int64_t n_adapters,
                           int64_t r_max, int64_t T_max, int64_t n_micro)
{
    layout L = plan(m, r_max, n_adapters * T_max, n_micro, ce_chunk_for(be, T_max), -1);
    return (size_t)total(&L) * sizeof(float) +
           (be->ops->host_memory ? 0 : ft_exec_weight_bytes(be, m));
}

size_t ft_exec_bytes(const ft_backend *be, const ft_model *m, const ft_lora *lora, int64_t T_max,
                     int64_t n_micro)
{
    return ft_exec_bytes_multi(be, m, 1, lora ? lora->cfg.r : 1, T_max, n_micro);
}

/* Floats of the kept activations of every layer and micro-batch of T rows. */
static int64_t kept_floats(const ft_model *m, int64_t r, int64_t T, int64_t n_micro)
{
    ft_block_dims d = ft_exec_dims_for(m, r, T);
    return ft_pad16(ft_block_acts_floats(&d)) * m->cfg.num_hidden_layers * n_micro;
}

void ft_exec_adapter_bytes(const ft_model *m, int64_t r_max, int64_t T_max, int64_t n_micro,
                           ft_exec_adapter_sizes *out)
{
    /* the growth from one adapter to two: the regions that scale with the rows (the chunk and
     * inv_freq do not: the same chunk for both) */
    layout a = plan(m, r_max, T_max, n_micro, 1, -1), b = plan(m, r_max, 2 * T_max, n_micro, 1, -1);
    out->ckpt = (size_t)(b.ckpt - a.ckpt) * sizeof(float);
    out->per_micro = (size_t)(b.dx - a.dx + b.ints - a.ints) * sizeof(float);
    out->work = (size_t)(b.acts - a.acts + b.scr - a.scr + b.xf - a.xf + b.rstdf - a.rstdf +
                         b.dxf - a.dxf) * sizeof(float);
    out->total = out->ckpt + out->per_micro + out->work;
    out->kept = (size_t)(kept_floats(m, r_max, 2 * T_max, n_micro) -
                         kept_floats(m, r_max, T_max, n_micro)) * sizeof(float);
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
    layout L = plan(e->m, e->r_max, T_max, n_micro, e->ce_chunk, ckpt_bufs);
    e->arena_bytes = (size_t)total(&L) * sizeof(float);
    e->arena = be->ops->alloc(be, e->arena_bytes);
    if (!e->arena)
        return ft_err(-ENOMEM, "out of memory: the executor needs %.1f MiB for %lld micro-batches "
                      "of %lld tokens (try a smaller --batch-size, --seq-len or --grad-accum)",
                      e->arena_bytes / 1048576.0, (long long)n_micro, (long long)T_max);
    float *p = e->arena;
    e->ckpt = ft_carve16(&p, L.ckpt);
    e->dx = ft_carve16(&p, L.dx);
    ft_block_dims d = ft_exec_dims(e, T_max);
    ft_block_acts_carve(&e->acts, ft_carve16(&p, L.acts), &d, FT_LORA_ALL_TARGETS);
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

/* The sizes of an executor: n_adapters adapters per pass of up to T_adapter tokens each, LoRA
 * ranks up to r_max (ft_exec_init: one adapter, its rank). */
typedef struct exec_sizes { int64_t n_adapters, r_max, T_adapter, n_micro; } exec_sizes;

static int init_impl(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora,
                     const exec_sizes *z, int64_t rope_seq_len, int place_layers,
                     int64_t ckpt_bufs);

static exec_sizes one_adapter(const ft_lora *lora, int64_t T_max, int64_t n_micro)
{
    return (exec_sizes){1, lora ? lora->cfg.r : 1, T_max, n_micro};
}

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
    exec_sizes z = one_adapter(lora, T_max, n_micro);
    int rc = init_impl(e, be, m, lora, &z, rope_seq_len, place_layers, -1);
    return rc < 0 ? ft_exec_free_keeping_err(e, rc) : rc; /* a failed init frees its own */
}

/* ft_exec_init_ckpt_host's body for sizes z (n_sets 0: every checkpoint in the arena). */
static int init_sized(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora,
                      const exec_sizes *z, int64_t rope_seq_len, int place_layers,
                      int64_t dev_layers, int n_sets)
{
    memset(e, 0, sizeof *e);
    if (n_sets) FT_TRY(ft_actckpt_check(m->cfg.num_hidden_layers, dev_layers, n_sets));
    int64_t bufs = n_sets ? ft_actckpt_dev_buffers(z->n_micro, dev_layers, n_sets) : -1;
    int rc = init_impl(e, be, m, lora, z, rope_seq_len, place_layers, bufs);
    if (!rc && n_sets) rc = ft_actckpt_init(e, dev_layers, n_sets);
    return rc < 0 ? ft_exec_free_keeping_err(e, rc) : rc;
}

int ft_exec_init_multi(ft_exec *e, ft_backend *be, const ft_model *m, int64_t n_adapters,
                       int64_t r_max, int64_t T_max, int64_t n_micro, int64_t rope_seq_len,
                       int place_layers, int64_t dev_layers, int n_sets)
{
    memset(e, 0, sizeof *e);
    if (n_adapters < 1 || r_max < 1 || r_max > 4096 || T_max < 1 || T_max > INT64_MAX / n_adapters)
        return ft_err(FT_E_INVALID, "executor: %lld adapters per pass of rank <= %lld and %lld "
                      "tokens each (expected >= 1 adapters, rank 1..4096)", (long long)n_adapters,
                      (long long)r_max, (long long)T_max);
    exec_sizes z = {n_adapters, r_max, T_max, n_micro};
    FT_TRY(init_sized(e, be, m, NULL, &z, rope_seq_len, place_layers, dev_layers, n_sets));
    e->adapters_per_step = 1;
    return 0;
}

int ft_exec_init_ckpt_host(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora,
                           int64_t T_max, int64_t n_micro, int64_t rope_seq_len, int place_layers,
                           int64_t dev_layers, int n_sets)
{
    memset(e, 0, sizeof *e);
    FT_TRY(ft_actckpt_check(m->cfg.num_hidden_layers, dev_layers, n_sets));
    exec_sizes z = one_adapter(lora, T_max, n_micro);
    return init_sized(e, be, m, lora, &z, rope_seq_len, place_layers, dev_layers, n_sets);
}

int ft_exec_ckpt_to_host(ft_exec *e, int64_t dev_layers, int n_sets)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    if (e->ckt)
        return ft_err(FT_E_INVALID, "ft_exec_ckpt_to_host: the checkpoints are in host memory already");
    FT_TRY(ft_actckpt_check(c->num_hidden_layers, dev_layers, n_sets));
    float inv[1024]; /* the one arena content set at init (head_dim / 2 <= 1024 there) */
    size_t inv_bytes = (size_t)(c->head_dim / 2) * sizeof(float);
    FT_TRY(be->ops->copy(be, inv, e->inv_freq, inv_bytes));
    be->ops->free(be, e->arena); /* first, so that the device never holds both */
    e->arena = NULL;
    FT_TRY(carve_arena(e, ft_actckpt_dev_buffers(e->n_micro_max, dev_layers, n_sets)));
    FT_TRY(be->ops->copy(be, e->inv_freq, inv, inv_bytes));
    return ft_actckpt_init(e, dev_layers, n_sets);
}

static int init_impl(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora,
                     const exec_sizes *z, int64_t rope_seq_len, int place_layers,
                     int64_t ckpt_bufs)
{
    memset(e, 0, sizeof *e);
    int64_t T_max = z->T_adapter, n_micro = z->n_micro, K = z->n_adapters;
    if (T_max < 1 || n_micro < 1)
        return ft_err(FT_E_INVALID, "executor: bad sizes T=%lld micro-batches=%lld",
                      (long long)T_max, (long long)n_micro);
    e->be = be;
    e->on_device = !be->ops->host_memory;
    e->nf4_fused = ft_exec_nf4_gemm_mode(be) == FT_NF4_GEMM_FUSED;
    e->m = m;
    e->lora = lora;
    e->n_adapters = K;
    e->adapter_T_max = T_max;
    e->r_max = z->r_max;
    e->T_max = K * T_max;
    e->n_micro_max = n_micro;
    /* the head runs per adapter's rows: one adapter's chunk, as its run alone has */
    e->ce_chunk = ce_chunk_for(be, T_max);
    e->op_segs = calloc((size_t)(n_micro * K), sizeof *e->op_segs);
    e->op_seg_step = calloc((size_t)(n_micro * K), sizeof *e->op_seg_step);
    e->op_rows = calloc((size_t)n_micro, sizeof *e->op_rows);
    e->op_nseg = calloc((size_t)n_micro, sizeof *e->op_nseg);
    e->op_ntok = calloc((size_t)K, sizeof *e->op_ntok);
    e->op_loss = calloc((size_t)K, sizeof *e->op_loss);
    if (!e->op_segs || !e->op_seg_step || !e->op_rows || !e->op_nseg || !e->op_ntok || !e->op_loss)
        return ft_err(-ENOMEM, "out of memory for the executor's schedule");
    FT_TRY(carve_arena(e, ckpt_bufs));

    float inv[1024];
    if (m->cfg.head_dim / 2 > 1024)
        return ft_err(FT_E_UNSUPPORTED, "head_dim %lld too large", (long long)m->cfg.head_dim);
    ft_rope_inv_freq(&m->cfg, rope_seq_len, inv);
    FT_TRY(be->ops->copy(be, e->inv_freq, inv, (size_t)(m->cfg.head_dim / 2) * sizeof(float)));
    if (be->ops->prepare) /* attention runs per adapter's rows (llama.h ft_block_seg) */
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
        ft_actckpt_free(e);
        free(e->kept);
        if (e->layers && e->layers != e->m->layers) free(e->layers);
    }
    if (e) {
        free(e->pack_raw);
        free(e->pack_host);
        free(e->seq_buf);
        free(e->op_segs);
        free(e->op_seg_step);
        free(e->op_rows);
        free(e->op_nseg);
        free(e->op_ntok);
        free(e->op_loss);
    }
    if (e) memset(e, 0, sizeof *e);
}

size_t ft_exec_kept_bytes(const ft_exec *e)
{
    return (size_t)kept_floats(e->m, e->r_max, e->T_max, e->n_micro_max) * sizeof(float);
}

int ft_exec_keep_activations(ft_exec *e, size_t budget_bytes)
{
    size_t need = ft_exec_kept_bytes(e);
    if (e->kept || (!e->lora && !e->adapters_per_step)) return e->kept != NULL;
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
    ft_block_dims d = ft_exec_dims(e, e->T_max);
    int64_t per = ft_pad16(ft_block_acts_floats(&d));
    for (int64_t i = 0; i < n; i++)
        ft_block_acts_carve(&e->kept[i], e->kept_mem + i * per, &d, FT_LORA_ALL_TARGETS);
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
    if (e->on_device) return ft_exec_pack_to_device(e, pack);
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
int ft_exec_fetch_layer(ft_exec *e, int64_t l, const ft_layer_weights **w)
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
 * biases in layer_f32, which then no longer holds a whole layer); else ft_exec_fetch_layer. */
static int gen_layer(void *ctx, int64_t l, int64_t n, const ft_layer_weights **w)
{
    ft_exec *e = ctx;
    if (!e->pack || e->pack_dev || e->on_device || n > GEN_NF4_ROWS ||
        ft_pack_header(e->pack)->quant != FT_PACK_QUANT_NF4)
        return ft_exec_fetch_layer(e, l, w);
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
