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
#include "paged_tiles.cuh"

namespace ehcuda {
namespace {

constexpr int kSpanWarps = 4;
constexpr int kSpanMaxHeadDim = 256;

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
            row = detail::pool_row(table, key);
            s = detail::key_dot<DPL>(kbase + row * kv_ld, qs, hd);
        }
        // Lane 0's key (kb) is always in range.
        float mnew;
        const float p = detail::fold_tile<DPL>(s, valid, m, mnew, l, acc);
        const int nkeys = min(32, last - kb + 1);
        for (int j = 0; j < nkeys; ++j) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const unsigned long long rj = __shfl_sync(0xffffffffu, (unsigned long long)row, j);
            detail::add_value_row<DPL>(acc, pj, vbase + size_t(rj) * kv_ld, hd, lane);
        }
        m = mnew;
    }
    detail::stash_warp<kSpanWarps, DPL>(m, l, acc, part_m, part_l, part_acc, warp, lane);
    if (warp != 0) return;
    detail::merge_warps<kSpanWarps, DPL>(part_m, part_l, part_acc, -INFINITY, false,
                                         a.out + size_t(t) * a.ldo + size_t(head) * hd, hd, lane);
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
    detail::with_dims_per_lane(a.head_dim, [&]<int DPL>() { launch_span<DPL>(a, stream); });
    EHC_LAUNCHED("attn_span_kernel");
}

}  // namespace ehcuda
