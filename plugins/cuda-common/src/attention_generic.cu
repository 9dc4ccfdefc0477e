// Attention for head dims the tiled kernels do not take (8, 16, 32, 80, ...):
// one warp per (query token, head), for prefill and decode alike. Lanes
// score 32 consecutive keys at a time (each a full dot product over the head
// dim), the warp folds the tile into its running softmax (online rescaling),
// then every lane adds the tile's weighted V rows for its own output dims.
// Fixed lane split and shuffle trees, no atomics: bitwise reproducible. A
// long context walks its keys serially in one warp; the models that need
// this kernel are small.
#include <cmath>
#include <string>

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/kernels.hpp"

namespace ehcuda {
namespace {

// DPL: output dims per lane, ceil(head_dim / 32).
template <int DPL>
__global__ void __launch_bounds__(32) attn_generic_kernel(AttnArgs a) {
    __shared__ float qs[kAttentionMaxHeadDim];
    const int lane = threadIdx.x;
    const int t = blockIdx.x, head = blockIdx.y;
    const int hd = a.head_dim;
    const int kvh = head / (a.n_head / a.n_kv);
    const int qpos = *a.d_pos0 + t;
    const int kstart = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    const size_t kv_ld = size_t(a.n_kv) * hd;
    const __half* kbase = a.k_cache + size_t(kvh) * hd;
    const __half* vbase = a.v_cache + size_t(kvh) * hd;

    const float* q = a.q + size_t(t) * a.ldq + size_t(head) * hd;
    for (int d = lane; d < hd; d += 32) qs[d] = q[d] * a.scale;
    __syncwarp();

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
    for (int kb = kstart; kb <= qpos; kb += 32) {
        const int key = kb + lane;
        const bool valid = key <= qpos;
        float s = -INFINITY;
        if (valid) {
            const __half* kr = kbase + size_t(key) * kv_ld;
            float dot = 0.0f;
            for (int d = 0; d < hd; ++d) dot = fmaf(qs[d], __half2float(kr[d]), dot);
            s = dot;
        }
        // Lane 0's key (kb) is always valid, so mt is finite.
        const float mt = detail::warp_max(s);
        const float mnew = fmaxf(m, mt);
        const float alpha = m == -INFINITY ? 0.0f : expf(m - mnew);
        const float p = valid ? expf(s - mnew) : 0.0f;
        l = l * alpha + detail::warp_sum(p);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] *= alpha;
        const int nkeys = min(32, qpos - kb + 1);
        for (int j = 0; j < nkeys; ++j) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const __half* vr = vbase + size_t(kb + j) * kv_ld;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const int d = lane + 32 * i;
                if (d < hd) acc[i] = fmaf(pj, __half2float(vr[d]), acc[i]);
            }
        }
        m = mnew;
    }
    float* o = a.out + size_t(t) * a.ldo + size_t(head) * hd;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) o[d] = acc[i] * inv;
    }
}

}  // namespace

void attention_generic(const AttnArgs& a, cudaStream_t stream) {
    if (!attention_head_dim_supported(a.head_dim))
        throw ehp::Error(EH_UNSUPPORTED, "attention: head_dim " + std::to_string(a.head_dim) + " unsupported (max " +
                                             std::to_string(kAttentionMaxHeadDim) + ")");
    if (a.n_kv <= 0 || a.n_head <= 0 || a.n_head % a.n_kv)
        throw ehp::Error(EH_INTERNAL, "attention: n_head must be a multiple of n_kv");
    if (a.ntok <= 0) return;
    if (a.n_head > 65535) throw ehp::Error(EH_UNSUPPORTED, "attention: more than 65535 heads");
    const dim3 grid(unsigned(a.ntok), unsigned(a.n_head));
    switch ((a.head_dim + 31) / 32) {
    case 1: attn_generic_kernel<1><<<grid, 32, 0, stream>>>(a); break;
    case 2: attn_generic_kernel<2><<<grid, 32, 0, stream>>>(a); break;
    case 3: attn_generic_kernel<3><<<grid, 32, 0, stream>>>(a); break;
    case 4: attn_generic_kernel<4><<<grid, 32, 0, stream>>>(a); break;
    case 5: attn_generic_kernel<5><<<grid, 32, 0, stream>>>(a); break;
    case 6: attn_generic_kernel<6><<<grid, 32, 0, stream>>>(a); break;
    case 7: attn_generic_kernel<7><<<grid, 32, 0, stream>>>(a); break;
    default: attn_generic_kernel<8><<<grid, 32, 0, stream>>>(a); break;
    }
    EHC_LAUNCHED("attn_generic_kernel");
}

}  // namespace ehcuda
