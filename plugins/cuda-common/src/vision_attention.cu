// The F16 tower's attention over every patch in one pass (flash attention
// on the tensor cores, nvcuda::wmma): a block of four warps takes 64
// queries of one head, each warp 16 of them, and walks the keys in tiles
// of 32: S = Q K^T (FP32 accumulation), the running softmax per query row
// (two lanes a row), P rounded to F16, O += P V, rescaled as the maximum
// moves. No N x N scores are written, which the GEMM path's memory traffic
// is (three passes over 4,096 x 4,096 floats per head and layer).
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

void flash_attention(const __half* qkv, int n, int width, int n_head, float scale, float* out, cudaStream_t s) {
    switch ((width / n_head + 15) / 16) {
    case 1: launch_flash<16>(qkv, n, width, n_head, scale, out, s); break;
    case 2: launch_flash<32>(qkv, n, width, n_head, scale, out, s); break;
    case 3: launch_flash<48>(qkv, n, width, n_head, scale, out, s); break;
    case 4: launch_flash<64>(qkv, n, width, n_head, scale, out, s); break;
    default: launch_flash<80>(qkv, n, width, n_head, scale, out, s); break;
    }
    EHC_LAUNCHED("vision_flash");
}

}  // namespace ehcuda::vision
