/* plan.c - the offload planner (see plan.h).
 *
 * Memory (bytes; m = micro-batches, L = layers, k = GPU-resident layers, s = L - k streamed,
 * j of them in the pinned-host pool, d = s - j on NVMe):
 *   device = gpu_fixed + k * layer_bytes + depth(s) * slot_bytes
 *          + (checkpoints on the GPU ? (L + 1) * m * ckpt_bytes : (e + S) * m * ckpt_bytes)
 *          + m * per_micro_bytes + (keep_acts ? L * m * kept_bytes : 0)
 *   host   = j * layer_bytes + host_slots * layer_bytes
 *          + (checkpoints on the host ? max(0, L - e - (S - 1)) * m * ckpt_bytes : 0)
 * depth(s) = 2 when s > 0: two device slots (the copy of the next streamed layer overlaps
 * the compute of this one; the executor takes 2..8). host_slots = min(d, 3) pinned staging
 * buffers for io_uring reads. Host checkpoints (offload/actckpt.h): S = 2 device sets of m
 * buffers (a layer's inputs and outputs in the forward; this layer's checkpoints and the next
 * one's load in the backward) and the inputs of the last e layers kept on the device, e being
 * what the device budget holds after the layers are placed (at most L - S: the layers are
 * worth more per byte, a resident layer saving 2 layer_bytes of H2D per step, a kept
 * checkpoint layer m * ckpt_bytes each way); the last S - 1 checkpoints carried by the sets
 * stay there from the forward to the backward, so only L - e - (S - 1) layers' go to the
 * host. host_fixed (process, dataset,
 * tokenizer) is not charged to --host-mem, which bounds the pinned pool only: it is reported
 * by ft_plan_format and left to the caller to compare with the machine's memory.
 * On a host backend (device == 0) the "GPU" tier is host memory under gpu_budget, there is
 * no pinned-host tier and nothing crosses PCIe: layers are resident or read from NVMe
 * straight into the prefetch slots, checkpoints stay in memory, host_bytes is 0.
 *
 * Placement (greedy, per micro-batch count and checkpoint/activation option): the most
 * layers the device budget holds are resident, and they are the LAST layers (highest index):
 * the backward starts there, so the turn from forward to backward has no copy to wait for,
 * and the forward's first streamed copies overlap the previous step's backward. The other
 * layers go to the pinned pool while the host budget holds them, the rest to NVMe (packed
 * bases only), spread evenly among the streamed ones so that disk reads run ahead (up to
 * host_slots) during the visits of pool layers instead of queueing back to back.
 * Options compared by predicted step time: checkpoints on the GPU with activations kept
 * (when kept_bytes > 0), on the GPU recomputed, on the host (device only); at equal times the
 * one with fewer busy seconds on the H2D, D2H and disk lanes wins (more slack for jitter),
 * then the first. rates.d2h == 0 (unknown) keeps the checkpoints on the device in every
 * plan and in ft_plan_min_budgets (a caller that cannot offload them sets it so);
 * ckpt_host_only (with d2h > 0) considers host checkpoints only; an unknown h2d or disk rate
 * that a fitting plan needs is an error (FT_E_INVALID).
 * Micro-batch count (when in->micro_batches is 0): the smallest m in 1..max_micro_batches
 * whose best option reaches t_compute / t_step >= 0.9, i.e. >= 0.9 of the compute-bound
 * tokens/s of the same m with every layer resident; if none does, the m with the best
 * tokens/s.
 *
 * Step time. Per micro-batch: f = t_fwd_layer (or flops_fwd_layer / rates.flops), b =
 * t_bwd_layer, h = t_head; per layer visit v = t_visit (the weights' binding: an NF4 layer
 * dequantized once per visit for all its micro-batches). Visits of one step: forward 0..L-1
 * (compute v + m*f), head (m*h), backward L-1..0 (compute v + m*((keep ? 0 : f) + b)). A streamed
 * visit copies its layer: x = layer_bytes / h2d from the pool; from NVMe a read r = layer_bytes /
 * disk into a host slot and the same copy (device == 0: only the read, into the slot). Once the
 * pipeline is full each visit costs
 *     t_visit = max(compute, x + ckpt_load, ckpt_store, r)
 * (ckpt_load = m * ckpt_bytes / h2d per backward visit and ckpt_store = m * ckpt_bytes / d2h
 * per forward visit, for the layers whose checkpoints go to the host), and
 *     t_step ~= sum over the 2L + 1 visits of t_visit + pipeline fill.
 * The code computes this exactly as a max-plus recurrence over four in-order lanes (disk,
 * H2D, D2H, compute) with the slots as constraints: a copy waits for its lane, its read and a
 * free device slot (freed when the compute of the visit holding it ends); a read waits for a
 * free host slot (freed when its copy ends); a compute waits for the previous compute, its
 * weights and its checkpoints. Checkpoints follow the executor's sets: the forward visit of
 * layer l writes checkpoint l + 1 into the next set (waiting until the set's previous store
 * has ended) and its store starts on the D2H lane when the compute ends; the backward visit
 * of layer l loads checkpoint l into the set freed longest ago (after the D2H lane has
 * drained: on the device the loads share the checkpoint lane with the stores), on the H2D
 * lane in turn with the weight copies (they share the bus's H2D direction; on the device
 * they run on the checkpoint lane), and its compute waits for it. A layer visited twice in a
 * row (the last layer around the head, layer 0 from one step's backward to the next forward)
 * keeps its slot and is not fetched again, as the executor does. Three steps are run and the
 * last one's length is the prediction (the steady state). t_compute, t_h2d, t_d2h and t_disk
 * are the busy seconds of the compute, H2D, D2H and disk lanes in one step; the bound is the
 * lane whose per-visit maxima sum largest (compute wins ties).
 */
#include "offload/plan.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "src/core/err.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define PLAN_DEPTH 2        /* device slots when any layer streams */
#define PLAN_HOST_SLOTS 3   /* pinned staging buffers for NVMe reads */
#define PLAN_MAX_SLOTS 16   /* the most slots ft_plan_step_seconds accepts in a plan */
#define PLAN_DEFAULT_MICRO 16
#define PLAN_TARGET 0.9     /* fraction of the compute-bound rate the micro-batch pick aims at */
#define PLAN_SIM_STEPS 3
#define PLAN_CKPT_SETS 2    /* device checkpoint sets the planner asks for (executor: 2..4) */
#define PLAN_MAX_CKPT_SETS 4

/* Per-micro-batch compute seconds (f, b, h) and per-visit seconds (v). */
typedef struct {
    double f, b, h, v;
} cost;

enum { NEED_H2D = 1, NEED_D2H = 2, NEED_DISK = 4 };

static uint64_t add_u(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static uint64_t mul_u(uint64_t a, uint64_t b) { return b && a > UINT64_MAX / b ? UINT64_MAX : a * b; }
static double gib(uint64_t x) { return (double)x / GIB; }
/* x in GiB rounded up to 0.1, so that the printed budget is enough. */
static double gib_up(uint64_t x) { return ceil((double)x * 10.0 / GIB) / 10.0; }

static int bad_rate(double r) { return !(r >= 0) || isinf(r); } /* NaN, negative, Inf */

static int check_in(const ft_plan_in *in, cost *c)
{
    if (!in) return ft_err(FT_E_INVALID, "offload plan: no input");
    if (in->n_layers < 1 || in->n_layers > FT_PLAN_MAX_LAYERS)
        return ft_err(FT_E_INVALID, "offload plan: %lld layers (expected 1..%d)",
                      (long long)in->n_layers, FT_PLAN_MAX_LAYERS);
    if (!in->layer_bytes) return ft_err(FT_E_INVALID, "offload plan: layer_bytes is 0");
    if (in->slot_bytes && in->slot_bytes < in->layer_bytes)
        return ft_err(FT_E_INVALID, "offload plan: slot_bytes %llu smaller than layer_bytes %llu",
                      (unsigned long long)in->slot_bytes, (unsigned long long)in->layer_bytes);
    if (in->tokens_per_micro < 1)
        return ft_err(FT_E_INVALID, "offload plan: tokens_per_micro %lld (expected >= 1)",
                      (long long)in->tokens_per_micro);
    if (in->micro_batches < 0 || in->max_micro_batches < 0 || in->micro_batches > 1000000 ||
        in->max_micro_batches > 1000000)
        return ft_err(FT_E_INVALID, "offload plan: micro_batches %lld, max_micro_batches %lld "
                      "(expected 0..1000000)", (long long)in->micro_batches,
                      (long long)in->max_micro_batches);
    const ft_plan_rates *r = &in->rates;
    if (bad_rate(r->h2d) || bad_rate(r->d2h) || bad_rate(r->disk) || bad_rate(r->flops))
        return ft_err(FT_E_INVALID, "offload plan: rates must be finite and >= 0 (h2d %g, d2h %g, "
                      "disk %g, flops %g)", r->h2d, r->d2h, r->disk, r->flops);
    const double *tv[3] = {&in->t_fwd_layer, &in->t_bwd_layer, &in->t_head};
    const double *fv[3] = {&in->flops_fwd_layer, &in->flops_bwd_layer, &in->flops_head};
    static const char *nm[3] = {"layer forward", "layer backward", "head"};
    double out[3];
    for (int i = 0; i < 3; i++) {
        double t = *tv[i], fl = *fv[i];
        if (bad_rate(t) || bad_rate(fl))
            return ft_err(FT_E_INVALID, "offload plan: %s time %g s / %g FLOP must be finite and >= 0",
                          nm[i], t, fl);
        if (t > 0) out[i] = t;
        else if (i == 1 && in->forward_only) out[i] = 0; /* no backward visits */
        else if (fl > 0 && r->flops > 0) out[i] = fl / r->flops;
        else if (i == 2 && fl == 0) out[i] = 0; /* no head cost given: none counted */
        else
            return ft_err(FT_E_INVALID, "offload plan: the %s time is unknown (t_* is 0 and %s)", nm[i],
                          fl > 0 ? "rates.flops is 0" : "its FLOP count is 0");
    }
    if (bad_rate(in->t_visit))
        return ft_err(FT_E_INVALID, "offload plan: the per-visit time %g s must be finite and >= 0",
                      in->t_visit);
    c->f = out[0];
    c->b = out[1];
    c->h = out[2];
    c->v = in->t_visit;
    return 0;
}

static uint64_t slot_of(const ft_plan_in *in) { return in->slot_bytes ? in->slot_bytes : in->layer_bytes; }
static int depth_for(int64_t streamed) { return streamed <= 0 ? 0 : PLAN_DEPTH; }
/* Checkpoints may go to the host: a device backend with a known d2h rate, in a run with a
 * backward to load them for. */
static int ckpt_host_ok(const ft_plan_in *in)
{
    return in->device && in->rates.d2h > 0 && !in->forward_only;
}
/* The checkpoint tiers to consider, ck_lo(in)..ck_hi(in). */
static int ck_lo(const ft_plan_in *in)
{
    return in->ckpt_host_only && ckpt_host_ok(in) ? FT_TIER_HOST : FT_TIER_GPU;
}
static int ck_hi(const ft_plan_in *in) { return ckpt_host_ok(in) ? FT_TIER_HOST : FT_TIER_GPU; }
static int hslots_for(const ft_plan_in *in, int64_t disk)
{
    return in->device && disk > 0 ? (int)(disk < PLAN_HOST_SLOTS ? disk : PLAN_HOST_SLOTS) : 0;
}

static uint64_t ckpt_all(const ft_plan_in *in, int64_t m)
{
    return mul_u(mul_u((uint64_t)in->n_layers + 1, (uint64_t)m), in->ckpt_bytes);
}

/* Layers whose checkpoints go to the host with e of them kept on the device and S sets. */
static int64_t ckpt_host_layers(int64_t L, int64_t e, int S)
{
    int64_t n = L - e - (S - 1);
    return n > 0 ? n : 0;
}

/* Device bytes of the checkpoints (tier ck; e and S only for the host tier). */
static uint64_t ckpt_gpu(const ft_plan_in *in, int64_t m, int ck, int64_t e, int S)
{
    if (ck == FT_TIER_GPU) return ckpt_all(in, m);
    return mul_u(mul_u((uint64_t)(e + S), (uint64_t)m), in->ckpt_bytes);
}

static uint64_t ckpt_host(const ft_plan_in *in, int64_t m, int ck, int64_t e, int S)
{
    if (ck != FT_TIER_HOST) return 0;
    return mul_u(mul_u((uint64_t)ckpt_host_layers(in->n_layers, e, S), (uint64_t)m), in->ckpt_bytes);
}

/* Device bytes of a configuration (the formula at the top); host checkpoints with e layers
 * kept on the device and PLAN_CKPT_SETS sets. */
static uint64_t gpu_need_e(const ft_plan_in *in, int64_t m, int64_t k, int depth, int ck, int keep,
                           int64_t e)
{
    uint64_t g = add_u(in->gpu_fixed, mul_u((uint64_t)k, in->layer_bytes));
    g = add_u(g, mul_u((uint64_t)depth, slot_of(in)));
    g = add_u(g, ckpt_gpu(in, m, ck, e, PLAN_CKPT_SETS));
    g = add_u(g, mul_u((uint64_t)m, in->per_micro_bytes));
    if (keep) g = add_u(g, mul_u(mul_u((uint64_t)in->n_layers, (uint64_t)m), in->kept_bytes));
    return g;
}

static uint64_t gpu_need(const ft_plan_in *in, int64_t m, int64_t k, int depth, int ck, int keep)
{
    return gpu_need_e(in, m, k, depth, ck, keep, 0);
}

/* Host (pinned pool) bytes: j pool layers, d NVMe layers, e checkpoint layers on the device. */
static uint64_t host_need_e(const ft_plan_in *in, int64_t m, int64_t j, int64_t d, int ck, int64_t e)
{
    if (!in->device) return 0;
    uint64_t h = mul_u((uint64_t)(j + hslots_for(in, d)), in->layer_bytes);
    return add_u(h, ckpt_host(in, m, ck, e, PLAN_CKPT_SETS));
}

static uint64_t host_need(const ft_plan_in *in, int64_t m, int64_t j, int64_t d, int ck)
{
    return host_need_e(in, m, j, d, ck, 0);
}

/* The least host bytes with s streamed layers (placement aside), or UINT64_MAX when s layers
 * cannot stream at all (a host backend without a pack). */
static uint64_t host_min(const ft_plan_in *in, int64_t m, int64_t s, int ck)
{
    if (s > 0 && !in->device && !in->packed) return UINT64_MAX;
    if (!in->packed) return host_need(in, m, s, 0, ck);
    return host_need(in, m, 0, s, ck); /* min over j of j + min(s - j, 3) is at j = 0 */
}

/* Fills p with the greedy placement of one option under the budgets; returns 0, or 1 when
 * it does not fit. */
static int layout(const ft_plan_in *in, int64_t m, int ck, int keep, uint64_t G, uint64_t H,
                  ft_plan *p)
{
    const int64_t L = in->n_layers;
    int64_t k = L;
    for (; k >= 0; k--)
        if (gpu_need(in, m, k, depth_for(L - k), ck, keep) <= G) break;
    if (k < 0) return 1;
    int64_t s = L - k, j = 0, d = s;
    if (in->device) {
        for (j = s; j >= 0; j--) {
            d = s - j;
            if (d > 0 && !in->packed) continue;
            if (host_need(in, m, j, d, ck) <= H) break;
        }
        if (j < 0) return 1;
    } else if (s > 0 && !in->packed) {
        return 1;
    }
    memset(p, 0, sizeof *p);
    p->n_layers = L;
    for (int64_t l = 0; l < L; l++) p->tier[l] = l >= s ? FT_TIER_GPU : FT_TIER_HOST;
    /* d NVMe layers spread evenly over the s streamed positions (Bresenham, centered) */
    for (int64_t q = 0; q < s && d > 0; q++)
        if (((q + 1) * d + s / 2) / s != (q * d + s / 2) / s) p->tier[q] = FT_TIER_DISK;
    p->n_tier[FT_TIER_GPU] = k;
    p->n_tier[FT_TIER_HOST] = s - d;
    p->n_tier[FT_TIER_DISK] = d;
    p->prefetch_depth = depth_for(s);
    p->host_slots = hslots_for(in, d);
    p->micro_batches = m;
    p->ckpt_tier = ck;
    p->keep_acts = keep;
    int64_t e = 0;
    if (ck == FT_TIER_HOST) { /* the device memory left keeps the last layers' checkpoints */
        uint64_t per = mul_u((uint64_t)m, in->ckpt_bytes);
        uint64_t used = gpu_need(in, m, k, p->prefetch_depth, ck, keep);
        int64_t e_max = L - PLAN_CKPT_SETS > 0 ? L - PLAN_CKPT_SETS : 0;
        e = per ? (int64_t)((G - used) / per) : e_max;
        if (e > e_max) e = e_max;
        p->ckpt_sets = PLAN_CKPT_SETS;
        p->ckpt_dev_layers = e;
        p->ckpt_host_layers = ckpt_host_layers(L, e, PLAN_CKPT_SETS);
    }
    p->ckpt_gpu_bytes = ckpt_gpu(in, m, ck, e, PLAN_CKPT_SETS);
    p->ckpt_host_bytes = ckpt_host(in, m, ck, e, PLAN_CKPT_SETS);
    p->ckpt_freed_bytes = ck == FT_TIER_HOST && ckpt_all(in, m) > p->ckpt_gpu_bytes
                              ? ckpt_all(in, m) - p->ckpt_gpu_bytes : 0;
    p->gpu_bytes = gpu_need_e(in, m, k, p->prefetch_depth, ck, keep, e);
    p->host_bytes = host_need_e(in, m, s - d, d, ck, e);
    return 0;
}

typedef struct {
    double t_step, t_compute, t_h2d, t_d2h, t_disk;
    double sum_c, sum_p, sum_d; /* per-visit maxima by winner */
    int need;                   /* NEED_* rates that are 0 but needed */
} sim_out;

/* The max-plus recurrence described at the top. */
static void simulate(const ft_plan_in *in, const cost *c, const ft_plan *p, sim_out *o)
{
    memset(o, 0, sizeof *o);
    const int64_t L = in->n_layers, m = p->micro_batches;
    const int dev = in->device, ckh = dev && p->ckpt_tier == FT_TIER_HOST;
    const ft_plan_rates *r = &in->rates;
    int streamed = p->n_tier[FT_TIER_HOST] + p->n_tier[FT_TIER_DISK] > 0;
    if (dev && (streamed || ckh) && !(r->h2d > 0)) o->need |= NEED_H2D;
    if (ckh && !(r->d2h > 0)) o->need |= NEED_D2H;
    if (p->n_tier[FT_TIER_DISK] > 0 && !(r->disk > 0)) o->need |= NEED_DISK;
    if (o->need) {
        o->t_step = INFINITY;
        return;
    }
    const double xw = dev && streamed ? (double)in->layer_bytes / r->h2d : 0;
    const double xr = p->n_tier[FT_TIER_DISK] ? (double)in->layer_bytes / r->disk : 0;
    const double ckb = (double)m * (double)in->ckpt_bytes;
    const double xcl = ckh ? ckb / r->h2d : 0, xcs = ckh ? ckb / r->d2h : 0;
    const double cf = c->v + (double)m * c->f,
                 cb = c->v + (double)m * ((p->keep_acts ? 0 : c->f) + c->b), chd = (double)m * c->h;
    /* host checkpoints: S sets; layers >= h keep theirs on the device; < n_st go to the host */
    const int S = !ckh ? 1 : p->ckpt_sets >= 2 ? p->ckpt_sets : PLAN_CKPT_SETS;
    const int64_t h = ckh ? L - p->ckpt_dev_layers : 0, n_st = ckh ? ckpt_host_layers(L, L - h, S) : 0;

    double comp = 0, h2d = 0, d2h = 0, disk = 0, prev_end = 0;
    double slot_free[PLAN_MAX_SLOTS] = {0}, hs_free[PLAN_MAX_SLOTS] = {0};
    double set_free[PLAN_MAX_CKPT_SETS] = {0};
    int64_t set_hold[PLAN_MAX_CKPT_SETS];
    int slot_last = 0;
    int64_t last_layer = -1, ring = 0;
    for (int st = 0; st < PLAN_SIM_STEPS; st++) {
        int acc = st == PLAN_SIM_STEPS - 1;
        prev_end = comp;
        ring = 0;
        for (int i = 0; i < PLAN_MAX_CKPT_SETS; i++) set_hold[i] = -1;
        const int64_t last_v = in->forward_only ? L : 2 * L; /* the head is visit L */
        for (int64_t v = 0; v <= last_v; v++) {
            int fwd = v < L, head = v == L;
            int64_t l = fwd ? v : 2 * L - v;
            double dur = head ? chd : fwd ? cf : cb, ready = comp;
            double t_w = 0, t_r = 0, t_cl = 0, t_cs = 0;
            int uses_slot = 0, s_in = -1, s_out = -1;
            int64_t j_out = -1;
            if (!head) {
                if (p->tier[l] != FT_TIER_GPU) {
                    uses_slot = 1;
                    if (l != last_layer) { /* fetch into the slot freed longest ago */
                        int s = 0;
                        for (int i = 1; i < p->prefetch_depth; i++)
                            if (slot_free[i] < slot_free[s]) s = i;
                        double w_ready;
                        if (p->tier[l] == FT_TIER_DISK && !dev) {
                            double t0 = fmax(disk, slot_free[s]);
                            disk = t0 + xr;
                            w_ready = disk;
                            t_r = xr;
                        } else {
                            double rd_end = 0;
                            int hs = -1;
                            if (p->tier[l] == FT_TIER_DISK) {
                                hs = 0;
                                for (int i = 1; i < p->host_slots; i++)
                                    if (hs_free[i] < hs_free[hs]) hs = i;
                                disk = fmax(disk, hs_free[hs]) + xr;
                                rd_end = disk;
                                t_r = xr;
                            }
                            h2d = fmax(fmax(h2d, slot_free[s]), rd_end) + xw;
                            if (hs >= 0) hs_free[hs] = h2d;
                            w_ready = h2d;
                            t_w = xw;
                        }
                        slot_last = s;
                        ready = fmax(ready, w_ready);
                    }
                }
                last_layer = l;
                if (ckh && fwd && l == 0 && h > 0) { /* checkpoint 0: the embeddings' output */
                    int s0 = (int)(ring++ % S);
                    double emb = fmax(comp, set_free[s0]);
                    ready = fmax(ready, emb);
                    set_hold[s0] = 0;
                    set_free[s0] = emb;
                    if (n_st > 0) {
                        d2h = fmax(d2h, emb) + xcs;
                        set_free[s0] = d2h;
                        t_cs += xcs;
                    }
                }
                if (ckh && l < h) /* the set holding this layer's input */
                    for (int i = 0; i < S; i++)
                        if (set_hold[i] == l) s_in = i;
                if (ckh && fwd && (l + 1 < h || l + 1 == L)) { /* its output into the next set */
                    s_out = (int)(ring++ % S);
                    j_out = l + 1;
                    ready = fmax(ready, set_free[s_out]); /* the set's previous store ended */
                    set_hold[s_out] = j_out;
                } else if (ckh && !fwd && l < h && s_in < 0) { /* load it, into the set freed first */
                    for (int i = 0; i < S; i++)
                        if ((set_hold[i] < 0 || set_hold[i] > l) &&
                            (s_in < 0 || set_free[i] < set_free[s_in]))
                            s_in = i;
                    if (s_in < 0) s_in = 0; /* not reached: every set is free at a load */
                    h2d = fmax(fmax(h2d, set_free[s_in]), d2h) + xcl;
                    ready = fmax(ready, h2d);
                    set_hold[s_in] = l;
                    t_cl = xcl;
                }
            } else if (ckh) {
                for (int i = 0; i < S; i++)
                    if (set_hold[i] == L) s_in = i;
            }
            comp = ready + dur;
            if (uses_slot) slot_free[slot_last] = comp;
            if (s_in >= 0) set_free[s_in] = fmax(set_free[s_in], comp);
            if (s_out >= 0) {
                set_free[s_out] = comp;
                if (j_out < n_st) { /* stored once computed */
                    d2h = fmax(d2h, comp) + xcs;
                    set_free[s_out] = d2h;
                    t_cs += xcs;
                }
            }
            if (acc) {
                double pc = fmax(t_w + t_cl, t_cs);
                o->t_compute += dur;
                o->t_h2d += t_w + t_cl;
                o->t_d2h += t_cs;
                o->t_disk += t_r;
                if (t_r > dur && t_r >= pc) o->sum_d += t_r;
                else if (pc > dur) o->sum_p += pc;
                else o->sum_c += dur;
            }
        }
    }
    o->t_step = comp - prev_end;
}

static const char *bound_of(const sim_out *o)
{
    if (o->sum_c >= o->sum_p && o->sum_c >= o->sum_d) return "compute";
    return o->sum_p >= o->sum_d ? "PCIe" : "disk";
}

static void fill_times(const ft_plan_in *in, ft_plan *p, const sim_out *o)
{
    p->t_step = o->t_step;
    p->t_compute = o->t_compute;
    p->t_h2d = o->t_h2d;
    p->t_d2h = o->t_d2h;
    p->t_disk = o->t_disk;
    p->tokens_per_s = o->t_step > 0 ? (double)p->micro_batches * (double)in->tokens_per_micro / o->t_step : 0;
    p->bound = bound_of(o);
}

/* The smallest device bytes over every configuration with m micro-batches (activations
 * recomputed), and the least host bytes among the configurations within gpu_cap; *k_out,
 * *ck_out: the configuration reaching the host minimum. */
static void min_pair(const ft_plan_in *in, int64_t m, uint64_t gpu_cap, uint64_t *g_min,
                     uint64_t *h_min, int64_t *k_out, int *ck_out)
{
    const int64_t L = in->n_layers;
    uint64_t gm = UINT64_MAX, hm = UINT64_MAX;
    int64_t kb = L;
    int cb = ck_lo(in);
    for (int ck = ck_lo(in); ck <= ck_hi(in); ck++)
        for (int64_t k = 0; k <= L; k++) {
            if (host_min(in, m, L - k, ck) == UINT64_MAX) continue;
            uint64_t g = gpu_need(in, m, k, depth_for(L - k), ck, 0);
            if (g < gm) gm = g;
        }
    if (gpu_cap == 0) gpu_cap = gm;
    for (int ck = ck_lo(in); ck <= ck_hi(in); ck++)
        for (int64_t k = 0; k <= L; k++) {
            uint64_t h = host_min(in, m, L - k, ck);
            if (h == UINT64_MAX || gpu_need(in, m, k, depth_for(L - k), ck, 0) > gpu_cap) continue;
            if (h < hm) { hm = h; kb = k; cb = ck; }
        }
    *g_min = gm;
    *h_min = hm;
    if (k_out) *k_out = kb;
    if (ck_out) *ck_out = cb;
}

void ft_plan_min_budgets(const ft_plan_in *in, uint64_t *gpu_bytes, uint64_t *host_bytes)
{
    cost c;
    uint64_t g = 0, h = 0;
    if (check_in(in, &c) == 0) {
        int64_t m = in->micro_batches > 0 ? in->micro_batches : 1;
        min_pair(in, m, 0, &g, &h, NULL, NULL);
    }
    if (gpu_bytes) *gpu_bytes = g;
    if (host_bytes) *host_bytes = h;
}

/* Appends "what takes the memory" of a configuration to buf. */
static void describe(const ft_plan_in *in, int64_t m, int64_t k, int ck, char *buf, size_t n)
{
    const int64_t L = in->n_layers, s = L - k;
    int depth = depth_for(s);
    int64_t d = in->packed ? s : 0, j = s - d;
    size_t o = 0;
#define PUT(...) do { if (o < n) o += (size_t)snprintf(buf + o, n - o, __VA_ARGS__); } while (0)
    PUT("%s: %.2fG fixed (global tensors, %s, working set, workspaces)", in->device ? "GPU" : "memory",
        gib(in->gpu_fixed), in->forward_only ? "the adapter" : "LoRA parameters, gradients and AdamW state");
    if (k) PUT(", %lld resident layers %.2fG", (long long)k, gib(mul_u((uint64_t)k, in->layer_bytes)));
    if (depth) PUT(", %d layer slots %.2fG", depth, gib(mul_u((uint64_t)depth, slot_of(in))));
    if (in->forward_only)
        PUT(", layer inputs %.2fG, buffers %.2fG", gib(ckpt_all(in, m)),
            gib(mul_u((uint64_t)m, in->per_micro_bytes)));
    else if (ck == FT_TIER_GPU)
        PUT(", checkpoints %.2fG (%lld x %lld micro-batches)", gib(ckpt_all(in, m)), (long long)(L + 1),
            (long long)m);
    else
        PUT(", %d checkpoint sets %.2fG", PLAN_CKPT_SETS, gib(ckpt_gpu(in, m, ck, 0, PLAN_CKPT_SETS)));
    if (!in->forward_only)
        PUT(", %lld micro-batch buffers %.2fG", (long long)m, gib(mul_u((uint64_t)m, in->per_micro_bytes)));
    if (in->device) {
        PUT("; host pool:");
        int any = 0;
        if (j) {
            PUT(" %lld layers %.2fG", (long long)j, gib(mul_u((uint64_t)j, in->layer_bytes)));
            any = 1;
        }
        if (d) {
            PUT("%s %d NVMe staging buffers %.2fG", any ? "," : "", hslots_for(in, d),
                gib(mul_u((uint64_t)hslots_for(in, d), in->layer_bytes)));
            any = 1;
        }
        if (ck == FT_TIER_HOST) {
            PUT("%s checkpoints %.2fG", any ? "," : "", gib(ckpt_host(in, m, ck, 0, PLAN_CKPT_SETS)));
            any = 1;
        }
        if (!any) PUT(" nothing");
    } else if (s && !in->packed) {
        PUT("; the base is not packed, so every layer stays in memory");
    }
#undef PUT
}

static int refuse(const ft_plan_in *in)
{
    int64_t m = in->micro_batches > 0 ? in->micro_batches : 1, k, kg;
    int ck, ckg;
    uint64_t g, h, g2, hg;
    min_pair(in, m, 0, &g, &h, &k, &ck);
    char what[640];
    describe(in, m, k, ck, what, sizeof what);
    if (in->gpu_budget >= g) {
        min_pair(in, m, in->gpu_budget, &g2, &hg, &kg, &ckg);
        if (hg < h) {
            describe(in, m, kg, ckg, what, sizeof what);
            return ft_err(FT_E_RANGE, "offload plan: does not fit in --gpu-mem %.1fG --host-mem %.1fG: "
                          "needs --host-mem %.1fG with this --gpu-mem (at least --gpu-mem %.1fG and "
                          "--host-mem %.1fG); %s", gib(in->gpu_budget), gib(in->host_budget), gib_up(hg),
                          gib_up(g), gib_up(h), what);
        }
    }
    char unit[96];
    if (in->forward_only)
        snprintf(unit, sizeof unit, "a forward pass of %lld tokens", (long long)in->tokens_per_micro);
    else
        snprintf(unit, sizeof unit, "%lld micro-batch%s of %lld tokens", (long long)m, m == 1 ? "" : "es",
                 (long long)in->tokens_per_micro);
    return ft_err(FT_E_RANGE, "offload plan: does not fit in --gpu-mem %.1fG --host-mem %.1fG: needs at "
                  "least --gpu-mem %.1fG and --host-mem %.1fG (%s); %s", gib(in->gpu_budget),
                  gib(in->host_budget), gib_up(g), gib_up(h), unit, what);
}

int ft_plan_make(const ft_plan_in *in, ft_plan *out)
{
    if (in && out && in->ckpt_host_last_resort && !in->ckpt_host_only && ckpt_host_ok(in)) {
        ft_plan_in dev_only = *in;
        dev_only.ckpt_host_last_resort = 0;
        dev_only.rates.d2h = 0; /* checkpoints on the device */
        if (ft_plan_make(&dev_only, out) == 0) return 0;
        ft_err_clear();
        dev_only = *in;
        dev_only.ckpt_host_last_resort = 0;
        return ft_plan_make(&dev_only, out);
    }
    cost c;
    FT_TRY(check_in(in, &c));
    if (!out) return ft_err(FT_E_INVALID, "offload plan: no output");
    int64_t m_lo = 1, m_hi = in->max_micro_batches ? in->max_micro_batches : PLAN_DEFAULT_MICRO;
    if (in->micro_batches > 0) m_lo = m_hi = in->micro_batches;
    /* three plans on the stack: the candidate, the best of this m, the best so far */
    ft_plan cand, best_m, pick;
    int have_pick = 0, fits = 0, need = 0;
    for (int64_t m = m_lo; m <= m_hi; m++) {
        int have_m = 0;
        double best_moved = 0;
        for (int opt = 0; opt < 3; opt++) {
            int ck = opt == 2 ? FT_TIER_HOST : FT_TIER_GPU, keep = opt == 0;
            if (keep && !in->kept_bytes) continue;
            if (ck < ck_lo(in) || ck > ck_hi(in)) continue;
            if (layout(in, m, ck, keep, in->gpu_budget, in->host_budget, &cand)) continue;
            fits = 1;
            sim_out o;
            simulate(in, &c, &cand, &o);
            if (o.need) {
                need |= o.need;
                continue;
            }
            fill_times(in, &cand, &o);
            /* faster wins; at the same time, the one moving fewer bytes (more slack) */
            double moved = o.t_h2d + o.t_d2h + o.t_disk;
            if (!have_m || cand.t_step < best_m.t_step * (1 - 1e-9) ||
                (cand.t_step <= best_m.t_step * (1 + 1e-9) && moved < best_moved)) {
                best_m = cand;
                best_moved = moved;
                have_m = 1;
            }
        }
        if (!have_m) continue;
        int reaches = best_m.t_compute >= PLAN_TARGET * best_m.t_step;
        if (!have_pick || best_m.tokens_per_s > pick.tokens_per_s) pick = best_m, have_pick = 1;
        if (reaches) {
            pick = best_m;
            break;
        }
    }
    if (!have_pick) {
        if (fits && need)
            return ft_err(FT_E_INVALID, "offload plan: the budgets need streaming, but these measured rates "
                          "are 0 (unknown):%s%s%s", need & NEED_H2D ? " h2d (pinned host to device)" : "",
                          need & NEED_D2H ? " d2h (device to pinned host)" : "",
                          need & NEED_DISK ? " disk (NVMe read)" : "");
        return refuse(in);
    }
    *out = pick;
    return 0;
}

double ft_plan_step_seconds(const ft_plan_in *in, const ft_plan *p)
{
    cost c;
    if (check_in(in, &c) || !p || p->n_layers != in->n_layers || p->micro_batches < 1) return NAN;
    int64_t n[3] = {0, 0, 0};
    for (int64_t l = 0; l < in->n_layers; l++) {
        if (p->tier[l] > FT_TIER_DISK) return NAN;
        n[p->tier[l]]++;
    }
    if (n[0] != p->n_tier[0] || n[1] != p->n_tier[1] || n[2] != p->n_tier[2]) return NAN;
    if (p->prefetch_depth < (n[1] + n[2] ? 1 : 0) || p->prefetch_depth > PLAN_MAX_SLOTS) return NAN;
    if (p->host_slots < (in->device && n[2] ? 1 : 0) || p->host_slots > PLAN_MAX_SLOTS) return NAN;
    if (p->ckpt_tier != FT_TIER_GPU && !(p->ckpt_tier == FT_TIER_HOST && in->device)) return NAN;
    if (p->ckpt_tier == FT_TIER_HOST &&
        (p->ckpt_dev_layers < 0 || p->ckpt_dev_layers > in->n_layers || p->ckpt_sets == 1 ||
         p->ckpt_sets < 0 || p->ckpt_sets > PLAN_MAX_CKPT_SETS))
        return NAN;
    if (!in->device && n[1]) return NAN;
    sim_out o;
    simulate(in, &c, p, &o);
    return o.t_step;
}

void ft_plan_in_adapters(const ft_plan_in *one, int64_t K, uint64_t adapter_bytes, ft_plan_in *out)
{
    if (K < 1) K = 1;
    const uint64_t k = (uint64_t)K;
    const double kd = (double)K;
    *out = *one;
    out->ckpt_bytes = mul_u(one->ckpt_bytes, k);
    out->per_micro_bytes = mul_u(one->per_micro_bytes, k);
    out->kept_bytes = mul_u(one->kept_bytes, k);
    out->gpu_fixed = add_u(one->gpu_fixed, mul_u(adapter_bytes, k - 1));
    out->tokens_per_micro = one->tokens_per_micro * K;
    out->t_fwd_layer = one->t_fwd_layer * kd;
    out->t_bwd_layer = one->t_bwd_layer * kd;
    out->t_head = one->t_head * kd;
    out->flops_fwd_layer = one->flops_fwd_layer * kd;
    out->flops_bwd_layer = one->flops_bwd_layer * kd;
    out->flops_head = one->flops_head * kd;
}

int64_t ft_plan_max_adapters(const ft_plan_in *one, uint64_t adapter_bytes, int64_t k_max,
                             ft_plan *plan)
{
    int64_t best = 0;
    for (int64_t K = 1; K <= (k_max < 1 ? 1 : k_max); K++) {
        ft_plan_in in;
        ft_plan p;
        ft_plan_in_adapters(one, K, adapter_bytes, &in);
        int rc = ft_plan_make(&in, &p);
        if (rc) {
            if (K == 1) return rc;
            break;
        }
        *plan = p;
        best = K;
    }
    return best;
}

/* "a-b,c" for the layers of one tier: up to 4 runs, else "spread over a-b". */
static void ranges(const ft_plan *p, int tier, char *buf, size_t n)
{
    int64_t runs = 0, first = -1, last = -1, L = p->n_layers;
    if (L < 0 || L > FT_PLAN_MAX_LAYERS) L = 0;
    for (int64_t l = 0; l < L; l++)
        if (p->tier[l] == tier) {
            if (first < 0) first = l;
            if (l == 0 || p->tier[l - 1] != tier) runs++;
            last = l;
        }
    buf[0] = 0;
    if (runs > 4) {
        snprintf(buf, n, "spread over %lld-%lld", (long long)first, (long long)last);
        return;
    }
    size_t o = 0;
    for (int64_t l = 0; l < L; l++) {
        if (p->tier[l] != tier || (l > 0 && p->tier[l - 1] == tier)) continue;
        int64_t e = l;
        while (e + 1 < L && p->tier[e + 1] == tier) e++;
        if (o >= n) break;
        const char *sep = o ? "," : "";
        int w = e > l ? snprintf(buf + o, n - o, "%s%lld-%lld", sep, (long long)l, (long long)e)
                      : snprintf(buf + o, n - o, "%s%lld", sep, (long long)l);
        o += w > 0 ? (size_t)w : 0;
    }
}

int ft_plan_format(const ft_plan_in *in, const ft_plan *p, char *buf, size_t n)
{
    if (!buf || !n) return 0;
    buf[0] = 0;
    if (!in || !p) return 0;
    char rg[3][96];
    for (int t = 0; t < 3; t++) {
        char r[88];
        ranges(p, t, r, sizeof r);
        snprintf(rg[t], sizeof rg[t], p->n_tier[t] ? " (%s)" : "%s", r);
    }
    int dev = in->device;
    size_t o = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (o < n) {                                                                               \
            int k_ = snprintf(buf + o, n - o, __VA_ARGS__);                                        \
            if (k_ > 0) o += (size_t)k_;                                                           \
        }                                                                                          \
    } while (0)
    PUT("plan: %lld layers: %lld %s%s, %lld in pinned host memory%s, %lld on NVMe%s; prefetch %d",
        (long long)p->n_layers, (long long)p->n_tier[0], dev ? "on the GPU" : "resident in memory", rg[0],
        (long long)p->n_tier[1], rg[1], (long long)p->n_tier[2], rg[2], p->prefetch_depth);
    if (p->host_slots) PUT(", %d NVMe staging buffers", p->host_slots);
    if (in->forward_only)
        PUT("; forward passes of %lld tokens (no backward)\n", (long long)in->tokens_per_micro);
    else
        PUT("; %lld micro-batch%s of %lld tokens per step; activations %s\n", (long long)p->micro_batches,
            p->micro_batches == 1 ? "" : "es", (long long)in->tokens_per_micro,
            p->keep_acts ? "kept" : "recomputed");
    if (in->forward_only) {
        /* layer inputs stay in the executor's arena; nothing is stored for a backward */
    } else if (p->ckpt_tier == FT_TIER_HOST) {
        char lay[48] = "no layer";
        if (p->ckpt_host_layers == 1) snprintf(lay, sizeof lay, "layer 0");
        else if (p->ckpt_host_layers > 1)
            snprintf(lay, sizeof lay, "layers 0-%lld", (long long)p->ckpt_host_layers - 1);
        PUT("plan: checkpoints in pinned host memory: %s x %lld micro-batch%s, %.2f GiB (stored after "
            "the forward, loaded before the backward); on the GPU %.2f GiB (%d ring sets",
            lay, (long long)p->micro_batches, p->micro_batches == 1 ? "" : "es", gib(p->ckpt_host_bytes),
            gib(p->ckpt_gpu_bytes), p->ckpt_sets);
        if (p->ckpt_dev_layers)
            PUT(", the inputs of the last %lld layer%s", (long long)p->ckpt_dev_layers,
                p->ckpt_dev_layers == 1 ? "" : "s");
        PUT("); %.2f GiB of GPU memory freed\n", gib(p->ckpt_freed_bytes));
    } else {
        PUT("plan: checkpoints %s: %lld x %lld micro-batch%s, %.2f GiB\n", dev ? "on the GPU" : "in memory",
            (long long)(p->n_layers + 1), (long long)p->micro_batches, p->micro_batches == 1 ? "" : "es",
            gib(p->ckpt_gpu_bytes));
    }
    if (dev)
        PUT("plan: GPU %.1f of %.1f GiB, host pool %.1f of %.1f GiB", gib(p->gpu_bytes), gib(in->gpu_budget),
            gib(p->host_bytes), gib(in->host_budget));
    else
        PUT("plan: memory %.1f of %.1f GiB", gib(p->gpu_bytes), gib(in->gpu_budget));
    if (in->host_fixed) PUT(" (+%.1f GiB of process memory outside the budget)", gib(in->host_fixed));
    PUT("; predicted %.3g s/%s (compute %.3g, PCIe H2D %.3g, D2H %.3g, disk %.3g), %.0f tokens/s, "
        "%s-bound\n", p->t_step, in->forward_only ? "forward pass" : "step", p->t_compute, p->t_h2d,
        p->t_d2h, p->t_disk, p->tokens_per_s, p->bound ? p->bound : "compute");
#undef PUT
    return (int)(o < n ? o : n - 1);
}
