// rope_store_kv into a quantized pool (RopeArgs::kv_type Q8_0 / FP8_E4M3),
// and rope_table_store_kv's form (gpt-cuda, kv_quant_store.hpp): one block
// per (token, head). A query head's block rotates it in place in
// qkv, as rope_kernel does; a KV head's block rotates its K into shared
// memory and then quantizes K and V, one warp per 32-value block, into the
// head's codes and scales of the token's pool row (kv_quant.cuh). The same
// rotations as the F16 stores (rope.cuh, rope_table.cuh) and the same
// quantizer as the CPU reference, so the pool holds the bits the reference
// would.
#include <algorithm>
#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/kernels.hpp"
#include "ehcuda/kv_quant.hpp"
#include "ehcuda/kv_quant_store.hpp"
#include "ehcuda/launch.cuh"
#include "kv_quant.cuh"
#include "rope.cuh"
#include "rope_table.cuh"

namespace ehcuda {
namespace {

// Pair i of a head at position pos rotated: the model's frequencies
// (RopeArgs) or a frequency table (RopeTableArgs), each as its F16 store.
__device__ __forceinline__ void rotate_pair(const RopeArgs& a, int pos, int i, float x0, float x1, float* y0,
                                            float* y1) {
    float sn, cs;
    detail::rope_sincos(pos, i, a.n_rot, a.freq_base, a.freq_factors, &sn, &cs);
    detail::rope_rotate(x0, x1, sn, cs, y0, y1);
}
__device__ __forceinline__ void rotate_pair(const RopeTableArgs& a, int pos, int i, float x0, float x1, float* y0,
                                            float* y1) {
    detail::rope_table_pair(a, pos, i, x0, x1);
    *y0 = x0;
    *y1 = x1;
}

// Blocks y < n_head rotate query head y in place. The rest store K and V:
// one KV head each (kRow false: head dims that are whole 32-value blocks),
// or every KV head of the token in one block (kRow: a head dim such as 16
// or 48, whose blocks span heads, as the CPU reference's row blocks do).
template <class C, class A, bool kRow>
__global__ void rope_store_kv_quant_kernel(A a) {
    pdl_entry();
    extern __shared__ float sk[];  // the rotated K of the block's heads
    const int t = blockIdx.x, head = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pos = a.d_pos ? a.d_pos[t] : *a.d_pos0 + t;
    const int hd = a.head_dim, half_rot = a.n_rot / 2;
    const int nq = a.n_head * hd, kv_dim = a.n_kv * hd;
    float* row = a.qkv + size_t(t) * a.ld;
    if (head < a.n_head) {
        float* x = row + head * hd;
        for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
            float y0, y1;
            const int i0 = detail::rope_i0(i, half_rot, a.neox), i1 = detail::rope_i1(i, half_rot, a.neox);
            rotate_pair(a, pos, i, x[i0], x[i1], &y0, &y1);
            x[i0] = y0;
            x[i1] = y1;
        }
        return;
    }
    const int h0 = kRow ? 0 : head - a.n_head, h1 = kRow ? a.n_kv : h0 + 1;
    for (int h = h0; h < h1; ++h) {
        const float* x = row + nq + h * hd;
        float* k = sk + (h - h0) * hd;
        for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
            const int i0 = detail::rope_i0(i, half_rot, a.neox), i1 = detail::rope_i1(i, half_rot, a.neox);
            rotate_pair(a, pos, i, x[i0], x[i1], &k[i0], &k[i1]);
        }
        for (int d = a.n_rot + threadIdx.x; d < hd; d += blockDim.x) k[d] = x[d];
    }
    __syncthreads();
    // Row elements e0 .. e0 + n - 1, whole 32-value blocks either way.
    const int e0 = h0 * hd, n = (h1 - h0) * hd;
    const size_t cache_row = a.d_rows ? size_t(a.d_rows[t]) : size_t(pos);
    const size_t rb = kv_row_bytes(C::kType, kv_dim);
    uint8_t* kr = reinterpret_cast<uint8_t*>(a.k_cache) + cache_row * rb;
    uint8_t* vr = reinterpret_cast<uint8_t*>(a.v_cache) + cache_row * rb;
    const float* v = row + nq + kv_dim;
    for (int b = warp; b < n / kKvQuantBlock; b += blockDim.x / 32) {
        const int e = e0 + b * kKvQuantBlock;
        detail::kv_quantize_warp<C>(sk[e - e0 + lane], kr + e,
                                    reinterpret_cast<__half*>(kr + kv_scale_offset(kv_dim)) + e / kKvQuantBlock, lane);
        detail::kv_quantize_warp<C>(v[e + lane], vr + e,
                                    reinterpret_cast<__half*>(vr + kv_scale_offset(kv_dim)) + e / kKvQuantBlock, lane);
    }
}

template <class A>
void launch_store(const A& a, uint32_t kv_type, cudaStream_t stream) {
    const int kv_dim = a.n_kv * a.head_dim;
    if (!kv_type_quantized(kv_type) || kv_dim % kKvQuantBlock || a.head_dim > kAttentionMaxHeadDim)
        throw ehp::Error(EH_INTERNAL, "rope_store_kv_quant: a Q8_0 or FP8_E4M3 pool, a K/V row of whole 32-value "
                                      "blocks and a head dim up to " + std::to_string(kAttentionMaxHeadDim));
    // A head dim of whole blocks: a block per KV head; else a block per
    // token's KV heads together.
    const bool by_head = a.head_dim % kKvQuantBlock == 0;
    const dim3 grid(unsigned(a.ntok), unsigned(a.n_head + (by_head ? a.n_kv : 1)));
    const int threads = std::max(64, a.head_dim / 2 / 32 * 32);
    const size_t smem = size_t(by_head ? a.head_dim : kv_dim) * sizeof(float);
    detail::by_kv_quant(kv_type, [&]<class C>() {
        if (by_head)
            launch("rope_store_kv_quant_kernel", rope_store_kv_quant_kernel<C, A, false>, grid, threads, smem, stream, a);
        else
            launch("rope_store_kv_quant_kernel", rope_store_kv_quant_kernel<C, A, true>, grid, threads, smem, stream, a);
    });
    EHC_LAUNCHED("rope_store_kv_quant_kernel");
}

}  // namespace

void rope_store_kv_quant(const RopeArgs& a, cudaStream_t stream) {
    if (a.ntok <= 0) return;
    if (!a.d_pos != !a.d_rows) throw ehp::Error(EH_INTERNAL, "rope: d_pos and d_rows come together");
    if (a.n_rot <= 0 || a.n_rot > a.head_dim || a.n_rot % 2)
        throw ehp::Error(EH_INTERNAL, "rope: bad rotary dimension");
    launch_store(a, a.kv_type, stream);
}

void rope_table_store_kv_quant(const RopeTableArgs& a, uint32_t kv_type, cudaStream_t stream) {
    if (a.ntok <= 0) return;
    if (!a.d_pos || !a.d_rows) throw ehp::Error(EH_INTERNAL, "rope_table_store_kv_quant: a batched step's rows only");
    if (a.n_rot < 0 || a.n_rot > a.head_dim || a.n_rot % 2 || (a.n_rot > 0 && !a.inv_freq))
        throw ehp::Error(EH_INTERNAL, "rope: bad rotary dimension or missing frequency table");
    if (a.q_norm || a.k_norm || a.k_cache32)
        throw ehp::Error(EH_INTERNAL, "rope_table_store_kv_quant: no QK-norm weights or FP32 cache");
    launch_store(a, kv_type, stream);
}

}  // namespace ehcuda
