// attention_paged: one block of kWarps warps per (query row, head). Each
// warp takes every kWarps-th tile of 32 keys: its lanes score one key each
// (the key's block id looked up in the sequence's table), the warp folds the
// tile into its running softmax, and every lane adds the tile's weighted V
// rows for its own output dims. The warps' partial softmaxes are merged in
// warp order at the end, with the head's sink logit (gpt-oss) joining the
// denominator last. Fixed splits and shuffle trees, no atomics: the
// same inputs give the same bits whatever else is in the step.
#include <cmath>
#include <string>

#include "ehcuda/attention_paged.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/kernels.hpp"
#include "ehcuda/launch.cuh"
#include "kv_quant.cuh"
#include "paged_tiles.cuh"

namespace ehcuda {
namespace {

// Warps per (row, head) block: 4, or 16 when the step has too few rows to
// fill the GPU otherwise (a decode step of one sequence has n_head blocks).
constexpr int kWarpsWide = 16;

// key_dot over a quantized row: head element e (row element e0 + e) is
// scale sc[(e0 + e) / 32] times its code, exactly the float the CPU
// reference dequantizes. With hd % 16 == 0 the codes come as 16-byte
// pieces (each inside one 32-value block), all issued before the first is
// used, as key_dot's; else one by one (head dims such as 8).
template <int DPL, class C>
__device__ __forceinline__ float key_dot_quant(const uint8_t* k, const __half* sc, int e0, const float* qs, int hd) {
    float dot = 0.0f;
    if (hd % 16 == 0) {
        constexpr int kPieces = DPL * 2;  // 16 codes each
        uint4 piece[kPieces];
        float d[kPieces];
#pragma unroll
        for (int c = 0; c < kPieces; ++c)
            if (c < hd / 16) {
                piece[c] = reinterpret_cast<const uint4*>(k)[c];
                d[c] = __half2float(sc[(e0 + 16 * c) / kKvQuantBlock]);
            }
#pragma unroll
        for (int c = 0; c < kPieces; ++c) {
            if (c >= hd / 16) break;
            const uint8_t* code = reinterpret_cast<const uint8_t*>(&piece[c]);
#pragma unroll
            for (int j = 0; j < 16; ++j) dot = fmaf(qs[16 * c + j], detail::kv_code(C{}, code[j]) * d[c], dot);
        }
        return dot;
    }
    for (int e = 0; e < hd; ++e)
        dot = fmaf(qs[e], detail::kv_code(C{}, k[e]) * __half2float(sc[(e0 + e) / kKvQuantBlock]), dot);
    return dot;
}

// DPL: output dims per lane, ceil(head_dim / 32).
// C: the pool's element, __half or a quantized tag (kv_quant.cuh).
template <int DPL, int kWarps, class C>
__global__ void __launch_bounds__(kWarps * 32) attn_paged_kernel(PagedAttnArgs a) {
    constexpr bool kQuant = detail::kQuantKv<C>;
    __shared__ float qs[kAttentionMaxHeadDim];
    __shared__ float part_m[kWarps], part_l[kWarps];
    __shared__ float part_acc[kWarps][DPL * 32];
    pdl_entry();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = blockIdx.x, head = blockIdx.y;
    const int hd = a.head_dim;
    const int kvh = head / (a.n_head / a.n_kv);
    const int qpos = a.d_pos[t];
    const int32_t* table = a.tables + a.d_table[t];
    const int kstart = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    const size_t kv_ld = size_t(a.n_kv) * hd;
    const __half* kbase = a.k_pool + size_t(kvh) * hd;
    const __half* vbase = a.v_pool + size_t(kvh) * hd;
    // (quantized: rows of the pool's bytes, the head's codes and scales)
    const detail::KvQuantRows<C> kq{reinterpret_cast<const uint8_t*>(a.k_pool), a.n_kv * hd, hd, nullptr};
    const detail::KvQuantRows<C> vq{reinterpret_cast<const uint8_t*>(a.v_pool), a.n_kv * hd, hd, nullptr};

    const float* q = a.q + size_t(t) * a.ldq + size_t(head) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[d] * a.scale;
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
    for (int kb = kstart + warp * 32; kb <= qpos; kb += kWarps * 32) {
        const int key = kb + lane;
        const bool valid = key <= qpos;
        float s = -INFINITY;
        size_t row = 0;
        if (valid) {
            row = detail::pool_row(table, key);
            if constexpr (kQuant) s = key_dot_quant<DPL, C>(kq.codes(row, kvh), kq.row_scales(row), kvh * hd, qs, hd);
            else s = detail::key_dot<DPL>(kbase + row * kv_ld, qs, hd);
        }
        // Lane 0's key (kb) is always valid.
        float mnew;
        const float p = detail::fold_tile<DPL>(s, valid, m, mnew, l, acc);
        const int nkeys = min(32, qpos - kb + 1);
#pragma unroll 8
        for (int j = 0; j < nkeys; ++j) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const unsigned long long rj = __shfl_sync(0xffffffffu, (unsigned long long)row, j);
            if constexpr (kQuant) {
                const uint8_t* vc = vq.codes(rj, kvh);
                const __half* vs = vq.row_scales(rj);
#pragma unroll
                for (int i = 0; i < DPL; ++i) {
                    const int d = lane + 32 * i;
                    if (d < hd)
                        acc[i] = fmaf(pj, detail::kv_code(C{}, vc[d]) * __half2float(vs[(kvh * hd + d) / kKvQuantBlock]),
                                      acc[i]);
                }
            } else {
                detail::add_value_row<DPL>(acc, pj, vbase + size_t(rj) * kv_ld, hd, lane);
            }
        }
        m = mnew;
    }
    detail::stash_warp<kWarps, DPL>(m, l, acc, part_m, part_l, part_acc, warp, lane);
    if (warp != 0) return;
    // The sink (when given) takes part in the maximum and the denominator
    // only: the warps' partials are merged in warp order, then the sink.
    detail::merge_warps<kWarps, DPL>(part_m, part_l, part_acc, a.sinks ? a.sinks[head] : -INFINITY, a.sinks != nullptr,
                                     a.out + size_t(t) * a.ldo + size_t(head) * hd, hd, lane);
}

template <int DPL, class C>
void launch_paged_as(const PagedAttnArgs& a, cudaStream_t stream) {
    const dim3 grid(unsigned(a.ntok), unsigned(a.n_head));
    if (a.ntok * a.n_head < 2 * detail::sm_count())
        launch("attn_paged_kernel", attn_paged_kernel<DPL, kWarpsWide, C>, grid, kWarpsWide * 32, 0, stream, a);
    else
        launch("attn_paged_kernel", attn_paged_kernel<DPL, 4, C>, grid, 4 * 32, 0, stream, a);
}

template <int DPL>
void launch_paged(const PagedAttnArgs& a, cudaStream_t stream) {
    if (a.kv_type == EH_TYPE_Q8_0) launch_paged_as<DPL, detail::KvQ8>(a, stream);
    else if (a.kv_type == EH_TYPE_FP8_E4M3) launch_paged_as<DPL, detail::KvF8>(a, stream);
    else launch_paged_as<DPL, __half>(a, stream);
}

}  // namespace

void attention_paged(const PagedAttnArgs& a, cudaStream_t stream) {
    if (!attention_head_dim_supported(a.head_dim) || a.head_dim % 2)
        throw ehp::Error(EH_UNSUPPORTED, "paged attention: head_dim " + std::to_string(a.head_dim) + " unsupported");
    if (a.n_kv <= 0 || a.n_head <= 0 || a.n_head % a.n_kv)
        throw ehp::Error(EH_INTERNAL, "paged attention: n_head must be a multiple of n_kv");
    if (a.kv_type && a.kv_type != EH_TYPE_F16 &&
        !(kv_type_quantized(a.kv_type) && a.n_kv * a.head_dim % kKvQuantBlock == 0))
        throw ehp::Error(EH_UNSUPPORTED, "paged attention: KV type " + std::to_string(a.kv_type) +
                                             " unsupported (F16, or Q8_0 / FP8_E4M3 with K/V rows of whole 32-value blocks)");
    if (a.ntok <= 0) return;
    if (a.n_head > 65535) throw ehp::Error(EH_UNSUPPORTED, "paged attention: more than 65535 heads");
    detail::with_dims_per_lane(a.head_dim, [&]<int DPL>() { launch_paged<DPL>(a, stream); });
    EHC_LAUNCHED("attn_paged_kernel");
}

}  // namespace ehcuda
