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

template <class C, class A>
__global__ void rope_store_kv_quant_kernel(A a) {
    pdl_entry();
    extern __shared__ float sk[];  // the head's rotated K
    const int t = blockIdx.x, head = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pos = a.d_pos ? a.d_pos[t] : *a.d_pos0 + t;
    const int hd = a.head_dim, half_rot = a.n_rot / 2;
    const int nq = a.n_head * hd, kv_dim = a.n_kv * hd;
    float* row = a.qkv + size_t(t) * a.ld;
    const bool is_q = head < a.n_head;
    const int kvh = head - a.n_head;
    float* x = is_q ? row + head * hd : row + nq + kvh * hd;
    for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
        float y0, y1;
        const int i0 = detail::rope_i0(i, half_rot, a.neox), i1 = detail::rope_i1(i, half_rot, a.neox);
        rotate_pair(a, pos, i, x[i0], x[i1], &y0, &y1);
        if (is_q) {
            x[i0] = y0;
            x[i1] = y1;
        } else {
            sk[i0] = y0;
            sk[i1] = y1;
        }
    }
    if (is_q) return;
    for (int d = a.n_rot + threadIdx.x; d < hd; d += blockDim.x) sk[d] = x[d];
    __syncthreads();
    const size_t cache_row = a.d_rows ? size_t(a.d_rows[t]) : size_t(pos);
    const size_t rb = kv_row_bytes(C::kType, kv_dim);
    const float* v = row + nq + kv_dim + kvh * hd;
    for (int b = warp; b < hd / kKvQuantBlock; b += blockDim.x / 32) {
        const int e = b * kKvQuantBlock;
        const int sc = kvh * (hd / kKvQuantBlock) + b;
        uint8_t* kr = reinterpret_cast<uint8_t*>(a.k_cache) + cache_row * rb;
        uint8_t* vr = reinterpret_cast<uint8_t*>(a.v_cache) + cache_row * rb;
        detail::kv_quantize_warp<C>(sk[e + lane], kr + kvh * hd + e,
                                    reinterpret_cast<__half*>(kr + kv_scale_offset(kv_dim)) + sc, lane);
        detail::kv_quantize_warp<C>(v[e + lane], vr + kvh * hd + e,
                                    reinterpret_cast<__half*>(vr + kv_scale_offset(kv_dim)) + sc, lane);
    }
}

template <class A>
void launch_store(const A& a, uint32_t kv_type, cudaStream_t stream) {
    if (!kv_type_quantized(kv_type) || a.head_dim % kKvQuantBlock || a.head_dim > kAttentionMaxHeadDim)
        throw ehp::Error(EH_INTERNAL, "rope_store_kv_quant: a Q8_0 or FP8_E4M3 pool and a head dim that is a multiple "
                                      "of 32 up to " + std::to_string(kAttentionMaxHeadDim));
    const dim3 grid(unsigned(a.ntok), unsigned(a.n_head + a.n_kv));
    const int threads = std::max(64, a.head_dim / 2 / 32 * 32);
    const size_t smem = size_t(a.head_dim) * sizeof(float);
    detail::by_kv_quant(kv_type, [&]<class C>() {
        launch("rope_store_kv_quant_kernel", rope_store_kv_quant_kernel<C, A>, grid, threads, smem, stream, a);
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
