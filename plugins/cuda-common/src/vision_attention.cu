// The F16 tower's attention over every patch in one pass (flash attention
// on the tensor cores): S = Q K^T with FP32 accumulation, the running
// softmax per query row in FP32, P rounded to F16, O += P V, rescaled as
// the maximum moves. No N x N scores are written, which the GEMM path's
// memory traffic is (three passes over 4,096 x 4,096 floats per head and
// layer). Two kernels: mma.sync with everything in registers (the default)
// and a simpler nvcuda::wmma one that goes through shared memory (a block
// of four warps takes 64 queries of one head, each warp 16 of them, keys in
// tiles of 32, two lanes a query row).
#include <mma.h>

#include <cmath>

#include "ehcuda/check.hpp"
#include "vision_ops.hpp"

namespace ehcuda::vision {
namespace {

constexpr int kQueries = 64;  // per block: 16 per warp
constexpr int kKeys = 32;     // per tile
constexpr int kMaxHdp = 80;   // the shared memory (45 KB at 80) stays under 48 KB

// Rows [row0, row0 + rows) of one head's hd values (stride ld halves), as
// rows of HDP halves zero-padded (past n rows, past hd dims), in 16-byte
// pieces (hd, ld and the head's offset are multiples of 8).
template <int HDP>
__device__ void load_rows(const __half* src, size_t ld, int hd, int row0, int rows, int n, __half* dst) {
    constexpr int kPieces = HDP / 8;
    for (int i = threadIdx.x; i < rows * kPieces; i += blockDim.x) {
        const int r = i / kPieces, p = i % kPieces, row = row0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row < n && p * 8 < hd) v = *reinterpret_cast<const uint4*>(src + size_t(row) * ld + size_t(p) * 8);
        *reinterpret_cast<uint4*>(dst + r * HDP + p * 8) = v;
    }
}

template <int HDP>
__global__ void __launch_bounds__(128) flash_kernel(const __half* qkv, int n, int W, int hd, float scale, float* out) {
    using namespace nvcuda;
    constexpr int kScratch = 16 * (HDP > kKeys ? HDP : kKeys);  // a warp's S (16 x 32), then its P V (16 x HDP)
    constexpr int kDims = HDP / 2;                              // a lane's output dims (two lanes a row)
    __shared__ __align__(32) __half qs[kQueries * HDP];
    __shared__ __align__(32) __half ks[kKeys * HDP];
    __shared__ __align__(32) __half vs[kKeys * HDP];
    __shared__ __align__(32) float scratch[4][kScratch];
    __shared__ __align__(32) __half ps[4][16 * kKeys];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int head = blockIdx.y, q0 = blockIdx.x * kQueries;
    const size_t ld = 3 * size_t(W);
    const __half* qb = qkv + size_t(head) * hd;
    const __half* kb = qb + W;
    const __half* vb = qb + 2 * size_t(W);
    load_rows<HDP>(qb, ld, hd, q0, kQueries, n, qs);

    const int r = lane >> 1, half = lane & 1;  // this lane's row of the warp's 16, and which half of it
    float o[kDims];
#pragma unroll
    for (int i = 0; i < kDims; ++i) o[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    float* S = scratch[warp];
    __half* P = ps[warp];
    for (int k0 = 0; k0 < n; k0 += kKeys) {
        __syncthreads();  // the tile before is read (and the Q tile written)
        load_rows<HDP>(kb, ld, hd, k0, kKeys, n, ks);
        load_rows<HDP>(vb, ld, hd, k0, kKeys, n, vs);
        __syncthreads();
        {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[2];
            wmma::fill_fragment(c[0], 0.0f);
            wmma::fill_fragment(c[1], 0.0f);
#pragma unroll
            for (int kk = 0; kk < HDP; kk += 16) {
                wmma::load_matrix_sync(a, qs + warp * 16 * HDP + kk, HDP);
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    wmma::load_matrix_sync(b, ks + j * 16 * HDP + kk, HDP);
                    wmma::mma_sync(c[j], a, b, c[j]);
                }
            }
            wmma::store_matrix_sync(S, c[0], kKeys, wmma::mem_row_major);
            wmma::store_matrix_sync(S + 16, c[1], kKeys, wmma::mem_row_major);
        }
        __syncwarp();
        // The running softmax of row r over this tile's keys (key k0 is
        // always there, so the row's new maximum is finite).
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int c = half * 16 + j;
            if (k0 + c < n) mx = fmaxf(mx, S[r * kKeys + c] * scale);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float mnew = fmaxf(m, mx);
        const float corr = m == -INFINITY ? 0.0f : expf(m - mnew);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int c = half * 16 + j;
            const float p = k0 + c < n ? expf(S[r * kKeys + c] * scale - mnew) : 0.0f;
            const __half ph = __float2half_rn(p);
            P[r * kKeys + c] = ph;
            sum += __half2float(ph);  // the denominator of what P V adds
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * corr + sum;
        m = mnew;
        __syncwarp();
        {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> vf;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
#pragma unroll
            for (int dt = 0; dt < HDP / 16; ++dt) {
                wmma::fill_fragment(acc, 0.0f);
#pragma unroll
                for (int kk = 0; kk < kKeys; kk += 16) {
                    wmma::load_matrix_sync(pa, P + kk, kKeys);
                    wmma::load_matrix_sync(vf, vs + kk * HDP + dt * 16, HDP);
                    wmma::mma_sync(acc, pa, vf, acc);
                }
                wmma::store_matrix_sync(S + dt * 16, acc, HDP, wmma::mem_row_major);
            }
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < kDims; ++i) o[i] = o[i] * corr + S[r * HDP + half * kDims + i];
        __syncwarp();  // S is written again by the next tile
    }
    const int q = q0 + warp * 16 + r;
    if (q >= n) return;
    const float inv = 1.0f / l;
    float* dst = out + size_t(q) * W + size_t(head) * hd;
#pragma unroll
    for (int i = 0; i < kDims; ++i) {
        const int d = half * kDims + i;
        if (d < hd) dst[d] = o[i] * inv;
    }
}

// The same attention on mma.sync (m16n8k16, FP32 accumulation) with the
// scores, probabilities and output in registers (the accumulator layout is
// the PTX ISA's, so a row's softmax runs on the quad of lanes that holds
// it and P feeds the next product without shared memory): eight warps of
// 16 queries a block, keys in tiles of 64 double-buffered with cp.async.
constexpr int kMmaWarps = 8;
constexpr int kMmaKeys = 64;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// One tile of keys (kMmaKeys rows of HDP halves, row stride LDS) into shared
// memory, zero past n rows and past hd dims.
template <int HDP, int LDS>
__device__ void load_tile_async(const __half* src, size_t ld, int hd, int row0, int n, __half* dst) {
    constexpr int kPieces = HDP / 8;
    for (int i = threadIdx.x; i < kMmaKeys * kPieces; i += kMmaWarps * 32) {
        const int r = i / kPieces, p = i % kPieces, row = row0 + r;
        const bool valid = row < n && p * 8 < hd;
        cp_async16(dst + r * LDS + p * 8, valid ? src + size_t(row) * ld + size_t(p) * 8 : src, valid);
    }
}

// seg (may be null): block row blockIdx.z attends within rows seg[z] ..
// seg[z + 1] - 1 only (its queries and keys), n then unused.
template <int HDP>
__global__ void __launch_bounds__(kMmaWarps * 32) flash_mma_kernel(const __half* qkv, int n, int W, int hd, float scale,
                                                                    float* out, const int32_t* seg) {
    constexpr int LDS = HDP + 8;  // padded rows: ldmatrix's eight row reads land in different banks
    constexpr int KS = HDP / 16;  // k-steps of S = Q K^T
    constexpr int NT = HDP / 8;   // n-tiles of O
    constexpr int kTile = kMmaKeys * LDS;  // halves of one tile; K stages 0, 1 then V stages 0, 1
    extern __shared__ __align__(16) __half smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int head = blockIdx.y;
    const int q0 = blockIdx.x * (kMmaWarps * 16) + warp * 16;
    const size_t ld = 3 * size_t(W);
    if (seg) {  // (the whole block leaves together: its first query is past the segment)
        const int first = seg[blockIdx.z];
        n = seg[blockIdx.z + 1] - first;
        if (int(blockIdx.x) * (kMmaWarps * 16) >= n) return;
        qkv += size_t(first) * ld;
        out += size_t(first) * W;
    }
    const __half* qb = qkv + size_t(head) * hd;
    const __half* kb = qb + W;
    const __half* vb = qb + 2 * size_t(W);

    load_tile_async<HDP, LDS>(kb, ld, hd, 0, n, smem);
    load_tile_async<HDP, LDS>(vb, ld, hd, 0, n, smem + 2 * kTile);
    cp_async_commit();

    // The warp's 16 query rows as A fragments (rows g and g + 8), zero past
    // n and past hd; the softmax scale in log2 units folded into them later.
    uint32_t qa[KS][4];
    {
        const int r0 = q0 + g, r1 = q0 + g + 8;
        auto q2 = [&](int row, int d) -> uint32_t {
            if (row >= n || d >= hd) return 0u;
            return *reinterpret_cast<const uint32_t*>(qb + size_t(row) * ld + d);
        };
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            qa[s][0] = q2(r0, 16 * s + 2 * t);
            qa[s][1] = q2(r1, 16 * s + 2 * t);
            qa[s][2] = q2(r0, 16 * s + 8 + 2 * t);
            qa[s][3] = q2(r1, 16 * s + 8 + 2 * t);
        }
    }
    const float sl2 = scale * 1.4426950408889634f;  // exp(x * scale) = exp2(x * sl2)
    float o[NT][4];
#pragma unroll
    for (int d = 0; d < NT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // rows g and g + 8 (l: this lane's share)

    const int ntiles = (n + kMmaKeys - 1) / kMmaKeys;
    for (int it = 0; it < ntiles; ++it) {
        const int cur = it & 1;
        if (it + 1 < ntiles) {
            load_tile_async<HDP, LDS>(kb, ld, hd, (it + 1) * kMmaKeys, n, smem + (cur ^ 1) * kTile);
            load_tile_async<HDP, LDS>(vb, ld, hd, (it + 1) * kMmaKeys, n, smem + (2 + (cur ^ 1)) * kTile);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const __half* ks = smem + cur * kTile;
        const __half* vs = smem + (2 + cur) * kTile;
        const int k0 = it * kMmaKeys;

        float sc[kMmaKeys / 8][4];
#pragma unroll
        for (int j = 0; j < kMmaKeys / 8; ++j) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
            const __half* krow = ks + (8 * j + g) * LDS + 2 * t;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + 16 * s);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + 16 * s + 8);
                mma16816(sc[j], qa[s], b0, b1);
            }
        }
        // Scores in log2 units; keys past n out.
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < kMmaKeys / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + 8 * j + 2 * t + (e & 1);
                sc[j][e] = key < n ? sc[j][e] * sl2 : -INFINITY;
            }
            mx0 = fmaxf(mx0, fmaxf(sc[j][0], sc[j][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[j][2], sc[j][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        // (key k0 is in every tile, so the new maxima are finite)
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float c0 = m0 == -INFINITY ? 0.0f : exp2f(m0 - n0), c1 = m1 == -INFINITY ? 0.0f : exp2f(m1 - n1);
        m0 = n0;
        m1 = n1;
        l0 *= c0;
        l1 *= c1;
#pragma unroll
        for (int d = 0; d < NT; ++d) {
            o[d][0] *= c0;
            o[d][1] *= c0;
            o[d][2] *= c1;
            o[d][3] *= c1;
        }
        // P as the A fragments of P V (rounded to F16; the sums count what is added).
        uint32_t pa[kMmaKeys / 16][4];
#pragma unroll
        for (int j = 0; j < kMmaKeys / 8; ++j) {
            const float p0 = exp2f(sc[j][0] - n0), p1 = exp2f(sc[j][1] - n0);
            const float p2 = exp2f(sc[j][2] - n1), p3 = exp2f(sc[j][3] - n1);
            const uint32_t lo = pack_half2(p0, p1), hi = pack_half2(p2, p3);
            const float2 flo = __half22float2(*reinterpret_cast<const __half2*>(&lo));
            const float2 fhi = __half22float2(*reinterpret_cast<const __half2*>(&hi));
            l0 += flo.x + flo.y;
            l1 += fhi.x + fhi.y;
            pa[j / 2][(j & 1) * 2 + 0] = lo;
            pa[j / 2][(j & 1) * 2 + 1] = hi;
        }
#pragma unroll
        for (int u = 0; u < kMmaKeys / 16; ++u) {
            // The fragment of keys 16u .. 16u + 15: rows g (a0, a2) and g + 8 (a1, a3).
            const uint32_t a[4] = {pa[u][0], pa[u][1], pa[u][2], pa[u][3]};
            const __half* vrow = vs + (16 * u + (lane & 15)) * LDS;
#pragma unroll
            for (int d = 0; d < NT; ++d) {
                uint32_t b0, b1;
                asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                             : "=r"(b0), "=r"(b1)
                             : "r"(smem_addr(vrow + 8 * d)));
                mma16816(o[d], a, b0, b1);
            }
        }
        __syncthreads();  // this stage is refilled two tiles on
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = 1.0f / l0, i1 = 1.0f / l1;
    const int r0 = q0 + g, r1 = q0 + g + 8;
#pragma unroll
    for (int d = 0; d < NT; ++d) {
        const int dim = 8 * d + 2 * t;
        if (dim >= hd) continue;
        if (r0 < n) {
            float* dst = out + size_t(r0) * W + size_t(head) * hd + dim;
            dst[0] = o[d][0] * i0;
            dst[1] = o[d][1] * i0;
        }
        if (r1 < n) {
            float* dst = out + size_t(r1) * W + size_t(head) * hd + dim;
            dst[0] = o[d][2] * i1;
            dst[1] = o[d][3] * i1;
        }
    }
}

// (seg: n_seg segments of at most n rows each)
template <int HDP>
void launch_flash_mma(const __half* qkv, int n, int width, int n_head, float scale, float* out, cudaStream_t s,
                      const int32_t* seg = nullptr, int n_seg = 1) {
    // K and V, two stages each: 45 KB at HDP 80, under the 48 KB a launch
    // takes without opting in.
    constexpr size_t smem = size_t(4) * kMmaKeys * (HDP + 8) * sizeof(__half);
    static_assert(smem <= 48 * 1024);
    const dim3 grid(unsigned((n + kMmaWarps * 16 - 1) / (kMmaWarps * 16)), unsigned(n_head), unsigned(n_seg));
    flash_mma_kernel<HDP><<<grid, kMmaWarps * 32, smem, s>>>(qkv, n, width, width / n_head, scale, out, seg);
}

template <int HDP>
void launch_flash(const __half* qkv, int n, int width, int n_head, float scale, float* out, cudaStream_t s) {
    const dim3 grid(unsigned((n + kQueries - 1) / kQueries), unsigned(n_head));
    flash_kernel<HDP><<<grid, 128, 0, s>>>(qkv, n, width, width / n_head, scale, out);
}

}  // namespace

bool flash_takes(int width, int n_head) {
    if (n_head <= 0 || width % n_head) return false;
    const int hd = width / n_head;
    return hd % 8 == 0 && hd <= kMaxHdp && width % 8 == 0 && n_head <= 65535;
}

void flash_attention(const __half* qkv, int n, int width, int n_head, float scale, float* out, cudaStream_t s,
                     FlashKernel kernel) {
    if (n <= 0) return;
    if (kernel == FlashKernel::Mma) {
        switch ((width / n_head + 15) / 16) {
        case 1: launch_flash_mma<16>(qkv, n, width, n_head, scale, out, s); break;
        case 2: launch_flash_mma<32>(qkv, n, width, n_head, scale, out, s); break;
        case 3: launch_flash_mma<48>(qkv, n, width, n_head, scale, out, s); break;
        case 4: launch_flash_mma<64>(qkv, n, width, n_head, scale, out, s); break;
        default: launch_flash_mma<80>(qkv, n, width, n_head, scale, out, s); break;
        }
        EHC_LAUNCHED("vision_flash_mma");
        return;
    }
    switch ((width / n_head + 15) / 16) {
    case 1: launch_flash<16>(qkv, n, width, n_head, scale, out, s); break;
    case 2: launch_flash<32>(qkv, n, width, n_head, scale, out, s); break;
    case 3: launch_flash<48>(qkv, n, width, n_head, scale, out, s); break;
    case 4: launch_flash<64>(qkv, n, width, n_head, scale, out, s); break;
    default: launch_flash<80>(qkv, n, width, n_head, scale, out, s); break;
    }
    EHC_LAUNCHED("vision_flash");
}

void flash_attention_segments(const __half* qkv, const int32_t* d_seg, int n_seg, int max_rows, int width, int n_head,
                              float scale, float* out, cudaStream_t s) {
    if (n_seg <= 0 || max_rows <= 0) return;
    switch ((width / n_head + 15) / 16) {
    case 1: launch_flash_mma<16>(qkv, max_rows, width, n_head, scale, out, s, d_seg, n_seg); break;
    case 2: launch_flash_mma<32>(qkv, max_rows, width, n_head, scale, out, s, d_seg, n_seg); break;
    case 3: launch_flash_mma<48>(qkv, max_rows, width, n_head, scale, out, s, d_seg, n_seg); break;
    case 4: launch_flash_mma<64>(qkv, max_rows, width, n_head, scale, out, s, d_seg, n_seg); break;
    default: launch_flash_mma<80>(qkv, max_rows, width, n_head, scale, out, s, d_seg, n_seg); break;
    }
    EHC_LAUNCHED("vision_flash_mma_segments");
}

}  // namespace ehcuda::vision
