/* cuda_emu.h - CPU emulation of the CUDA features the tensor-core kernels use, so that their
 * device code can run as written on a host without a GPU (tests/emu/emu_*.cc, compiled by a
 * host C++ compiler; the kernel files leave out their inline PTX under FT_MMA_EMU and the test
 * supplies their primitives as thin wrappers over the emu_* functions below).
 *
 * Execution: a block's CUDA threads are fibers on one host thread (x86-64: a six-register stack
 * switch; elsewhere ucontext), scheduled round robin; a fiber runs until it waits at a barrier.
 * Blocks run one after another. One translation unit per program may include this. Provided:
 *   threadIdx, blockIdx, blockDim, gridDim, __syncthreads, __shfl_xor_sync (float), min,
 *   __fmul_rn, __fadd_rn, __fmaf_rn, __fdiv_rn, __fsqrt_rn, __uint_as_float;
 *   emu_ldsm      ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16
 *   emu_mma16816  mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 *   emu_cp_async / emu_cp_commit / emu_cp_wait  cp.async (16 or 4 bytes, zero fill),
 *                 commit_group, wait_group N
 *   emu_smem_u32  the shared-state-space address of a pointer into the launch's shared memory;
 *   emu_launch / emu_kernel  a grid of blocks (a lambda, or a __global__ function and its
 *                 arguments as after <<<>>>).
 * Fragment layouts are the PTX ISA's (section "Matrix fragments for mma.m16n8k16", and
 * "ldmatrix"). The fp32 sums of mma run in k order with fmaf, which the tensor cores need not
 * match bit for bit: results agree to fp32 rounding of the accumulation.
 *
 * Checks (each aborts with the thread, block and shared byte named):
 *   - shared memory is filled with 0xff bytes (bf16 / fp32 NaN) before every block, and the
 *     EMU_GUARD bytes past the launch's dynamic size must still hold them after it (a plain
 *     store out of bounds); ldmatrix rows and cp.async destinations must lie inside the launch's
 *     shared memory and be aligned (16 bytes; 4 for a 4-byte copy);
 *   - every lane of a warp must reach the same collective (ldmatrix, mma, shuffle: no
 *     divergence), every thread of a block the same __syncthreads; a barrier that cannot
 *     complete (a thread exited or waits elsewhere) is a deadlock;
 *   - cp.async sources must lie in the ranges given to emu_global_add (when any are given);
 *   - cp.async lands either at issue (EMU_CP_EARLY: catches a copy into a buffer that other
 *     threads still read) or only when a wait_group retires its group (EMU_CP_LATE: catches a
 *     read of shared memory before the wait, which then reads NaN); emu_cp_mode sets which.
 * Not emulated: timing, bank conflicts, register limits, global-memory races between blocks.
 */
#ifndef FT_CUDA_EMU_H
#define FT_CUDA_EMU_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <vector>

struct emu_u3 { unsigned x, y, z; };

#define EMU_SMEM_BYTES (228 * 1024) /* the most dynamic shared memory a launch may ask for */
#define EMU_GUARD 4096              /* bytes past the launch's size that must stay untouched */
#define EMU_MAX_THREADS 1024
#define EMU_STACK (256 * 1024)

enum emu_cp_modes { EMU_CP_EARLY = 0, EMU_CP_LATE = 1 };
enum emu_ops { EMU_OP_NONE, EMU_OP_SHFL, EMU_OP_LDSM, EMU_OP_LDSM_T, EMU_OP_MMA };
static const char *const emu_op_name[] = {"none", "shuffle", "ldmatrix", "ldmatrix.trans", "mma"};

struct emu_copy { uint32_t dst, bytes; uint8_t data[16]; };

#if defined(__x86_64__)
/* Saves the callee-saved registers on the current stack, stores its pointer in *save, and
 * resumes the stack at load (System V x86-64; no signal mask, no floating-point state: the
 * kernels do not change the rounding mode). */
extern "C" void emu_ctx_swap(void **save, void *load);
asm(".text\n.globl emu_ctx_swap\n.type emu_ctx_swap,@function\nemu_ctx_swap:\n"
    "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
    "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
    "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n"
    ".size emu_ctx_swap, .-emu_ctx_swap\n");
#define EMU_ASM_SWITCH 1
#endif

struct emu_thread {
#ifdef EMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t ctx;
#endif
    emu_u3 tid;
    bool done;
    const char *waits; /* what it waits at, for the deadlock report */
    std::vector<emu_copy> pending;   /* cp.async not yet landed (EMU_CP_LATE), issue order */
    std::vector<size_t> group_end;   /* committed groups: end index in pending, oldest first */
    char *stack;
};

struct emu_warp_state {
    unsigned arrived, gen;
    int op;
    uint32_t u[32][6];
    float f[32];
};

struct emu_state {
    emu_u3 grid, block, bid;
    unsigned char *smem; /* the kernels' extern __shared__ array (EMU_SMEM_BYTES + EMU_GUARD) */
    size_t smem_bytes;   /* dynamic shared memory of the current launch */
    int cp_mode;
    emu_thread *cur;
    std::vector<emu_thread> th;
    emu_warp_state warp[EMU_MAX_THREADS / 32];
    unsigned bar_arrived, bar_gen;
    unsigned long progress; /* bumped whenever a fiber moves past a wait or ends */
#ifdef EMU_ASM_SWITCH
    void *sched_sp;
#else
    ucontext_t sched;
#endif
    void (*fn)(void *);
    void *arg;
    std::vector<std::pair<const char *, size_t>> global; /* readable global ranges */
};
static emu_state emu;

#define threadIdx (emu.cur->tid)
#define blockIdx (emu.bid)
#define gridDim (emu.grid)
#define blockDim (emu.block)
#undef __launch_bounds__
#define __launch_bounds__(...)

static void emu_die(const char *what, uint32_t a)
{
    fprintf(stderr, "emulation: %s (shared byte %u, launch has %zu; thread %u, block %u,%u,%u)\n", what, a,
            emu.smem_bytes, emu.cur ? emu.cur->tid.x : 0u, emu.bid.x, emu.bid.y, emu.bid.z);
    abort();
}

/* The kernels' shared array: `arena` of EMU_SMEM_BYTES + EMU_GUARD bytes, 128-byte aligned. */
static inline void emu_set_smem(void *arena) { emu.smem = (unsigned char *)arena; }

/* cp.async landing time for the following launches (EMU_CP_EARLY or EMU_CP_LATE). */
static inline void emu_cp_mode(int mode) { emu.cp_mode = mode; }

/* Global ranges cp.async may read (none given: not checked). */
static inline void emu_global_add(const void *p, size_t bytes) { emu.global.push_back({(const char *)p, bytes}); }
static inline void emu_global_clear() { emu.global.clear(); }

/* ---- scheduling ------------------------------------------------------------------------ */

#ifdef EMU_ASM_SWITCH
static inline void emu_yield() { emu_ctx_swap(&emu.cur->sp, emu.sched_sp); }
static inline void emu_resume(emu_thread *t) { emu_ctx_swap(&emu.sched_sp, t->sp); }
#else
static inline void emu_yield() { swapcontext(&emu.cur->ctx, &emu.sched); }
static inline void emu_resume(emu_thread *t) { swapcontext(&emu.sched, &t->ctx); }
#endif

static inline int min(int a, int b) { return a < b ? a : b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void __syncthreads()
{
    emu_thread *t = emu.cur;
    const unsigned gen = emu.bar_gen;
    emu.progress++;
    if (++emu.bar_arrived == emu.block.x) {
        emu.bar_arrived = 0;
        emu.bar_gen++;
        return;
    }
    t->waits = "__syncthreads";
    while (emu.bar_gen == gen) emu_yield();
    t->waits = nullptr;
}

/* The warp's lanes meet at a collective of kind op (all lanes must come to the same kind). */
static void emu_warp_meet(int op)
{
    emu_thread *t = emu.cur;
    emu_warp_state &W = emu.warp[t->tid.x >> 5];
    if (W.arrived == 0) W.op = op;
    else if (W.op != op) {
        fprintf(stderr, "emulation: warp %u diverged: lane %u at %s, others at %s\n", t->tid.x >> 5,
                t->tid.x & 31, emu_op_name[op], emu_op_name[W.op]);
        emu_die("divergent warp collective", 0);
    }
    const unsigned gen = W.gen;
    emu.progress++;
    if (++W.arrived == 32) {
        W.arrived = 0;
        W.gen++;
        return;
    }
    t->waits = emu_op_name[op];
    while (W.gen == gen) emu_yield();
    t->waits = nullptr;
}

static inline emu_warp_state &emu_w() { return emu.warp[emu.cur->tid.x >> 5]; }
static inline int emu_lane() { return (int)(emu.cur->tid.x & 31); }

static void emu_fiber_main()
{
    emu.fn(emu.arg);
    emu.cur->done = true;
    emu.progress++;
#ifdef EMU_ASM_SWITCH
    emu_yield(); /* never resumed */
    abort();
#endif
} /* ucontext: returns to uc_link, the scheduler */

/* Prepares t to start in emu_fiber_main on its own stack. */
static void emu_fiber_init(emu_thread &t)
{
#ifdef EMU_ASM_SWITCH
    /* the frame emu_ctx_swap pops: six registers, then the return address; at the entry of
     * emu_fiber_main the stack pointer is 8 mod 16, as after a call */
    uintptr_t top = ((uintptr_t)t.stack + EMU_STACK) & ~(uintptr_t)15;
    void **sp = (void **)(top - 16);
    sp[0] = (void *)emu_fiber_main;
    sp -= 6;
    for (int i = 0; i < 6; i++) sp[i] = nullptr;
    t.sp = sp;
#else
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = t.stack;
    t.ctx.uc_stack.ss_size = EMU_STACK;
    t.ctx.uc_link = &emu.sched;
    makecontext(&t.ctx, emu_fiber_main, 0);
#endif
}

/* Runs kern() for every block of grid (gx, gy, gz) with nth threads and smem bytes of dynamic
 * shared memory. */
template <typename F>
static void emu_launch(unsigned gx, unsigned gy, unsigned gz, int nth, size_t smem, F kern)
{
    if (!emu.smem || smem > EMU_SMEM_BYTES || nth % 32 || nth <= 0 || nth > EMU_MAX_THREADS)
        emu_die("bad launch", (uint32_t)smem);
    emu.grid = {gx, gy, gz};
    emu.block = {(unsigned)nth, 1, 1};
    emu.smem_bytes = smem;
    emu.fn = [](void *a) { (*(F *)a)(); };
    emu.arg = &kern;
    if (emu.th.size() < (size_t)nth) emu.th.resize(nth); /* kept (with their stacks) across launches */
    emu_thread *const th = emu.th.data(), *const th_end = th + nth;
    for (emu_thread *t = th; t < th_end; t++)
        if (!t->stack && !(t->stack = (char *)malloc(EMU_STACK))) emu_die("no memory for fiber stacks", 0);
    for (unsigned bz = 0; bz < gz; bz++)
        for (unsigned by = 0; by < gy; by++)
            for (unsigned bx = 0; bx < gx; bx++) {
                emu.bid = {bx, by, bz};
                emu.cur = nullptr;
                memset(emu.smem, 0xff, smem + EMU_GUARD);
                emu.bar_arrived = 0;
                for (int w = 0; w < nth / 32; w++) emu.warp[w].arrived = 0;
                for (int i = 0; i < nth; i++) {
                    emu_thread &t = emu.th[i];
                    t.tid = {(unsigned)i, 0, 0};
                    t.done = false;
                    t.waits = nullptr;
                    t.pending.clear();
                    t.group_end.clear();
                    emu_fiber_init(t);
                }
                for (int live = nth; live > 0;) {
                    const unsigned long before = emu.progress;
                    live = 0;
                    for (emu_thread *t = th; t < th_end; t++) {
                        if (t->done) continue;
                        emu.cur = t;
                        emu_resume(t);
                        live += !t->done;
                    }
                    if (live && emu.progress == before) {
                        for (emu_thread *t = th; t < th_end; t++)
                            fprintf(stderr, "  thread %u: %s\n", t->tid.x,
                                    t->done ? "exited" : t->waits ? t->waits : "?");
                        emu.cur = nullptr;
                        emu_die("deadlock: a barrier or warp collective cannot complete", 0);
                    }
                }
                emu.cur = nullptr;
                for (emu_thread *t = th; t < th_end; t++)
                    for (auto &c : t->pending) memcpy(emu.smem + c.dst, c.data, c.bytes); /* unwaited copies */
                for (size_t b = smem; b < smem + EMU_GUARD; b++)
                    if (emu.smem[b] != 0xff) emu_die("a store past the launch's shared memory", (uint32_t)b);
            }
}

/* kern<<<grid, block, smem>>>(args...): a one-dimensional block. */
template <typename... P, typename... A>
static void emu_kernel(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, A... args)
{
    if (block.y != 1 || block.z != 1) emu_die("emu_kernel: blocks must be one-dimensional", 0);
    emu_launch(grid.x, grid.y, grid.z, (int)block.x, smem, [&] { kern(args...); });
}

/* ---- shared memory and warp collectives ------------------------------------------------ */

static inline uint32_t emu_smem_u32(const void *p)
{
    const ptrdiff_t d = (const unsigned char *)p - emu.smem;
    if (d < 0 || (size_t)d > emu.smem_bytes) emu_die("shared address of a pointer outside shared memory", 0);
    return (uint32_t)d;
}

static inline uint32_t emu_h(uint32_t byte)
{
    uint16_t v;
    memcpy(&v, emu.smem + byte, 2);
    return v;
}

static inline float __shfl_xor_sync(unsigned mask, float v, int m)
{
    if (mask != 0xffffffffu) emu_die("shuffle with a partial mask", mask);
    emu_warp_state &W = emu_w();
    const int l = emu_lane();
    W.f[l] = v;
    emu_warp_meet(EMU_OP_SHFL);
    const float r = W.f[l ^ m];
    emu_warp_meet(EMU_OP_SHFL);
    return r;
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8 i .. 8 i + 7 give the rows of
 * matrix i; without .trans lane l receives row l / 4, elements 2 (l % 4), +1 of matrix i in
 * register i; with .trans element l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1. */
static void emu_ldsm(uint32_t *r, uint32_t addr, bool trans)
{
    if (addr % 16) emu_die("ldmatrix row address not 16-byte aligned", addr);
    if (addr + 16 > emu.smem_bytes) emu_die("ldmatrix row outside the launch's shared memory", addr);
    emu_warp_state &W = emu_w();
    const int l = emu_lane(), op = trans ? EMU_OP_LDSM_T : EMU_OP_LDSM;
    W.u[l][0] = addr;
    emu_warp_meet(op);
    for (int i = 0; i < 4; i++) {
        if (!trans) {
            const uint32_t a = W.u[8 * i + l / 4][0] + 4 * (l % 4);
            r[i] = emu_h(a) | emu_h(a + 2) << 16;
        } else {
            const uint32_t a0 = W.u[8 * i + 2 * (l % 4)][0] + 2 * (l / 4);
            const uint32_t a1 = W.u[8 * i + 2 * (l % 4) + 1][0] + 2 * (l / 4);
            r[i] = emu_h(a0) | emu_h(a1) << 16;
        }
    }
    emu_warp_meet(op);
}

static inline float emu_bf(uint32_t bits16)
{
    const uint32_t u = (bits16 & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, lane l = 4 g + t: A register i holds
 * (row g + 8 (i & 1), cols 2 t + 8 (i >> 1) + {0, 1}); B register i holds (rows 2 t + 8 i +
 * {0, 1}, col g); C element e is (row g + 8 (e >> 1), col 2 t + (e & 1)). */
static void emu_mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    emu_warp_state &W = emu_w();
    const int l = emu_lane(), g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; i++) W.u[l][i] = a[i];
    W.u[l][4] = b0;
    W.u[l][5] = b1;
    emu_warp_meet(EMU_OP_MMA);
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = c[e];
        for (int k = 0; k < 16; k++) {
            const int la = 4 * (row % 8) + (k % 8) / 2, ra = row / 8 + 2 * (k / 8);
            const int lb = 4 * col + (k % 8) / 2, rb = 4 + k / 8;
            s = fmaf(emu_bf(W.u[la][ra] >> (16 * (k % 2))), emu_bf(W.u[lb][rb] >> (16 * (k % 2))), s);
        }
        c[e] = s;
    }
    emu_warp_meet(EMU_OP_MMA);
}

/* ---- cp.async -------------------------------------------------------------------------- */

/* cp.async of `bytes` (16 or 4) from global src to shared dst; src_bytes < bytes zero-fills
 * the rest (src_bytes 0: src is not read). */
static void emu_cp_async(uint32_t dst, const void *src, uint32_t bytes, uint32_t src_bytes)
{
    if (dst % bytes) emu_die("cp.async destination not aligned to its size", dst);
    if (dst + bytes > emu.smem_bytes) emu_die("cp.async outside the launch's shared memory", dst);
    if (src_bytes > bytes) emu_die("cp.async source size larger than the copy", dst);
    emu_copy c{dst, bytes, {}};
    if (src_bytes) {
        if ((uintptr_t)src % bytes) emu_die("cp.async source not aligned to its size", dst);
        bool ok = emu.global.empty();
        for (auto &g : emu.global)
            ok |= (const char *)src >= g.first && (const char *)src + src_bytes <= g.first + g.second;
        if (!ok) emu_die("cp.async source outside the kernel's global buffers", dst);
        memcpy(c.data, src, src_bytes);
    }
    if (emu.cp_mode == EMU_CP_EARLY) memcpy(emu.smem + dst, c.data, bytes);
    else emu.cur->pending.push_back(c);
}

static inline void emu_cp_commit()
{
    emu_thread *t = emu.cur;
    t->group_end.push_back(t->pending.size());
}

/* cp.async.wait_group n: the thread's committed groups but the newest n have landed. */
static void emu_cp_wait(int n)
{
    emu_thread *t = emu.cur;
    if ((int)t->group_end.size() <= n) return;
    const size_t retire = t->group_end.size() - n, upto = t->group_end[retire - 1];
    for (size_t i = 0; i < upto; i++) memcpy(emu.smem + t->pending[i].dst, t->pending[i].data, t->pending[i].bytes);
    t->pending.erase(t->pending.begin(), t->pending.begin() + upto);
    t->group_end.erase(t->group_end.begin(), t->group_end.begin() + retire);
    for (auto &e : t->group_end) e -= upto;
}

#endif /* FT_CUDA_EMU_H */
