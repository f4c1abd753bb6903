/* nf4_gemm.cu - frozen-weight GEMMs with the NF4 weight dequantized inside the GEMM (QLoRA's
 * forward and input gradient without a bf16 copy of the weight in global memory).
 *
 *   forward:        y  (T, N) fp32 = x  (T, K) bf16 . W^T  (+ beta y)
 *   input gradient: dx (T, K) fp32 = dy (T, N) bf16 . W    (+ beta dx)
 * W (N, K) = (out_features, in_features), row-major as stored: an ft_nf4_tensor (kernels.h,
 * bitsandbytes NF4, optionally double-quantized) of n = N K values.
 *
 * Both are one GEMM C (T, Ncols) = A (T, Kred) . B (Kred, Ncols) with A the bf16 activation
 * and B read from W: forward B(k, n) = W[n][k] (Kred = K, Ncols = N), input gradient B(r, c) =
 * W[r][c] (Kred = N, Ncols = K). A CTA (256 threads, 8 warps) computes a BM x 128 tile of C
 * over Kred in steps of 64:
 *   - A's BM x 64 bf16 tile, the W tile's 4096 code bytes (the 128 x 64 or 64 x 128 piece of W
 *     that B's 64 x 128 tile is) and each thread's absmax inputs come in with cp.async into a
 *     ring of STAGES stages (the codes with an L2 128-byte prefetch hint: a W row's next steps
 *     share the line);
 *   - each thread owns 32 consecutive values of one W row (16 code bytes, one quantization
 *     block: blocksize >= 32) and dequantizes them into a bf16 W tile in shared memory, double
 *     buffered: step k + 1 is dequantized while the tensor cores run step k, one barrier per
 *     step; the tile keeps W's layout (rows of W), so the forward reads its B fragments with
 *     ldmatrix and the input gradient with ldmatrix.trans from the same kind of tile;
 *   - mma.sync m16n8k16 bf16 with fp32 accumulators (sm_80 instructions, run on sm_90);
 *     warp tiles 64x32 (BM 128), 32x32 (64), 16x32 (32), 16x16 (16);
 *   - shared tiles XOR-swizzled by 16-byte chunk so ldmatrix, cp.async and the dequantizer's
 *     16-byte stores are free of bank conflicts (the input gradient's 64 x 128 tile also folds
 *     chunk bit 3 into bit 1: its four writers per row would otherwise pair up on banks).
 * Dequantized values are exactly the plain kernel's (nf4.cu dequant_nf4): the absmax is
 * rebuilt as map[qabsmax] * nested_absmax + offset with two fp32 roundings (__fmul_rn,
 * __fadd_rn), the value is code[q] * absmax (__fmul_rn), rounded to bf16 to nearest even; so
 * the result equals dequant_nf4 + a bf16 GEMM up to the order of the fp32 summation
 * (tests/gpu/test_cuda_nf4_gemm.c checks the values one by one through an identity GEMM).
 *
 * Tile height BM follows T (16, 32, 64, else 128: a W tile is dequantized once per BM rows of
 * activation). When the output has fewer tiles than SMs (small T), Kred is split over up to
 * 2 x SMs CTAs (split-K): partials (splits, T, Ncols) fp32 go to the backend's workspace
 * (cx->work) and a second kernel adds them in split order, so results are deterministic (for a
 * given GPU model: the split count depends on the SM count). No allocation, no atomics.
 * Rows past T and columns past Ncols (Ncols mod 128 = 64) load clamped, valid addresses and are
 * not stored.
 *
 * Requirements (else FT_E_INVALID): N, K multiples of 64; blocksize a power of two 32..4096,
 * nested block size a power of two (nested: n / blocksize a multiple of 4, true for every
 * blocksize <= 1024 here); A 16-byte aligned, C 8-byte aligned, codes 16-byte aligned,
 * qabsmax and the fp32 arrays 4-byte aligned (cp.async).
 *
 * bench/results/qlora.md ("The fused NF4 GEMM") says what it must beat and what to measure;
 * bench/nf4_gemm.cu times it against dequant_nf4 + cuBLAS, and includes this file with
 * FT_NF4_GEMM_KERNELS_ONLY defined (kernels and launcher only, no backend entry points).
 * tests/emu/emu_nf4_gemm.cc runs the kernels and the launcher themselves on the CPU: under
 * FT_MMA_EMU the inline PTX is left out (the test supplies emulations of the nf4g_ primitives)
 * and the launches go to its emulator (emu_kernel). */
#include "kernels/cuda/cuda_common.h"

#include <cuda_bf16.h>

#include "kernels/cuda/nf4_word.cuh" /* nf4.cu's code-to-bf16 step, bit for bit */

#define NF4G_THREADS 256
#define NF4G_BN 128 /* output columns per CTA */
#define NF4G_BK 64  /* reduction per pipeline step */

/* ---- PTX helpers (tests/emu/emu_nf4_gemm.cc defines its own under FT_MMA_EMU) --------------- */
#ifndef FT_MMA_EMU

__device__ __forceinline__ uint32_t nf4g_smem(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void nf4g_cp16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void nf4g_cp4(uint32_t dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void nf4g_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/* Waits until at most N of this thread's committed groups are pending; a compiler barrier for
 * the shared-memory reads of the landed data that follow. */
template <int N> __device__ __forceinline__ void nf4g_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void nf4g_ldsm4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void nf4g_ldsm4_t(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* d (16x8 fp32) += a (16x16 bf16, row) . b (16x8 bf16, col). */
__device__ __forceinline__ void nf4g_mma(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif /* FT_MMA_EMU */

/* ---- tile geometry (host and device functions: a host emulation can check the layout) ------ */

/* Byte offset of 16-byte chunk ch (0..7) of row r in an A tile (rows of 64 bf16). */
__host__ __device__ __forceinline__ int nf4g_a_off(int r, int ch)
{
    return r * 128 + ((ch ^ (r & 7)) << 4);
}

/* Byte offset of chunk ch of row r in the bf16 W tile: forward 128 rows of 64 values (8
 * chunks), input gradient 64 rows of 128 values (16 chunks, bit 3 folded into bit 1). */
template <bool DGRAD> __host__ __device__ __forceinline__ int nf4g_w_off(int r, int ch)
{
    return DGRAD ? r * 256 + ((ch ^ (r & 7) ^ ((ch >> 3) << 1)) << 4) : r * 128 + ((ch ^ (r & 7)) << 4);
}

/* ldmatrix.x4 row address of `lane` for A rows r0..r0+15, k chunks 2 kk, 2 kk + 1. */
__host__ __device__ __forceinline__ int nf4g_lda(int r0, int kk, int lane)
{
    return nf4g_a_off(r0 + (lane & 15), kk * 2 + (lane >> 4));
}

/* ldmatrix.x4 (.trans for DGRAD) row address of `lane` for B columns c0..c0+15 and k rows
 * 16 kk..16 kk+15: matrices 0, 1 = columns c0..c0+7 (k low, k high), 2, 3 = c0+8..c0+15. */
template <bool DGRAD> __host__ __device__ __forceinline__ int nf4g_ldb(int c0, int kk, int lane)
{
    if (!DGRAD) /* tile rows = columns of B (n), 8 chunks of k */
        return nf4g_w_off<false>(c0 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1));
    /* tile rows = k, chunks of n */
    return nf4g_w_off<true>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), c0 / 8 + (lane >> 4));
}

/* The W values thread tid dequantizes each step: tile row *row, 32-value chunk *sub of it,
 * and their first element in W at step kt, *e_base + kt *e_step. Forward: the tile is W rows
 * n0..n0+127 (past the last row: the last row) x columns 64 kt.., 2 threads per row; input
 * gradient: W rows 64 kt..64 kt+63 x columns n0..n0+127 (past the end: the last 32), 4 per row. */
template <bool DGRAD>
__host__ __device__ __forceinline__ void nf4g_thread_chunk(int tid, int64_t n0, int64_t wrows, int64_t wcols,
                                                           int *row, int *sub, int64_t *e_base, int64_t *e_step)
{
    *row = DGRAD ? tid >> 2 : tid >> 1;
    *sub = DGRAD ? tid & 3 : tid & 1;
    if (!DGRAD) {
        int64_t wr = n0 + *row < wrows ? n0 + *row : wrows - 1;
        *e_base = wr * wcols + 32 * *sub;
        *e_step = NF4G_BK;
    } else {
        int64_t col = n0 + 32 * *sub < wcols ? n0 + 32 * *sub : wcols - 32;
        *e_base = (int64_t)*row * wcols + col;
        *e_step = (int64_t)NF4G_BK * wcols;
    }
}

/* ---- the kernel ---------------------------------------------------------------------------- */

/* Shared memory of one CTA, byte offsets (all 16-byte aligned). */
template <int BM, int STAGES> struct nf4g_layout {
    static constexpr int a_stage = BM * NF4G_BK * 2;       /* A tile, bf16 */
    static constexpr int codes_stage = NF4G_THREADS * 16;  /* 16 code bytes per thread */
    static constexpr int scale_stage = NF4G_THREADS * 8;   /* qabsmax word + nested absmax */
    static constexpr int wb = NF4G_BN * NF4G_BK * 2;       /* one bf16 W tile */
    static constexpr int off_a = 0;
    static constexpr int off_codes = off_a + STAGES * a_stage;
    static constexpr int off_scale = off_codes + STAGES * codes_stage;
    static constexpr int off_wb = off_scale + STAGES * scale_stage;
    static constexpr int off_map = off_wb + 2 * wb;
    static constexpr int off_code = off_map + 256 * 4;
    static constexpr int bytes = off_code + 16 * 4;
};

typedef struct nf4g_args {
    const __nv_bfloat16 *a; /* (T, kred) */
    float *c;               /* (T, ncols), or the partials (splits, T, ncols) when splits > 1 */
    ft_nf4_tensor w;        /* (wrows, wcols) */
    int64_t T, kred, ncols, wrows, wcols;
    float beta;             /* splits == 1 only: c = acc + beta c (c not read when 0) */
    int sh_block, sh_nested, splits, kt_total;
} nf4g_args;

/* grid (ceil(T / BM), ceil(ncols / 128), splits); split z covers reduction steps
 * [z kt_total / splits, (z + 1) kt_total / splits). */
template <int BM, int WARPS_M, int STAGES, bool DGRAD, bool NESTED>
__global__ void __launch_bounds__(NF4G_THREADS, 2) k_nf4_gemm(nf4g_args p)
{
    using L = nf4g_layout<BM, STAGES>;
    constexpr int WARPS_N = 8 / WARPS_M, WTM = BM / WARPS_M, WTN = NF4G_BN / WARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8;
    static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile");
    extern __shared__ __align__(128) uint8_t sm[];
    float *map_s = reinterpret_cast<float *>(sm + L::off_map);
    float *code_s = reinterpret_cast<float *>(sm + L::off_code);
    const uint32_t sbase = nf4g_smem(sm);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int64_t m0 = (int64_t)blockIdx.x * BM, n0 = (int64_t)blockIdx.y * NF4G_BN;
    const int z = blockIdx.z;
    const int kt0 = (int)((int64_t)z * p.kt_total / p.splits);
    const int KT = (int)((int64_t)(z + 1) * p.kt_total / p.splits) - kt0;

    if (tid < 16) code_s[tid] = p.w.code[tid];
    if (NESTED) map_s[tid] = p.w.nested_map[tid];

    int wr_t, sub; /* this thread's 32 W values per step (nf4g_thread_chunk) */
    int64_t e_base, e_step;
    nf4g_thread_chunk<DGRAD>(tid, n0, p.wrows, p.wcols, &wr_t, &sub, &e_base, &e_step);

    auto load_stage = [&](int s, int kt) {
        const int64_t k0 = (int64_t)kt * NF4G_BK;
        const uint32_t sa = sbase + L::off_a + s * L::a_stage;
#pragma unroll
        for (int id = tid; id < BM * 8; id += NF4G_THREADS) {
            int r = id >> 3, ch = id & 7;
            int64_t gr = m0 + r < p.T ? m0 + r : p.T - 1;
            nf4g_cp16(sa + nf4g_a_off(r, ch), p.a + gr * p.kred + k0 + ch * 8);
        }
        const int64_t e = e_base + kt * e_step, b = e >> p.sh_block;
        nf4g_cp16(sbase + L::off_codes + s * L::codes_stage + tid * 16, p.w.codes + (e >> 1));
        const uint32_t ss = sbase + L::off_scale + s * L::scale_stage + tid * 8;
        if (NESTED) {
            nf4g_cp4(ss, p.w.qabsmax + (b & ~(int64_t)3));
            nf4g_cp4(ss + 4, p.w.nested_absmax + (b >> p.sh_nested));
        } else {
            nf4g_cp4(ss, p.w.absmax + b);
        }
    };

    auto dequant = [&](int s, int buf, int kt) {
        const int64_t e = e_base + kt * e_step, b = e >> p.sh_block;
        const uint4 cw = *reinterpret_cast<const uint4 *>(sm + L::off_codes + s * L::codes_stage + tid * 16);
        const uint2 sc = *reinterpret_cast<const uint2 *>(sm + L::off_scale + s * L::scale_stage + tid * 8);
        float am;
        if (NESTED)
            am = __fadd_rn(__fmul_rn(map_s[(sc.x >> (8 * (int)(b & 3))) & 0xff], __uint_as_float(sc.y)),
                           p.w.offset);
        else
            am = __uint_as_float(sc.x);
        const uint32_t w[4] = {cw.x, cw.y, cw.z, cw.w};
        uint8_t *wb = sm + L::off_wb + buf * L::wb;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            *reinterpret_cast<uint4 *>(wb + nf4g_w_off<DGRAD>(wr_t, 4 * sub + j)) =
                nf4_word_bf16(w[j], code_s, am);
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.0f;

    auto compute = [&](int s, int buf) {
        const uint32_t sa = sbase + L::off_a + s * L::a_stage;
        const uint32_t sw = sbase + L::off_wb + buf * L::wb;
#pragma unroll
        for (int kk = 0; kk < NF4G_BK / 16; kk++) {
            uint32_t af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; i++) nf4g_ldsm4(af[i], sa + nf4g_lda(wm * WTM + i * 16, kk, lane));
#pragma unroll
            for (int jj = 0; jj < NI / 2; jj++) {
                uint32_t r4[4];
                const uint32_t addr = sw + nf4g_ldb<DGRAD>(wn * WTN + jj * 16, kk, lane);
                if (!DGRAD) nf4g_ldsm4(r4, addr);   /* tile rows = n: (n, k) matrices are B */
                else nf4g_ldsm4_t(r4, addr);        /* tile rows = k: transposed loads */
                bf[2 * jj][0] = r4[0];
                bf[2 * jj][1] = r4[1];
                bf[2 * jj + 1][0] = r4[2];
                bf[2 * jj + 1][1] = r4[3];
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++) nf4g_mma(acc[i][j], af[i], bf[j]);
        }
    };

    /* Pipeline: group g of cp.async = step kt0 + g (empty groups past the end keep the count). */
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < KT) load_stage(s, kt0 + s);
        nf4g_commit();
    }
    nf4g_wait<STAGES - 2>();
    __syncthreads(); /* code and map tables */
    dequant(0, 0, kt0);
    __syncthreads();
    for (int it = 0; it < KT; it++) {
        /* stage (it + STAGES - 1) % STAGES last held step it - 1: its A was read by the
         * previous compute and its codes by the dequantization before that, both behind the
         * previous barrier */
        if (it + STAGES - 1 < KT) load_stage((it + STAGES - 1) % STAGES, kt0 + it + STAGES - 1);
        nf4g_commit();
        compute(it % STAGES, it & 1);
        nf4g_wait<STAGES - 2>(); /* this thread's copies of step it + 1 have landed */
        if (it + 1 < KT) dequant((it + 1) % STAGES, (it + 1) & 1, kt0 + it + 1);
        __syncthreads();
    }
    nf4g_wait<0>();

    /* Epilogue: fragment (i, j) holds rows g, g + 8 and columns 2t, 2t + 1 of its 16x8 tile. */
    float *c = p.c + (p.splits > 1 ? (int64_t)z * p.T * p.ncols : 0);
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++) {
            const int64_t col = n0 + wn * WTN + j * 8 + 2 * (lane & 3);
            if (col >= p.ncols) continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t row = m0 + wm * WTM + i * 16 + (lane >> 2) + 8 * h;
                if (row >= p.T) continue;
                float2 v = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                float2 *dst = reinterpret_cast<float2 *>(c + row * p.ncols + col);
                if (p.splits == 1 && p.beta != 0.0f) {
                    float2 old = *dst;
                    v.x = __fmaf_rn(p.beta, old.x, v.x);
                    v.y = __fmaf_rn(p.beta, old.y, v.y);
                }
                *dst = v;
            }
        }
}

/* c (n) = sum over z of part[z n + i], z ascending, + beta c (c not read when beta is 0). */
__global__ void k_nf4g_reduce(float *__restrict__ c, const float *__restrict__ part, int64_t n, int splits,
                              float beta)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int z = 1; z < splits; z++) s += part[(int64_t)z * n + i];
        if (beta != 0.0f) s = __fmaf_rn(beta, c[i], s);
        c[i] = s;
    }
}

/* ---- launcher ------------------------------------------------------------------------------ */

template <int BM, int WARPS_M, int STAGES, bool DGRAD, bool NESTED>
static cudaError_t nf4g_run(const nf4g_args &p, int64_t mt, int64_t nt, cudaStream_t s)
{
    auto kern = k_nf4_gemm<BM, WARPS_M, STAGES, DGRAD, NESTED>;
    const int bytes = nf4g_layout<BM, STAGES>::bytes;
#ifdef FT_MMA_EMU
    emu_kernel(kern, dim3((unsigned)mt, (unsigned)nt, (unsigned)p.splits), NF4G_THREADS, bytes, p);
    return cudaSuccess;
#else
    cudaError_t st = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (st != cudaSuccess) return st;
    kern<<<dim3((unsigned)mt, (unsigned)nt, (unsigned)p.splits), NF4G_THREADS, bytes, s>>>(p);
    return cudaGetLastError();
#endif
}

template <bool DGRAD, bool NESTED>
static cudaError_t nf4g_dispatch(int bm, const nf4g_args &p, int64_t mt, int64_t nt, cudaStream_t s)
{
    switch (bm) {
    case 16: return nf4g_run<16, 1, 6, DGRAD, NESTED>(p, mt, nt, s);
    case 32: return nf4g_run<32, 2, 5, DGRAD, NESTED>(p, mt, nt, s);
    case 64: return nf4g_run<64, 2, 4, DGRAD, NESTED>(p, mt, nt, s);
    default: return nf4g_run<128, 2, 3, DGRAD, NESTED>(p, mt, nt, s);
    }
}

static int nf4g_log2(int64_t v)
{
    int s = 0;
    while (s < 62 && ((int64_t)1 << s) < v) s++;
    return ((int64_t)1 << s) == v ? s : -1;
}

/* The tile height for T rows (16, 32, 64 or 128). */
static int nf4g_pick_bm(int64_t T)
{
    return T <= 16 ? 16 : T <= 32 ? 32 : T <= 64 ? 64 : 128;
}

/* Split count for an output of tiles CTAs over kt_total steps: enough CTAs for two per SM
 * when the output alone has fewer than one per SM, at least 4 steps per split, partials
 * within work_bytes. */
static int nf4g_pick_splits(int64_t tiles, int kt_total, int64_t part_bytes, size_t work_bytes, int n_sm)
{
    if (tiles >= n_sm) return 1;
    int64_t s = (2 * (int64_t)n_sm + tiles - 1) / tiles;
    if (s > kt_total / 4) s = kt_total / 4;
    if (part_bytes > 0 && s > (int64_t)(work_bytes / (size_t)part_bytes)) s = (int64_t)(work_bytes / (size_t)part_bytes);
    return s < 1 ? 1 : (int)s;
}

/* Checks the description and shapes; fills the shifts. Returns 0 or FT_E_INVALID. */
static int nf4g_check(const char *op, const void *c, const void *a, const ft_nf4_tensor *w, int64_t T,
                      int64_t N, int64_t K, int *sh_block, int *sh_nested)
{
    if (!w || !c || !a || !w->codes || !w->code ||
        (w->nested_blocksize ? !w->qabsmax || !w->nested_absmax || !w->nested_map : !w->absmax))
        return ft_err(FT_E_INVALID, "cuda %s: NULL buffer or bad tensor description", op);
    if (T < 0 || T > INT32_MAX || N <= 0 || K <= 0 || N % 64 || K % 64 || N > INT32_MAX || K > INT32_MAX ||
        w->n != N * K)
        return ft_err(FT_E_INVALID, "cuda %s: T %lld, W %lld x %lld (n %lld): N and K must be positive "
                      "multiples of 64 and n = N K", op, (long long)T, (long long)N, (long long)K,
                      (long long)w->n);
    int sb = nf4g_log2(w->blocksize), sn = w->nested_blocksize ? nf4g_log2(w->nested_blocksize) : 0;
    if (sb < 5 || sb > 12 || sn < 0 || w->nested_blocksize < 0 ||
        (w->nested_blocksize && (w->n >> sb) % 4))
        return ft_err(FT_E_INVALID, "cuda %s: blocksize %lld (a power of two 32..4096 needed), nested "
                      "block size %lld (a power of two; nested: n / blocksize a multiple of 4)", op,
                      (long long)w->blocksize, (long long)w->nested_blocksize);
    if (((uintptr_t)a & 15) || ((uintptr_t)c & 7) || ((uintptr_t)w->codes & 15) ||
        ((uintptr_t)w->code & 3) ||
        (w->nested_blocksize ? ((uintptr_t)w->qabsmax & 3) || ((uintptr_t)w->nested_absmax & 3) ||
                                   ((uintptr_t)w->nested_map & 3)
                             : ((uintptr_t)w->absmax & 3)))
        return ft_err(FT_E_INVALID, "cuda %s: alignment: activation 16 B, output 8 B, codes 16 B, "
                      "qabsmax and fp32 arrays 4 B", op);
    *sh_block = sb;
    *sh_nested = sn;
    return 0;
}

/* c (T, Ncols) = a (T, Kred) . B + beta c, B from w as described at the top; dgrad selects
 * the input gradient. bm: tile height (16, 32, 64, 128; 0 = by T); splits: split-K count (0 =
 * chosen; > 1 needs splits * T * Ncols floats in work). Shapes and alignment already checked.
 * Returns a CUDA status; cudaErrorInvalidValue when forced splits do not fit work. */
static cudaError_t nf4g_launch(int dgrad, float *c, const __nv_bfloat16 *a, const ft_nf4_tensor *w,
                               int64_t T, int64_t N, int64_t K, float beta, int sh_block, int sh_nested,
                               int bm, int splits, int n_sm, float *work, size_t work_bytes, cudaStream_t s)
{
    if (!T) return cudaSuccess;
    nf4g_args p;
    p.a = a;
    p.w = *w;
    p.T = T;
    p.wrows = N;
    p.wcols = K;
    p.kred = dgrad ? N : K;
    p.ncols = dgrad ? K : N;
    p.beta = beta;
    p.sh_block = sh_block;
    p.sh_nested = sh_nested;
    p.kt_total = (int)(p.kred / NF4G_BK);
    if (bm != 16 && bm != 32 && bm != 64 && bm != 128) bm = nf4g_pick_bm(T);
    const int64_t mt = (T + bm - 1) / bm, nt = (p.ncols + NF4G_BN - 1) / NF4G_BN;
    const int64_t part_bytes = T * p.ncols * (int64_t)sizeof(float);
    if (splits <= 0) splits = work ? nf4g_pick_splits(mt * nt, p.kt_total, part_bytes, work_bytes, n_sm) : 1;
    if (splits > p.kt_total) splits = p.kt_total;
    if (splits > 1 && (!work || (size_t)splits * (size_t)part_bytes > work_bytes)) return cudaErrorInvalidValue;
    if (mt > 0x7fffffff) return cudaErrorInvalidValue;
    p.splits = splits;
    p.c = splits > 1 ? work : c;
    cudaError_t st;
    if (dgrad)
        st = w->nested_blocksize ? nf4g_dispatch<true, true>(bm, p, mt, nt, s)
                                 : nf4g_dispatch<true, false>(bm, p, mt, nt, s);
    else
        st = w->nested_blocksize ? nf4g_dispatch<false, true>(bm, p, mt, nt, s)
                                 : nf4g_dispatch<false, false>(bm, p, mt, nt, s);
    if (st != cudaSuccess || splits == 1) return st;
    const int64_t n = T * p.ncols;
#ifdef FT_MMA_EMU
    emu_kernel(k_nf4g_reduce, dim3(ft_cuda_blocks(n, 256)), 256, 0, c, (const float *)work, n, splits, beta);
    return cudaSuccess;
#else
    k_nf4g_reduce<<<ft_cuda_blocks(n, 256), 256, 0, s>>>(c, work, n, splits, beta);
    return cudaGetLastError();
#endif
}

#ifndef FT_NF4_GEMM_KERNELS_ONLY
/* The fused NF4 GEMM, either direction, with the tile height and split-K count exposed for
 * tests and benchmarks.
 *   dgrad 0: c = y  (T, N) fp32, a = x  (T, K) bf16: y  = x W^T + beta y
 *   dgrad 1: c = dx (T, K) fp32, a = dy (T, N) bf16: dx = dy W  + beta dx
 * w: W (N, K) = (out_features, in_features) NF4 in backend memory, w->n = N K. beta 0: c is
 * not read. bm: 16, 32, 64 or 128 rows per CTA (0 = chosen by T); splits: split-K count (0 =
 * chosen; partials in the backend's workspace). Enqueued on the backend's stream.
 * Returns 0, FT_E_INVALID (shapes, block sizes, alignment, splits that do not fit the
 * workspace) or -EIO (a launch failure). */
extern "C" int ft_cuda_nf4_linear(ft_backend *be, int dgrad, float *c, const uint16_t *a,
                                  const ft_nf4_tensor *w, int64_t T, int64_t N, int64_t K, float beta,
                                  int bm, int splits)
{
    const char *op = dgrad ? "nf4_linear_bwd_x" : "nf4_linear_fwd";
    int sb = 0, sn = 0;
    FT_TRY(nf4g_check(op, c, a, w, T, N, K, &sb, &sn));
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    if (splits > 1 && (size_t)splits * (size_t)T * (size_t)(dgrad ? K : N) * sizeof(float) > cx->work_bytes)
        return ft_err(FT_E_INVALID, "cuda %s: %d splits of %lld x %lld partials exceed the %zu-byte "
                      "workspace", op, splits, (long long)T, (long long)(dgrad ? K : N), cx->work_bytes);
    FT_CUDA_TRY(nf4g_launch(dgrad, c, (const __nv_bfloat16 *)a, w, T, N, K, beta, sb, sn, bm, splits,
                            cx->n_sm, (float *)cx->work, cx->work_bytes, cx->stream));
    return 0;
}

/* y (T, N) = x (T, K) W^T + beta y: x bf16, y fp32, W (N, K) NF4 (see ft_cuda_nf4_linear). */
extern "C" int ft_cuda_nf4_linear_fwd(ft_backend *be, float *y, const uint16_t *x, const ft_nf4_tensor *w,
                                      int64_t T, int64_t N, int64_t K, float beta)
{
    return ft_cuda_nf4_linear(be, 0, y, x, w, T, N, K, beta, 0, 0);
}

/* dx (T, K) = dy (T, N) W + beta dx: dy bf16, dx fp32, W (N, K) NF4 (see ft_cuda_nf4_linear). */
extern "C" int ft_cuda_nf4_linear_bwd_x(ft_backend *be, float *dx, const uint16_t *dy, const ft_nf4_tensor *w,
                                        int64_t T, int64_t N, int64_t K, float beta)
{
    return ft_cuda_nf4_linear(be, 1, dx, dy, w, T, N, K, beta, 0, 0);
}
#endif
