// attention_decode: split-K decode attention as two kernels, a decode
// kernel per (head, split) and a merge in split order (bitwise
// reproducible: no atomics). The plugins decode through the fused
// rope_attention_decode (attention_decode.cu); this pair is the tests'
// second opinion on it.
#include <algorithm>
#include <cmath>

#include "attention_decode.cuh"
#include "attention_dispatch.cuh"
#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/kernels.hpp"
#include "ehcuda/launch.cuh"
#include "online_softmax.cuh"

namespace ehcuda {
namespace {

using detail::by_dpl;
using detail::kDecodeWarps;
using detail::kKeysPerIter;
using detail::kMinChunk;
using detail::validate;

// scratch layout per (head, split): [m, l, acc[HD]]
template <int DPL>
__global__ void __launch_bounds__(kDecodeWarps * 32) attn_decode_kernel(AttnArgs a, float* scratch) {
    pdl_entry();
    pdl_release();
    constexpr int HD = DPL * 32;
    __shared__ float sm_m[kDecodeWarps], sm_l[kDecodeWarps];
    __shared__ float sm_acc[kDecodeWarps][HD];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int kvh = head / (a.n_head / a.n_kv);
    const int qpos = *a.d_pos0;
    const int len = qpos + 1;
    const int kstart = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    const int range = len - kstart;
    const int chunk = max(kMinChunk, (range + nsplit - 1) / nsplit);
    const int ks = kstart + split * chunk;
    const int ke = min(len, ks + chunk);
    const int kv_ld = a.n_kv * HD;

    float q[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) q[i] = a.q[head * HD + lane + 32 * i] * a.scale;

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
    // Warp w takes keys ks + w*G .. +G-1, then jumps by kDecodeWarps*G.
    for (int kb = ks + warp * kKeysPerIter; kb < ke; kb += kDecodeWarps * kKeysPerIter) {
        float kf[kKeysPerIter][DPL], vf[kKeysPerIter][DPL];
#pragma unroll
        for (int j = 0; j < kKeysPerIter; ++j) {
            const int key = min(kb + j, ke - 1);  // clamped: a valid row, masked below
            const __half* kr = a.k_cache + size_t(key) * kv_ld + kvh * HD;
            const __half* vr = a.v_cache + size_t(key) * kv_ld + kvh * HD;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                kf[j][i] = __half2float(kr[lane + 32 * i]);
                vf[j][i] = __half2float(vr[lane + 32 * i]);
            }
        }
        float s[kKeysPerIter];
        detail::score_keys<kKeysPerIter, DPL>(q, kf, s);
        detail::softmax_fold<kKeysPerIter, DPL>(s, vf, ke - kb, m, l, acc);
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();

    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, sm_m[w]);
    float* out = scratch + size_t(head * nsplit + split) * (HD + 2);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float A = 0.0f;
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w)
            if (sm_m[w] != -INFINITY) A += sm_acc[w][d] * __expf(sm_m[w] - M);
        out[2 + d] = A;
    }
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int w = 0; w < kDecodeWarps; ++w)
            if (sm_m[w] != -INFINITY) L += sm_l[w] * __expf(sm_m[w] - M);
        out[0] = M;
        out[1] = L;
    }
}

__global__ void attn_merge_kernel(const float* scratch, int nsplit, int hd, float* out) {
    pdl_entry();
    pdl_release();
    const int head = blockIdx.x;
    const float* base = scratch + size_t(head) * nsplit * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, base[size_t(s) * (hd + 2)]);
    float L = 0.0f;
    for (int s = 0; s < nsplit; ++s) {
        const float ms = base[size_t(s) * (hd + 2)];
        if (ms != -INFINITY) L += base[size_t(s) * (hd + 2) + 1] * __expf(ms - M);
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f;
        for (int s = 0; s < nsplit; ++s) {
            const float ms = base[size_t(s) * (hd + 2)];
            if (ms != -INFINITY) A += base[size_t(s) * (hd + 2) + 2 + d] * __expf(ms - M);
        }
        out[head * hd + d] = A * inv;
    }
}

}  // namespace

void attention_decode(const AttnArgs& a, float* scratch, int nsplit, cudaStream_t stream) {
    validate(a);
    if (a.ntok != 1) throw ehp::Error(EH_INTERNAL, "attention_decode: one token only");
    if (!attention_head_dim_fast(a.head_dim)) return attention_generic(a, stream);
    if (nsplit < 1) nsplit = 1;
    by_dpl(a.head_dim, [&]<int DPL>() {
        launch("attn_decode_kernel", attn_decode_kernel<DPL>, dim3(a.n_head, nsplit), kDecodeWarps * 32, 0, stream, a, scratch);
    });
    EHC_LAUNCHED("attn_decode_kernel");
    launch("attn_merge_kernel", attn_merge_kernel, a.n_head, 128, 0, stream, scratch, nsplit, a.head_dim, a.out);
    EHC_LAUNCHED("attn_merge_kernel");
}

}  // namespace ehcuda
