// attention_span: one block of four warps per (query row, head). Each warp
// takes every fourth tile of 32 keys in the row's range; a lane scores one
// key (its pool row looked up in the sequence's table), the warp folds the
// tile into its running softmax, and each lane adds the tile's weighted V
// values for its own output dims. The warps' partials are merged in warp
// order, so the same inputs give the same bits.
#include <cmath>
#include <string>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/attention_paged.hpp"
#include "ehcuda/attention_span.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"

namespace ehcuda {
namespace {

constexpr int kSpanWarps = 4;
constexpr int kSpanMaxHeadDim = 256;

__device__ __forceinline__ float span_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float span_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// DPL: output dims per lane, ceil(head_dim / 32).
template <int DPL>
__global__ void __launch_bounds__(kSpanWarps * 32) attn_span_kernel(SpanAttnArgs a) {
    __shared__ float qs[kSpanMaxHeadDim];
    __shared__ float part_m[kSpanWarps], part_l[kSpanWarps];
    __shared__ float part_acc[kSpanWarps][DPL * 32];
    pdl_entry();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = blockIdx.x, head = blockIdx.y;
    const int hd = a.head_dim;
    const int kvh = head / (a.n_head / a.n_kv);
    const int qpos = a.d_pos[t];
    const int last = qpos + a.d_reach[t];
    const int32_t* table = a.tables + a.d_table[t];
    const int kstart = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    const size_t kv_ld = size_t(a.n_kv) * hd;
    const __half* kbase = a.k_pool + size_t(kvh) * hd;
    const __half* vbase = a.v_pool + size_t(kvh) * hd;

    const float* q = a.q + size_t(t) * a.ldq + size_t(head) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[d] * a.scale;
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
    for (int kb = kstart + warp * 32; kb <= last; kb += kSpanWarps * 32) {
        const int key = kb + lane;
        const bool valid = key <= last;
        float s = -INFINITY;
        size_t row = 0;
        if (valid) {
            row = size_t(table[key / kPagedBlockTokens]) * kPagedBlockTokens + size_t(key % kPagedBlockTokens);
            const __half* k = kbase + row * kv_ld;
            float dot = 0.0f;
            if (hd % 8 == 0) {
                // 16-byte pieces of the key, all issued before the first is
                // used: the lane waits for memory once per key, not per pair.
                uint4 piece[DPL * 4];
#pragma unroll
                for (int c = 0; c < DPL * 4; ++c)
                    if (c < hd / 8) piece[c] = reinterpret_cast<const uint4*>(k)[c];
#pragma unroll
                for (int c = 0; c < DPL * 4; ++c) {
                    if (c >= hd / 8) break;
                    const __half2* h2 = reinterpret_cast<const __half2*>(&piece[c]);
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float2 kf = __half22float2(h2[j]);
                        dot = fmaf(qs[8 * c + 2 * j], kf.x, dot);
                        dot = fmaf(qs[8 * c + 2 * j + 1], kf.y, dot);
                    }
                }
            } else {
                const __half2* k2 = reinterpret_cast<const __half2*>(k);
                for (int d = 0; d < hd / 2; ++d) {
                    const float2 kf = __half22float2(k2[d]);
                    dot = fmaf(qs[2 * d], kf.x, dot);
                    dot = fmaf(qs[2 * d + 1], kf.y, dot);
                }
            }
            s = dot;
        }
        // Lane 0's key (kb) is always in range, so the tile's max is finite.
        const float mnew = fmaxf(m, span_warp_max(s));
        const float alpha = m == -INFINITY ? 0.0f : expf(m - mnew);
        const float p = valid ? expf(s - mnew) : 0.0f;
        l = l * alpha + span_warp_sum(p);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] *= alpha;
        const int nkeys = min(32, last - kb + 1);
        for (int j = 0; j < nkeys; ++j) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const unsigned long long rj = __shfl_sync(0xffffffffu, (unsigned long long)row, j);
            const __half* vr = vbase + size_t(rj) * kv_ld;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const int d = lane + 32 * i;
                if (d < hd) acc[i] = fmaf(pj, __half2float(vr[d]), acc[i]);
            }
        }
        m = mnew;
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) part_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kSpanWarps; ++w) M = fmaxf(M, part_m[w]);
    float L = 0.0f, f[kSpanWarps];
#pragma unroll
    for (int w = 0; w < kSpanWarps; ++w) {
        f[w] = part_m[w] == -INFINITY ? 0.0f : expf(part_m[w] - M);
        L += part_l[w] * f[w];
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float* o = a.out + size_t(t) * a.ldo + size_t(head) * hd;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d >= hd) continue;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < kSpanWarps; ++w) v = fmaf(part_acc[w][d], f[w], v);
        o[d] = v * inv;
    }
}

template <int DPL>
void launch_span(const SpanAttnArgs& a, cudaStream_t stream) {
    launch("attn_span_kernel", attn_span_kernel<DPL>, dim3(unsigned(a.ntok), unsigned(a.n_head)), kSpanWarps * 32, 0,
           stream, a);
}

}  // namespace

bool attention_span_takes(int head_dim) { return head_dim >= 2 && head_dim <= kSpanMaxHeadDim && head_dim % 2 == 0; }

void attention_span(const SpanAttnArgs& a, cudaStream_t stream) {
    if (!attention_span_takes(a.head_dim))
        throw ehp::Error(EH_UNSUPPORTED, "image span attention: head_dim " + std::to_string(a.head_dim) +
                                             " unsupported (even, 2 .. 256)");
    if (a.n_kv <= 0 || a.n_head <= 0 || a.n_head % a.n_kv)
        throw ehp::Error(EH_INTERNAL, "image span attention: n_head must be a multiple of n_kv");
    if (a.ntok <= 0) return;
    if (a.n_head > 65535) throw ehp::Error(EH_UNSUPPORTED, "image span attention: more than 65535 heads");
    switch ((a.head_dim + 31) / 32) {
    case 1: launch_span<1>(a, stream); break;
    case 2: launch_span<2>(a, stream); break;
    case 3: launch_span<3>(a, stream); break;
    case 4: launch_span<4>(a, stream); break;
    case 5: launch_span<5>(a, stream); break;
    case 6: launch_span<6>(a, stream); break;
    case 7: launch_span<7>(a, stream); break;
    default: launch_span<8>(a, stream); break;
    }
    EHC_LAUNCHED("attn_span_kernel");
}

}  // namespace ehcuda
