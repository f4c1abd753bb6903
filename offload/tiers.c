/* tiers.c - a packed base on a device backend, layer by layer in its tier (exec.h,
 * offload/plan.h): blocks resident in device memory, in pinned host memory, or read from the
 * pack file at each visit, the last two carried to the GPU through a ring of device slots.
 *
 * The schedule is known before an operation starts (ft_exec_visits: the forward visits
 * layers 0..L-1, the backward L-1..0), so transfers are issued ahead of compute in that
 * order, as far as free slots allow (n_slots - 1 visits ahead: the slot of the layer being
 * computed is busy until its compute is queued). All ordering is on the device:
 *   H2D lane:     wait free[s] -> copy block into slot s -> record ready[s]
 *   compute lane: wait ready[s] -> dequantize the NF4 projections into the bf16 staging ->
 *                 the layer's compute (norms and biases read from the slot) -> record free[s]
 * Disk blocks are read into a ring of pinned staging buffers by the disk read-ahead thread
 * (offload/prefetch.h), in the order of the operation's visits and on into the next
 * operation's forward (speculatively: kept when the next operation starts as predicted), as
 * soon as a buffer's previous H2D copy is done (the thread syncs on its event, EV_STAGE), with
 * the io_uring queue kept full across blocks; issue() only waits for "block staged". The host
 * thread runs ahead of the GPU (nothing else blocks it), so disk reads overlap the compute
 * already queued. The pinned pool and the staging buffers are on the GPU's NUMA node
 * (offload/pinned.h). Streamed blocks are not checksummed again: every block was read and
 * verified once when placed (ft_exec_use_pack_tiers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offload/exec_internal.h"
#include "offload/pack_internal.h"
#include "offload/pinned.h"
#include "offload/plan.h"
#include "offload/prefetch.h"
#include "offload/timeline.h"
#include "src/core/err.h"

#define EV_FREE(s) (s)
#define EV_READY(s) (8 + (s))
#define EV_STAGE(h) (16 + (h))
#define EV_DRAIN (FT_MAX_EVENTS - 3) /* at free time only (timeline ids may reach it during an op) */
#define EV_TL0 32

typedef struct ft_tl_mark {
    int ev0, ev1;               /* device events (-1: host times h0/h1 instead) */
    double h0, h1;
    int lane, kind;
    int64_t layer;
} ft_tl_mark;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- timeline marks ------------------------------------------------------------------ */

static int tl_mark(ft_exec *e, int lane, int kind, int64_t layer, int begin)
{
    if (!e->tl || !e->tl_marks) return -1;
    if (begin) {
        if (e->tl_n_marks >= 4 * (2 * e->m->cfg.num_hidden_layers + 8) ||
            e->tl_next_ev + 2 > FT_MAX_EVENTS)
            return -1;
        ft_tl_mark *k = &e->tl_marks[e->tl_n_marks];
        memset(k, 0, sizeof *k);
        k->lane = lane;
        k->kind = kind;
        k->layer = layer;
        if (!e->on_device) { /* work runs as it is queued: host times */
            k->ev0 = k->ev1 = -1;
            k->h0 = k->h1 = now_s() - e->tl_host0;
            return (int)e->tl_n_marks++;
        }
        k->ev0 = e->tl_next_ev++;
        k->ev1 = e->tl_next_ev++;
        int bl = lane == FT_TL_H2D ? FT_STREAM_H2D : lane == FT_TL_D2H ? FT_STREAM_D2H : FT_STREAM_COMPUTE;
        if (e->be->ops->event_record(e->be, k->ev0, bl)) return -1;
        return (int)e->tl_n_marks++;
    }
    return -1;
}

static void tl_close(ft_exec *e, int mark)
{
    if (mark < 0 || !e->tl) return;
    ft_tl_mark *k = &e->tl_marks[mark];
    if (k->ev0 < 0) {
        k->h1 = now_s() - e->tl_host0;
        return;
    }
    int bl = k->lane == FT_TL_H2D ? FT_STREAM_H2D : k->lane == FT_TL_D2H ? FT_STREAM_D2H : FT_STREAM_COMPUTE;
    e->be->ops->event_record(e->be, k->ev1, bl);
}

static void tl_host(ft_exec *e, int lane, int kind, int64_t layer, double h0, double h1)
{
    if (!e->tl || !e->tl_marks || e->tl_n_marks >= 4 * (2 * e->m->cfg.num_hidden_layers + 8)) return;
    ft_tl_mark *k = &e->tl_marks[e->tl_n_marks++];
    k->ev0 = k->ev1 = -1;
    k->h0 = h0 - e->tl_host0;
    k->h1 = h1 - e->tl_host0;
    k->lane = lane;
    k->kind = kind;
    k->layer = layer;
}

void ft_exec_set_timeline(ft_exec *e, struct ft_timeline *tl)
{
    e->tl = tl;
    if (tl && !e->tl_marks)
        e->tl_marks = calloc((size_t)(4 * (2 * e->m->cfg.num_hidden_layers + 8)), sizeof *e->tl_marks);
}

/* ---- placing the blocks -------------------------------------------------------------- */

static int dpf_start(ft_exec *e, int64_t from);

/* The disk read-ahead's wait before refilling staging buffer h: its last H2D copy done. Runs
 * on the read-ahead thread (user: the backend). */
static int stage_wait(void *user, int h)
{
    ft_backend *be = user;
    return be->ops->event_sync(be, EV_STAGE(h));
}

int ft_exec_nf4_gemm_mode(const ft_backend *be)
{
    if (be->ops->host_memory || !(be->ops->weight_types & FT_WTYPE_BIT(FT_WTYPE_NF4)))
        return FT_NF4_GEMM_DEQUANT;
    int v = be->tune.nf4_gemm;
    return v == FT_NF4_GEMM_FUSED || v == FT_NF4_GEMM_AUTO ? v : FT_NF4_GEMM_DEQUANT;
}

/* 1 when projection k's NF4 weight goes to the fused GEMM (fused mode, and the kernels take
 * its shape and block sizes). */
static int proj_fused(int fused, const ft_pack_hdr *h, int64_t out, int64_t in)
{
    return fused && h->quant == FT_PACK_QUANT_NF4 &&
           ft_nf4_fusable(out, in, h->blocksize, h->nested_blocksize);
}

/* Floats of the bf16 staging one layer's dequantized projections need (16 at least; a bf16
 * pack's projections are read in place from their block, bind_block). */
static int64_t staging_floats(const ft_model *m, const ft_pack_file *pack, int fused)
{
    int64_t n = 16;
    if (ft_pack_header(pack)->quant != FT_PACK_QUANT_NF4) return n;
    for (int k = 0; k < FT_N_PROJ; k++) {
        const ft_linear *li = &m->layers[0].proj[k];
        if (!proj_fused(fused, ft_pack_header(pack), li->out_n, li->in_n))
            n += (li->out_n * li->in_n + 1) / 2 + 16;
    }
    return n;
}

size_t ft_exec_staging_bytes(const ft_model *m, const ft_pack_file *pack, int nf4_fused)
{
    return (size_t)staging_floats(m, pack, nf4_fused) * sizeof(float);
}

size_t ft_exec_packed_weight_bytes(const ft_backend *be, const ft_model *m, const ft_pack_file *pack,
                                   int nf4_fused)
{
    (void)be;
    size_t total = ft_exec_global_bytes(m) + ft_exec_staging_bytes(m, pack, nf4_fused);
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) total += ft_pack_block_bytes(pack, l);
    return total;
}

/* Rows [0, V) of the (V, C) global tensor `role` as fp32 into dst (backend memory): straight
 * in on a host-memory backend (buf NULL), else in chunks of `rows` rows through the host
 * buffer buf. */
static int read_table_f32(ft_exec *e, ft_pack_file *pack, int role, float *dst, float *buf,
                          int64_t rows)
{
    ft_backend *be = e->be;
    const int64_t C = e->m->cfg.hidden_size, V = e->m->cfg.vocab_size;
    int rc = 0;
    for (int64_t r = 0; r < V && !rc; r += rows) {
        int64_t k = V - r < rows ? V - r : rows;
        if (!buf) {
            rc = ft_pack_read_global(pack, role, r, k, dst + r * C);
        } else {
            rc = ft_pack_read_global(pack, role, r, k, buf);
            if (!rc) rc = be->ops->copy(be, dst + r * C, buf, (size_t)(k * C) * sizeof(float));
        }
    }
    return rc;
}

/* Rows [0, V) of the (V, C) global tensor `role` (stored BF16) as bf16 into dst (host memory):
 * read widened (ft_pack_read_global) in chunks through buf (rows * C floats) and narrowed back,
 * exact (the low 16 bits of a widened bf16 are 0): a truncation, not ft_quant_f32_to_bf16,
 * which would set the quiet bit of a signalling NaN. */
static int read_table_bf16(ft_exec *e, ft_pack_file *pack, int role, uint16_t *dst, float *buf,
                           int64_t rows)
{
    const int64_t C = e->m->cfg.hidden_size, V = e->m->cfg.vocab_size;
    for (int64_t r = 0; r < V; r += rows) {
        const int64_t k = V - r < rows ? V - r : rows, n = k * C;
        FT_TRY(ft_pack_read_global(pack, role, r, k, buf));
        uint16_t *to = dst + r * C;
#pragma omp parallel for schedule(static) if (n > 262144)
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &buf[i], 4);
            to[i] = (uint16_t)(u >> 16);
        }
    }
    return 0;
}

/* 1 when a pack-only model's embeddings and LM head stay in bf16 on backend be (exec.h
 * globals_lazy): a host-memory backend with lm_head_logits_bf16, unless be->tune.gen_head_f32
 * (the program's FTUNE_GEN_HEAD=f32). */
static int globals_in_bf16(const ft_backend *be)
{
    return be->ops->host_memory && be->ops->lm_head_logits_bf16 && !be->tune.gen_head_f32;
}

/* The global tensors of a pack-only model: final norm and LM head into device memory in row
 * chunks through one host buffer (tied: the LM head is the embedding table, which the
 * embeddings then read on the device too); an untied model's embeddings stay in the file
 * (gathered per token, ft_exec_embed_from_pack). On a host-memory backend everything goes
 * into host memory, embeddings included: in bf16 as the pack stores them (globals_lazy, with
 * lm_head_logits_bf16), or in fp32 (be->tune.gen_head_f32, or a backend without it). */
int ft_exec_globals_from_pack(ft_exec *e, ft_pack_file *pack)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t C = c->hidden_size, V = c->vocab_size;
    int host = !e->on_device, untied = ft_exec_untied(e->m), lazy = globals_in_bf16(be);
    /* a table in the backend's memory per role read: the LM head (untied) and the embeddings
     * (host memory, or a tied model's on a device) */
    int has_head = untied, has_emb = host || !untied;
    size_t n = (size_t)(C + 16) + (size_t)(has_head + has_emb) * (size_t)(V * C);
    e->weights_bytes = n * sizeof(float); /* with globals_lazy: once read in fp32 */
    if (lazy) n = (size_t)(C + 16);       /* the final norm only; the tables in bf16 below */
    e->weights = be->ops->alloc(be, n * sizeof(float));
    if (!e->weights)
        return ft_err(-ENOMEM, "out of %s memory for the LM head and final norm (%.2f GiB)",
                      be->ops->name, n * sizeof(float) / 1073741824.0);
    float *p = e->weights;
    float *fnorm = ft_carve16(&p, C);
    e->final_norm = fnorm;
    if (lazy) {
        /* bf16 values per table, each table 64-byte aligned */
        const size_t tab = ((size_t)(V * C) + 31) & ~(size_t)31;
        e->globals_bf16 = be->ops->alloc(be, (size_t)(has_head + 1) * tab * sizeof(uint16_t));
        int64_t rows = (int64_t)((1u << 20) / (size_t)(C > 0 ? C : 1));
        if (rows < 1) rows = 1;
        float *buf = malloc((size_t)(rows * C) * sizeof(float)); /* 4 MiB of rows at a time */
        int rc = e->globals_bf16 && buf ? 0
                 : ft_err(-ENOMEM, "out of memory for the embeddings and LM head in bf16 (%.2f GiB)",
                          (has_head + 1) * tab * 2.0 / 1073741824.0);
        if (!rc) rc = ft_pack_read_global(pack, FT_PACK_ROLE_FINAL_NORM, 0, C, fnorm);
        if (!rc) rc = read_table_bf16(e, pack, FT_PACK_ROLE_EMBED, e->globals_bf16, buf, rows);
        if (!rc && has_head)
            rc = read_table_bf16(e, pack, FT_PACK_ROLE_LM_HEAD, e->globals_bf16 + tab, buf, rows);
        free(buf);
        if (rc) return rc;
        e->globals_lazy = 1;
        e->embed_bf16 = e->globals_bf16;
        e->lm_head_bf16 = untied ? e->globals_bf16 + tab : e->globals_bf16;
        return 0;
    }
    float *head = has_head ? ft_carve16(&p, V * C) : NULL;
    float *emb = has_emb ? ft_carve16(&p, V * C) : NULL;
    int64_t rows = (int64_t)((64u << 20) / (size_t)(C * 4));
    if (rows < 1) rows = 1;
    float *buf = host ? NULL : malloc((size_t)(rows * C) * sizeof(float));
    if (!host && !buf) return ft_err(-ENOMEM, "out of host memory reading the pack's globals");
    int rc = 0;
    if (host) rc = ft_pack_read_global(pack, FT_PACK_ROLE_FINAL_NORM, 0, C, fnorm);
    else rc = ft_pack_read_global(pack, FT_PACK_ROLE_FINAL_NORM, 0, C, buf);
    if (!rc && !host) rc = be->ops->copy(be, fnorm, buf, (size_t)C * sizeof(float));
    if (!rc && head) rc = read_table_f32(e, pack, FT_PACK_ROLE_LM_HEAD, head, buf, rows);
    if (!rc && emb) rc = read_table_f32(e, pack, FT_PACK_ROLE_EMBED, emb, buf, rows);
    free(buf);
    if (rc) return rc;
    e->embed = emb;
    e->lm_head = untied ? head : emb;
    if (!emb) { /* an untied model on a device: the embedding rows come from the file */
        e->ids_host = malloc((size_t)e->T_max * sizeof(int32_t));
        e->embed_host = be->ops->host_alloc(be, (size_t)(e->T_max * C) * sizeof(float));
        if (!e->ids_host || !e->embed_host)
            return ft_err(-ENOMEM, "out of host memory for the embedding gather");
    }
    return 0;
}

int ft_exec_globals_f32(ft_exec *e)
{
    if (!e->globals_lazy || e->lm_head) return 0;
    ft_backend *be = e->be;
    const int64_t C = e->m->cfg.hidden_size, V = e->m->cfg.vocab_size;
    const int untied = ft_exec_untied(e->m);
    be->ops->free(be, e->globals_bf16); /* first: the host never holds both */
    e->globals_bf16 = NULL;
    e->embed_bf16 = e->lm_head_bf16 = NULL;
    float *p = e->globals_f32;
    if (!p) /* kept when a read below fails: a later call retries into it */
        p = e->globals_f32 =
            be->ops->alloc(be, (size_t)(1 + untied) * (size_t)(V * C + 16) * sizeof(float));
    if (!p)
        return ft_err(-ENOMEM, "out of %s memory for the embeddings and LM head in fp32 (%.2f GiB)",
                      be->ops->name, (1 + untied) * (double)(V * C) * 4.0 / 1073741824.0);
    /* the layout and reads of ft_exec_globals_from_pack's fp32 tables: head (untied), embeddings */
    float *head = untied ? ft_carve16(&p, V * C) : NULL;
    float *emb = ft_carve16(&p, V * C);
    if (head) FT_TRY(read_table_f32(e, e->pack, FT_PACK_ROLE_LM_HEAD, head, NULL, V));
    FT_TRY(read_table_f32(e, e->pack, FT_PACK_ROLE_EMBED, emb, NULL, V));
    e->embed = emb;
    e->lm_head = untied ? head : emb;
    return 0;
}

int ft_exec_embed_from_pack(ft_exec *e, const int32_t *ids, int64_t T, float *out)
{
    FT_TRY(ft_pack_gather_global(e->pack, FT_PACK_ROLE_EMBED, ids, T, e->embed_host));
    return e->be->ops->copy(e->be, out, e->embed_host,
                            (size_t)(T * e->m->cfg.hidden_size) * sizeof(float));
}

int ft_exec_pack_to_device(ft_exec *e, ft_pack_file *pack)
{
    return ft_exec_use_pack_tiers(e, pack, NULL, 2, 1);
}

int ft_exec_use_pack_tiers(ft_exec *e, ft_pack_file *pack, const uint8_t *tier, int n_slots,
                           int n_stage)
{
    ft_backend *be = e->be;
    const ft_model_config *c = ft_pack_config(pack);
    int64_t L = c->num_hidden_layers;
    if (!e->on_device)
        return ft_err(FT_E_INVALID, "ft_exec_use_pack_tiers: %s is a host-memory backend (use "
                      "ft_exec_use_pack_ex)", be->ops->name);
    if (!be->ops->dequant_nf4 || !(be->ops->weight_types & FT_WTYPE_BIT(FT_WTYPE_BF16)) ||
        !be->ops->copy_async || !be->ops->host_alloc)
        return ft_err(FT_E_UNSUPPORTED, "%s: the %s backend cannot compute from a packed base",
                      ft_pack_path(pack), be->ops->name);
    if (n_slots < 2 || n_slots > 8 || n_stage < 1 || n_stage > 8)
        return ft_err(FT_E_INVALID, "pack tiers: %d slots and %d staging buffers (2..8, 1..8)",
                      n_slots, n_stage);
    size_t raw = ft_pack_max_layer_bytes(pack), dev_total = 0, pin_total = 0;
    int any_stream = 0, any_disk = 0;
    for (int64_t l = 0; l < L; l++) {
        int t = tier ? tier[l] : FT_TIER_GPU;
        if (t == FT_TIER_GPU) dev_total += ft_pack_block_bytes(pack, l);
        else if (t == FT_TIER_HOST) pin_total += ft_pack_block_bytes(pack, l);
        else if (t != FT_TIER_DISK)
            return ft_err(FT_E_INVALID, "pack tiers: layer %lld has tier %d", (long long)l, t);
        any_stream |= t != FT_TIER_GPU;
        any_disk |= t == FT_TIER_DISK;
    }
    int64_t stage_floats = staging_floats(e->m, pack, e->nf4_fused); /* one layer's projections in bf16 */
    e->tier = malloc((size_t)L);
    e->pack_dev_off = calloc((size_t)L, sizeof *e->pack_dev_off);
    e->pack_pin_off = calloc((size_t)L, sizeof *e->pack_pin_off);
    e->pack_dir = calloc((size_t)L, sizeof *e->pack_dir);
    e->pack_dir_n = calloc((size_t)L, sizeof *e->pack_dir_n);
    e->visits = malloc((size_t)(2 * L + 2) * sizeof *e->visits);
    if (!e->tier || !e->pack_dev_off || !e->pack_pin_off || !e->pack_dir || !e->pack_dir_n || !e->visits)
        return ft_err(-ENOMEM, "out of host memory placing the pack %s", ft_pack_path(pack));
    for (int64_t l = 0; l < L; l++) e->tier[l] = tier ? tier[l] : FT_TIER_GPU;
    e->pack = pack;
    if (e->weights_with_layers) { /* a full copy of the layers (ft_exec_init) goes */
        be->ops->free(be, e->weights);
        e->weights = NULL;
        FT_TRY(ft_exec_place_weights(e, 0));
    }
    if (!e->m->embed) FT_TRY(ft_exec_globals_from_pack(e, pack));
    e->pack_dev = be->ops->alloc(be, dev_total ? dev_total : 1);
    e->layer_f32 = be->ops->alloc(be, (size_t)stage_floats * sizeof(float));
    if (!e->pack_dev || !e->layer_f32)
        return ft_err(-ENOMEM, "out of %s memory for the packed base: %.2f GiB of layer blocks "
                      "and %.1f MiB of bf16 staging", be->ops->name, dev_total / 1073741824.0,
                      stage_floats * 4.0 / 1048576.0);
    e->pack_dev_bytes = dev_total;
    if (any_stream) {
        e->n_slots = n_slots;
        e->slot_bytes = raw;
        e->slot_mem = be->ops->alloc(be, (size_t)n_slots * raw);
        if (!e->slot_mem)
            return ft_err(-ENOMEM, "out of %s memory for %d streaming slots of %.1f MiB",
                          be->ops->name, n_slots, raw / 1048576.0);
    }
    int node = ft_pinned_node(be); /* the GPU's NUMA node, -1 if unknown */
    if (pin_total) {
        void *pp = NULL;
        int rc = ft_pinned_alloc(be, pin_total, node, &pp);
        if (rc < 0)
            return ft_err_prefix(rc, "out of pinned host memory for %.2f GiB of layer blocks (lower "
                                 "--host-mem to put more layers on NVMe)", pin_total / 1073741824.0);
        e->pack_pinned = pp;
        e->pack_pinned_bytes = pin_total;
    }
    /* Disk layers need staging; the one-time placement reads through staging too. */
    e->n_stage = any_disk ? n_stage : 1;
    void *sp = NULL;
    int src = ft_pinned_alloc(be, (size_t)e->n_stage * raw, node, &sp);
    if (src < 0)
        return ft_err_prefix(src, "out of pinned host memory for %d staging buffers of %.1f MiB",
                             e->n_stage, raw / 1048576.0);
    e->stage_mem = sp;
    size_t doff = 0, poff = 0;
    for (int64_t l = 0; l < L; l++) {
        size_t nb = ft_pack_block_bytes(pack, l);
        uint8_t *dst = e->tier[l] == FT_TIER_HOST ? e->pack_pinned + poff : e->stage_mem;
        const ft_pack_tensor *dir;
        int64_t n;
        FT_TRY(ft_pack_read_block(pack, l, dst, nb, 1));
        FT_TRY(ft_pack_block_dir(pack, l, dst, &dir, &n));
        e->pack_dir[l] = malloc((size_t)n * sizeof *dir);
        if (!e->pack_dir[l]) return ft_err(-ENOMEM, "out of host memory loading the pack");
        memcpy(e->pack_dir[l], dir, (size_t)n * sizeof *dir);
        e->pack_dir_n[l] = n;
        e->pack_reads++;
        e->pack_dev_off[l] = -1;
        e->pack_pin_off[l] = -1;
        if (e->tier[l] == FT_TIER_GPU) {
            FT_TRY(be->ops->copy(be, e->pack_dev + doff, dst, nb));
            e->pack_dev_off[l] = (int64_t)doff;
            doff += nb;
        } else if (e->tier[l] == FT_TIER_HOST) {
            e->pack_pin_off[l] = (int64_t)poff;
            poff += nb;
        }
    }
    if (!any_disk) { /* staging served the placement only */
        ft_pinned_free(be, e->stage_mem);
        e->stage_mem = NULL;
        e->n_stage = 0;
    } else { /* the disk read-ahead, with the pack reader's queue depth and chunk size */
        ft_dpf_cfg dc = {0};
        dc.path = ft_pack_path(pack);
        ft_pack_reader_params(pack, &dc.queue_depth, &dc.chunk_bytes);
        dc.stage = e->stage_mem;
        dc.stage_bytes = e->slot_bytes;
        dc.n_stage = e->n_stage;
        dc.max_blocks = (int)(4 * L + 4); /* an operation's visits and the next forward */
        dc.buffer_wait = stage_wait;
        dc.user = be;
        dc.register_buffers = 1;
        FT_TRY(ft_disk_prefetch_init(&e->dpf, &dc));
    }
    for (int s = 0; s < 8; s++) e->slot_layer[s] = -1;
    e->cur_slot = -1;
    e->fetched_layer = -1;
    e->n_visits = 0;
    if (e->dpf) FT_TRY(dpf_start(e, 0)); /* the first operation's forward, read ahead from now */
    return 0;
}

void ft_exec_tiers_free(ft_exec *e)
{
    ft_backend *be = e->be;
    if (!be) return;
    ft_disk_prefetch_free(e->dpf); /* first: its reads land in stage_mem */
    e->dpf = NULL;
    if (e->on_device && (e->pack_pinned || e->stage_mem) && /* copies out of them done */
        be->ops->event_record(be, EV_DRAIN, FT_STREAM_H2D) == 0)
        (void)be->ops->event_sync(be, EV_DRAIN);
    ft_pinned_free(be, e->pack_pinned);
    ft_pinned_free(be, e->stage_mem);
    e->pack_pinned = e->stage_mem = NULL;
    if (be->ops->host_free) be->ops->host_free(be, e->embed_host);
    be->ops->free(be, e->slot_mem);
    free(e->tier);
    free(e->pack_pin_off);
    free(e->visits);
    free(e->ids_host);
    free(e->tl_marks);
}

/* ---- streaming ----------------------------------------------------------------------- */

/* Queues the transfer of layer l's block into the next slot of the ring. A disk block comes
 * from the read-ahead's staging buffer (waiting until it is there); one the read-ahead does
 * not have next (a fetch outside the visit list) is read here into a staging buffer after
 * the read-ahead is cancelled, which then restarts from visit `resume` on. Returns 1 (issued,
 * *slot set), 0 (that slot is still busy: nothing done) or an error (a read error of the
 * read-ahead names the file and offset). */
static int issue(ft_exec *e, int64_t l, int64_t resume, int *slot)
{
    int s = (int)(e->slot_ring % e->n_slots);
    if (e->slot_busy[s]) return 0;
    ft_backend *be = e->be;
    size_t nb = ft_pack_block_bytes(e->pack, l);
    uint8_t *dst = e->slot_mem + (size_t)s * e->slot_bytes;
    const uint8_t *src;
    int h = -1, ahead = 0;
    if (e->tier[l] == FT_TIER_HOST) {
        src = e->pack_pinned + e->pack_pin_off[l];
    } else {
        ft_dpf_read rd = {0};
        if (e->dpf) {
            ahead = ft_disk_prefetch_take(e->dpf, l, &h, &rd);
            if (ahead < 0) return ahead;
            if (!ahead) ft_disk_prefetch_cancel(e->dpf);
        }
        if (!ahead) { /* read here, into the buffer after the last one used */
            h = (int)(e->stage_ring % e->n_stage);
            FT_TRY(be->ops->event_sync(be, EV_STAGE(h)));
            rd.t0 = now_s();
            FT_TRY(ft_pack_read_block(e->pack, l, e->stage_mem + (size_t)h * e->slot_bytes, nb, 0));
            rd.t1 = now_s();
            rd.busy = rd.t1 - rd.t0;
        }
        e->stage_ring = h + 1;
        double t0 = rd.t0 > e->tl_host0 ? rd.t0 : e->tl_host0; /* read ahead of the operation */
        if (rd.t1 > t0) tl_host(e, FT_TL_DISK, FT_TL_WEIGHTS, l, t0, rd.t1);
        e->disk_seconds += rd.busy;
        e->disk_bytes += nb;
        e->pack_reads++;
        src = e->stage_mem + (size_t)h * e->slot_bytes;
    }
    FT_TRY(be->ops->event_wait(be, FT_STREAM_H2D, EV_FREE(s)));
    int mk = tl_mark(e, FT_TL_H2D, FT_TL_WEIGHTS, l, 1);
    FT_TRY(be->ops->copy_async(be, FT_STREAM_H2D, dst, src, nb));
    tl_close(e, mk);
    FT_TRY(be->ops->event_record(be, EV_READY(s), FT_STREAM_H2D));
    if (h >= 0) FT_TRY(be->ops->event_record(be, EV_STAGE(h), FT_STREAM_H2D));
    if (ahead) ft_disk_prefetch_release(e->dpf, h);
    else if (h >= 0 && e->dpf) FT_TRY(dpf_start(e, resume));
    e->h2d_bytes += nb;
    e->slot_layer[s] = l;
    e->slot_busy[s] = 1;
    e->slot_ring++;
    *slot = s;
    return 1;
}

/* Issues the operation's next streamed visits while a slot is free. */
static int pump(ft_exec *e)
{
    while (e->next_issue < e->n_visits) {
        int64_t l = e->visits[e->next_issue];
        if (e->tier[l] == FT_TIER_GPU) {
            e->next_issue++;
            continue;
        }
        int s, k = issue(e, l, e->next_issue + 1, &s);
        if (k <= 0) return k;
        e->next_issue++;
    }
    return 0;
}

int ft_exec_begin_op(ft_exec *e, int train)
{
    if (e->tl) {
        FT_TRY(ft_backend_sync(e->be));
        e->tl_n_marks = 0;
        e->tl_next_ev = EV_TL0 + 1;
        FT_TRY(e->be->ops->event_record(e->be, EV_TL0, FT_STREAM_COMPUTE));
        e->tl_host0 = now_s();
    }
    if (!e->tier) return 0;
    int64_t L = e->m->cfg.num_hidden_layers, n = 0;
    /* the layer already fetched and a layer visited twice in a row need no transfer */
    for (int64_t l = 0; l < L; l++)
        if (l != e->fetched_layer || n > 0) e->visits[n++] = l;
    for (int64_t l = L - 1; train && l >= 0; l--)
        if (n == 0 ? l != e->fetched_layer : e->visits[n - 1] != l) e->visits[n++] = l;
    e->n_visits = n;
    e->next_issue = 0;
    if (e->dpf) FT_TRY(dpf_start(e, 0));
    return pump(e);
}

/* Gives the read-ahead the disk blocks of visits[from..n_visits), then those of the next
 * operation's forward as ft_exec_begin_op will list them (0..L-1, less layer 0 when this
 * operation ends on it): read ahead while this one ends, kept if it comes as predicted. */
static int dpf_start(ft_exec *e, int64_t from)
{
    int64_t L = e->m->cfg.num_hidden_layers, n = 0;
    ft_dpf_block *b = ft_disk_prefetch_scratch(e->dpf); /* 4 L + 4 entries: n <= 2 L + L */
    for (int64_t i = from; i < e->n_visits; i++) {
        int64_t l = e->visits[i];
        if (e->tier[l] != FT_TIER_DISK) continue;
        b[n].id = l;
        FT_TRY(ft_pack_block_extent(e->pack, l, &b[n].off, &b[n].bytes));
        n++;
    }
    int64_t last = e->n_visits > 0 ? e->visits[e->n_visits - 1] : e->fetched_layer;
    for (int64_t l = 0; l < L; l++) {
        if ((l == 0 && last == 0) || e->tier[l] != FT_TIER_DISK) continue;
        b[n].id = l;
        FT_TRY(ft_pack_block_extent(e->pack, l, &b[n].off, &b[n].bytes));
        n++;
    }
    int k = ft_disk_prefetch_start(e->dpf, b, (int)n);
    return k < 0 ? k : 0;
}

void ft_exec_io_describe(const ft_exec *e, char *buf, size_t n)
{
    size_t o = 0;
    char where[256];
    if (!n) return;
    buf[0] = 0;
    if (e->pack_pinned) {
        ft_pinned_describe(e->pack_pinned, where, sizeof where);
        o += (size_t)snprintf(buf + o, n - o, "pinned pool: %s", where);
    }
    if (e->stage_mem && o < n) {
        ft_pinned_describe(e->stage_mem, where, sizeof where);
        o += (size_t)snprintf(buf + o, n - o, "%sstaging: %d x %.1f MiB, %s", o ? "; " : "", e->n_stage,
                              e->slot_bytes / 1048576.0, where);
    }
    if (e->dpf && o < n)
        snprintf(buf + o, n - o, "%sdisk read-ahead: %s", o ? "; " : "", ft_disk_prefetch_mode(e->dpf));
}

/* The compute queued for the current layer is all there: its slot may be refilled once the
 * GPU passes this point. */
static int release_current(ft_exec *e)
{
    if (e->cur_slot < 0) return 0;
    int s = e->cur_slot;
    FT_TRY(e->be->ops->event_record(e->be, EV_FREE(s), FT_STREAM_COMPUTE));
    e->slot_busy[s] = 0;
    e->cur_slot = -1;
    return 0;
}

static int bind_block(ft_exec *e, int64_t l, const uint8_t *blk, const ft_pack_tensor *dir,
                      int64_t n_dir);

int ft_exec_fetch_device(ft_exec *e, int64_t l, const ft_layer_weights **w)
{
    ft_backend *be = e->be;
    *w = &e->fetched;
    if (e->fetched_layer == l) return 0;
    FT_TRY(release_current(e));
    e->fetched_layer = -1;
    const uint8_t *blk;
    FT_TRY(pump(e));
    if (e->tier[l] == FT_TIER_GPU) {
        blk = e->pack_dev + e->pack_dev_off[l];
    } else {
        int s = -1;
        for (int i = 0; i < e->n_slots; i++)
            if (e->slot_busy[i] && e->slot_layer[i] == l) s = i;
        if (s < 0) { /* not in this operation's visit list: fetch it now */
            int k = issue(e, l, e->next_issue, &s);
            if (k < 0) return k;
            if (k == 0)
                return ft_err(FT_E_INVALID, "executor: no free slot for layer %lld", (long long)l);
        }
        FT_TRY(be->ops->event_wait(be, FT_STREAM_COMPUTE, EV_READY(s)));
        e->cur_slot = s;
        blk = e->slot_mem + (size_t)s * e->slot_bytes;
    }
    FT_TRY(bind_block(e, l, blk, e->pack_dir[l], e->pack_dir_n[l]));
    e->fetched_layer = l;
    return 0;
}

/* Points e->fetched at layer l's weights in a block that is (or will be, in stream order) in
 * device memory at blk: F32 norms and biases and BF16 projections in place, NF4 projections
 * described for the fused GEMM (e->nf4_fused, in place too) or dequantized into the bf16
 * staging (layer_f32). */
static int bind_block(ft_exec *e, int64_t l, const uint8_t *blk, const ft_pack_tensor *dir,
                      int64_t n_dir)
{
    ft_backend *be = e->be;
    ft_layer_weights *f = &e->fetched;
    memset(f, 0, sizeof *f);
    for (int k = 0; k < FT_N_PROJ; k++) { /* shapes from the model; pointers from the block */
        f->proj[k].out_n = e->m->layers[l].proj[k].out_n;
        f->proj[k].in_n = e->m->layers[l].proj[k].in_n;
    }
    float *stage = e->layer_f32;
    for (int64_t i = 0; i < n_dir; i++) {
        const ft_pack_tensor *r = &dir[i];
        const void *data = blk + r->data_off;
        if (r->role < FT_PACK_ROLE_W0 || r->role >= FT_PACK_ROLE_B0) { /* norms, biases */
            if (r->dtype != FT_PACK_DT_F32)
                return ft_err(FT_E_CORRUPT, "%s: layer %lld: tensor role %u is not F32",
                              ft_pack_path(e->pack), (long long)l, r->role);
            float *p = (float *)data;
            if (r->role == FT_PACK_ROLE_ATTN_NORM) f->attn_norm = p;
            else if (r->role == FT_PACK_ROLE_FFN_NORM) f->ffn_norm = p;
            else if (r->role == FT_PACK_ROLE_Q_NORM) f->q_norm = p;
            else if (r->role == FT_PACK_ROLE_K_NORM) f->k_norm = p;
            else f->proj[r->role - FT_PACK_ROLE_B0].b = p;
            continue;
        }
        ft_linear *li = &f->proj[r->role - FT_PACK_ROLE_W0];
        li->wtype = FT_WTYPE_BF16;
        if (r->dtype == FT_PACK_DT_BF16) {
            li->w = (float *)data;
            continue;
        }
        if (r->dtype != FT_PACK_DT_NF4)
            return ft_err(FT_E_CORRUPT, "%s: layer %lld: projection of dtype %u", ft_pack_path(e->pack),
                          (long long)l, r->dtype);
        if (r->rows != li->out_n || r->cols != li->in_n)
            return ft_err(FT_E_CORRUPT, "%s: layer %lld: %s is %lld x %lld, the model's is %lld x %lld",
                          ft_pack_path(e->pack), (long long)l, ft_proj_name[r->role - FT_PACK_ROLE_W0],
                          (long long)r->rows, (long long)r->cols, (long long)li->out_n, (long long)li->in_n);
        ft_nf4_tensor t;
        ft_pack_record_nf4(r, blk, &t);
        int k = r->role - FT_PACK_ROLE_W0;
        const ft_pack_hdr *h = ft_pack_header(e->pack);
        if (proj_fused(e->nf4_fused, h, li->out_n, li->in_n)) { /* no staging was sized for it */
            if (r->blocksize != h->blocksize || r->nested_blocksize != h->nested_blocksize)
                return ft_err(FT_E_CORRUPT, "%s: layer %lld: %s has block sizes %lld/%lld, the "
                              "header says %u/%u", ft_pack_path(e->pack), (long long)l,
                              ft_proj_name[k], (long long)r->blocksize,
                              (long long)r->nested_blocksize, h->blocksize, h->nested_blocksize);
            e->fetched_nf4[k] = t;
            li->wtype = FT_WTYPE_NF4;
            li->nf4 = &e->fetched_nf4[k];
            continue;
        }
        FT_TRY(be->ops->dequant_nf4(be, (uint16_t *)stage, &t));
        li->w = stage;
        stage += (t.n + 1) / 2 + 16 - ((t.n + 1) / 2) % 16;
    }
    int complete = f->attn_norm && f->ffn_norm &&
                   (!e->m->cfg.qk_norm || (f->q_norm && f->k_norm));
    /* which projections carry a bias comes from the config, by the pack builder's rule (the
     * model's own bias pointers are NULL on a pack-only model) */
    for (int k = 0; k < FT_N_PROJ; k++)
        complete &= (f->proj[k].w || f->proj[k].nf4) &&
                    (!ft_pack_has_bias(&e->m->cfg, k) || f->proj[k].b);
    if (!complete)
        return ft_err(FT_E_CORRUPT, "%s: layer %lld: the block lacks a norm, projection or bias",
                      ft_pack_path(e->pack), (long long)l);
    return 0;
}


int ft_exec_op_end(ft_exec *e)
{
    if (!e->tl) return 0;
    ft_backend *be = e->be;
    FT_TRY(ft_backend_sync(be));
    for (int l = 1; l < FT_N_LANES; l++) { /* the copy lanes' last events */
        int ev = e->tl_next_ev < FT_MAX_EVENTS ? e->tl_next_ev : -1;
        if (ev < 0) break;
        FT_TRY(be->ops->event_record(be, ev, l));
        FT_TRY(be->ops->event_sync(be, ev));
    }
    for (int64_t i = 0; i < e->tl_n_marks; i++) {
        ft_tl_mark *k = &e->tl_marks[i];
        double t0 = k->h0, t1 = k->h1;
        if (k->ev0 >= 0) {
            float a = 0, b = 0;
            if (be->ops->event_elapsed(be, EV_TL0, k->ev0, &a) ||
                be->ops->event_elapsed(be, EV_TL0, k->ev1, &b))
                continue; /* an unrecorded end (a mark left open): skip it */
            t0 = a * 1e-3;
            t1 = b * 1e-3;
        }
        FT_TRY(ft_timeline_add(e->tl, k->lane, k->kind, k->layer, -1, t0, t1 > t0 ? t1 : t0));
    }
    e->tl_n_marks = 0;
    return 0;
}

int ft_exec_tl_begin(ft_exec *e, int lane, int kind, int64_t layer)
{
    return tl_mark(e, lane, kind, layer, 1);
}

void ft_exec_tl_end(ft_exec *e, int mark)
{
    tl_close(e, mark);
}

/* ---- the planner's probe ------------------------------------------------------------- */

int ft_exec_probe_layer(ft_exec *e, ft_pack_file *pack, int64_t T, const int32_t *pos_in,
                        const int32_t *seq_start_in, double *t_dequant, double *t_fwd, double *t_bwd,
                        float *out)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    *t_dequant = *t_fwd = *t_bwd = 0;
    if (!e->on_device || T > e->T_max || T < 1)
        return ft_err(FT_E_INVALID, "probe: needs a device backend and T <= %lld", (long long)e->T_max);
    size_t nb = ft_pack_block_bytes(pack, 0);
    int64_t C = c->hidden_size, stage_floats = staging_floats(e->m, pack, e->nf4_fused);
    uint8_t *host = be->ops->host_alloc(be, nb);
    uint8_t *dev = be->ops->alloc(be, nb);
    float *stage = be->ops->alloc(be, (size_t)stage_floats * sizeof(float));
    float *x = malloc((size_t)(T * C) * sizeof(float));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t)), *ss = malloc((size_t)T * sizeof(int32_t));
    int rc = host && dev && stage && x && pos && ss ? 0 : ft_err(-ENOMEM, "probe: out of memory");
    const ft_pack_tensor *dir = NULL;
    int64_t n_dir = 0;
    if (!rc) rc = ft_pack_read_block(pack, 0, host, nb, 1);
    if (!rc) rc = ft_pack_block_dir(pack, 0, host, &dir, &n_dir);
    if (!rc) rc = be->ops->copy(be, dev, host, nb);
    /* a realistic input: unit-variance values (never zeros) */
    uint64_t z = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; !rc && i < T * C; i++) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        x[i] = (float)((int64_t)(z >> 40) - (1 << 23)) / (float)(1 << 23) * 1.7f;
    }
    for (int64_t t = 0; !rc && t < T; t++) { /* the data's sequence layout, else 512-token ones */
        pos[t] = pos_in ? pos_in[t] : (int32_t)(t % 512);
        ss[t] = seq_start_in ? seq_start_in[t] : (int32_t)(t - t % 512);
    }
    float *dx = e->dx, *x0 = e->ckpt, *x1 = e->ckpt + e->T_max * C;
    if (!rc) rc = be->ops->copy(be, x0, x, (size_t)(T * C) * sizeof(float));
    if (!rc) rc = be->ops->copy(be, dx, x, (size_t)(T * C) * sizeof(float));
    if (!rc) rc = be->ops->copy(be, e->pos, pos, (size_t)T * sizeof(int32_t));
    if (!rc) rc = be->ops->copy(be, e->seq_start, ss, (size_t)T * sizeof(int32_t));
    float *saved = e->layer_f32;
    ft_pack_file *saved_pack = e->pack;
    e->layer_f32 = stage;
    e->pack = pack;
    ft_block_dims d = {T, C, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                       c->intermediate_size, e->r_max}; /* as ft_exec_dims */
    ft_block_io io = {e->pos, e->seq_start, e->inv_freq, 0};
    double best[3] = {1e30, 1e30, 1e30};
    for (int rep = 0; rep < 3 && !rc; rep++) { /* the first is a warm-up; best of the others */
        double t0 = now_s();
        rc = bind_block(e, 0, dev, dir, n_dir);
        if (!rc) rc = ft_backend_sync(be);
        double t1 = now_s();
        if (!rc) rc = ft_block_fwd(be, c, &e->fetched, e->lora, 0, &d, &io, x0, x1, &e->acts, &e->scr, 1);
        if (!rc) rc = ft_backend_sync(be);
        double t2 = now_s();
        if (!rc) rc = ft_block_bwd(be, c, &e->fetched, e->lora, 0, &d, &io, x0, dx, dx, &e->acts, &e->scr);
        if (!rc) rc = ft_backend_sync(be);
        double t3 = now_s();
        if (rep > 0) {
            best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
            best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
            best[2] = t3 - t2 < best[2] ? t3 - t2 : best[2];
        }
    }
    if (!rc && out) rc = be->ops->copy(be, out, x1, (size_t)(T * C) * sizeof(float));
    if (!rc && out) rc = be->ops->copy(be, out + T * C, dx, (size_t)(T * C) * sizeof(float));
    e->layer_f32 = saved;
    e->pack = saved_pack;
    memset(&e->fetched, 0, sizeof e->fetched);
    e->fetched_layer = -1;
    if (!rc) {
        *t_dequant = best[0];
        *t_fwd = best[1];
        *t_bwd = best[2];
    }
    /* the probe's gradients must not reach the first step */
    if (!rc && e->lora) rc = be->ops->zero(be, e->lora->grads, (size_t)e->lora->n_params * sizeof(float));
    be->ops->host_free(be, host);
    be->ops->free(be, dev);
    be->ops->free(be, stage);
    free(x);
    free(pos);
    free(ss);
    return rc;
}
