// GQA attention over the FP16 KV cache: prefill on CUDA cores
// (attention_prefill_simt: head dim 256, and the tests' second opinion on
// the tensor-core kernel of attention_prefill.cu). Decode is in
// attention_decode.cu.
//
// A block serves 8 consecutive queries of one head (one warp each); FP16 or
// FP32 cache, optional sink logits. K/V tiles of 32 positions are staged in
// shared memory once for all eight; each warp scores the tile (lane = key),
// then folds it into its running output with the online-softmax rescaling
// (flash-attention style), so the score matrix never exists in memory.
//
// Other head dims go to attention_generic (attention_generic.cu).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attention_dispatch.cuh"
#include "block_reduce.cuh"
#include "ehcuda/attention_prefill.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/kernels.hpp"
#include "ehcuda/launch.cuh"
#include "online_softmax.cuh"

namespace ehcuda {
namespace {

using detail::by_dpl;
using detail::validate;


constexpr int kQPerBlock = 8;
constexpr int kKeyTile = 32;

// Pairs of cache elements as stored (FP16 or FP32 caches) and as floats.
template <class C>
using Pair = std::conditional_t<std::is_same_v<C, __half>, __half2, float2>;
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_float2(float2 v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }

// DPL dims per lane; C the cache element (__half, or float for gpt-cuda's
// FP32 cache). With a.sinks, each head's sink logit joins the softmax's
// denominator (gpt-oss) and attends no value.
template <int DPL, class C>
__global__ void __launch_bounds__(kQPerBlock * 32) attn_prefill_kernel(AttnArgs a, const C* k_cache, const C* v_cache) {
    pdl_entry();
    using P = Pair<C>;
    constexpr int HD = DPL * 32;
    constexpr int KLD = HD + 2;  // padded row: lanes hit distinct banks
    __shared__ __align__(16) C Ks[kKeyTile * KLD];
    __shared__ __align__(16) C Vs[kKeyTile * HD];
    __shared__ float Qs[kQPerBlock][HD];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y;
    const int kvh = head / (a.n_head / a.n_kv);
    const int t = blockIdx.x * kQPerBlock + warp;
    const bool active = t < a.ntok;
    const int pos0 = *a.d_pos0;
    const int qpos = pos0 + t;
    const int kv_ld = a.n_kv * HD;

    if (active) {
        const float* q = a.q + size_t(t) * a.ldq + head * HD;
#pragma unroll
        for (int i = 0; i < DPL; ++i) Qs[warp][lane + 32 * i] = q[lane + 32 * i] * a.scale;
    }
    const int t_first = blockIdx.x * kQPerBlock;
    const int t_last = min(t_first + kQPerBlock, a.ntok) - 1;
    const int kend = pos0 + t_last + 1;
    const int kstart = a.window > 0 ? max(0, pos0 + t_first - a.window + 1) : 0;

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;

    for (int kb = kstart; kb < kend; kb += kKeyTile) {
        __syncthreads();
        for (int e = threadIdx.x; e < kKeyTile * (HD / 2); e += blockDim.x) {
            const int key = e / (HD / 2), d2 = e % (HD / 2);
            const int pos = kb + key;
            P kv, vv;
            if (pos < kend) {
                size_t off = size_t(pos) * kv_ld + kvh * HD + 2 * d2;
                kv = *reinterpret_cast<const P*>(k_cache + off);
                vv = *reinterpret_cast<const P*>(v_cache + off);
            } else {
                // (zero bits are 0.0 in both formats)
                kv = vv = P{};
            }
            *reinterpret_cast<P*>(Ks + key * KLD + 2 * d2) = kv;
            *reinterpret_cast<P*>(Vs + key * HD + 2 * d2) = vv;
        }
        __syncthreads();
        if (!active) continue;

        const int key = kb + lane;
        const bool valid = key <= qpos && (a.window <= 0 || key > qpos - a.window);
        float s = -INFINITY;
        if (valid) {
            float dot = 0.0f;
            const P* kr = reinterpret_cast<const P*>(Ks + lane * KLD);
#pragma unroll 8
            for (int d2 = 0; d2 < HD / 2; ++d2) {
                const float2 kf = to_float2(kr[d2]);
                dot = fmaf(Qs[warp][2 * d2], kf.x, dot);
                dot = fmaf(Qs[warp][2 * d2 + 1], kf.y, dot);
            }
            s = dot;
        }
        const float mt = detail::warp_max(s);
        if (mt == -INFINITY) continue;
        const float mnew = fmaxf(m, mt);
        const float alpha = (m == -INFINITY) ? 0.0f : __expf(m - mnew);
        const float p = valid ? __expf(s - mnew) : 0.0f;
        l = l * alpha + detail::warp_sum(p);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] *= alpha;
        for (int j = 0; j < kKeyTile; ++j) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            if (pj == 0.0f) continue;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[i] = fmaf(pj, to_float(Vs[j * HD + lane + 32 * i]), acc[i]);
        }
        m = mnew;
    }
    if (active) {
        if (a.sinks) {
            const float sink = a.sinks[head];
            const float M = fmaxf(m, sink);
            const float f = m == -INFINITY ? 0.0f : __expf(m - M);
            l = l * f + __expf(sink - M);
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[i] *= f;
        }
        float* o = a.out + size_t(t) * a.ldo + head * HD;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[lane + 32 * i] = acc[i] * inv;
    }
}


}  // namespace

bool attention_head_dim_supported(int hd) { return hd >= 1 && hd <= kAttentionMaxHeadDim; }

bool attention_prefill_takes(const AttnArgs& a) {
    if (!a.k_cache32 && !a.sinks) return true;
    return attention_head_dim_fast(a.head_dim) && (!a.k_cache32 || (a.v_cache32 && a.head_dim <= 128));
}

void attention_prefill_simt(const AttnArgs& a, cudaStream_t stream) {
    validate(a);
    if (!attention_prefill_takes(a))
        throw ehp::Error(EH_INTERNAL, "attention_prefill: an FP32 cache or sinks need head dim 64, 96 or 128 (check attention_prefill_takes)");
    if (a.ntok <= 0) return;
    if (!attention_head_dim_fast(a.head_dim)) return attention_generic(a, stream);
    dim3 grid((a.ntok + kQPerBlock - 1) / kQPerBlock, a.n_head);
    by_dpl(a.head_dim, [&]<int DPL>() {
        if (a.k_cache32) {
            if constexpr (DPL <= 4)
                launch("attn_prefill_kernel", attn_prefill_kernel<DPL, float>, grid, kQPerBlock * 32, 0, stream, a,
                       a.k_cache32, a.v_cache32);
        } else {
            launch("attn_prefill_kernel", attn_prefill_kernel<DPL, __half>, grid, kQPerBlock * 32, 0, stream, a,
                   a.k_cache, a.v_cache);
        }
    });
    EHC_LAUNCHED("attn_prefill_kernel");
}

}  // namespace ehcuda
