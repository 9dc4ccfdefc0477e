// Prefill attention on the tensor cores (flash-attention style).
//
// A block takes 16 queries per warp (kWarps warps: a tile of kQTile query
// rows) of one head and walks the key range in tiles of kKeyTile keys. Per
// tile, each warp computes S = Q K^T with mma.sync m16n8k16 (FP16 inputs,
// FP32 accumulation), folds S into its running row max / row sum (online
// softmax, base 2: Q is pre-scaled by scale * log2 e), and accumulates
// O += P V with P converted to FP16 straight from the S accumulators (the
// m16n8 accumulator layout of two neighbouring key octets is the A-operand
// layout of one 16-key step). The score matrix never leaves registers.
//
// FP16 cache: K/V tiles are staged with cp.async, two stages deep, so the
// next tile's copy overlaps this tile's math. FP32 cache (gpt-cuda keeps
// FP32 K/V because FP16 rounding flipped near-tied MoE routes, see its
// session.cpp): every operand is split into FP16 hi + lo parts and each
// product is hi*hi + hi*lo + lo*hi (three MMAs), about 22 bits of each input
// kept instead of 11, so the FP32 cache's precision is not thrown away.
//
// Too few blocks for the GPU (short chunks of many-key prefills: 256
// queries x 14 heads is 56 blocks on 132 multiprocessors) split the key
// range over blockIdx.z; each split writes (max, sum, unnormalised O) per
// row and flash_merge_kernel combines them in split order (deterministic,
// no atomics). Sinks (gpt-oss) join the denominator at the last step.
//
// All K/V addressing goes through KvRows::row(): position p's row of a
// contiguous cache, or of a batched step's paged pool through the
// sequence's block table (AttnArgs::kv_table).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ehcuda/attention_paged.hpp"
#include "ehcuda/attention_prefill.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/kernels.hpp"
#include "ehcuda/launch.cuh"
#include "flash_tile.cuh"
#include "kv_quant.cuh"

namespace ehcuda {
namespace {

using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::KvRows;
using detail::kKeyTile;
using detail::kLog2e;
using detail::Tile;

constexpr int kWarps = 4;
constexpr int kQTile = kWarps * 16;  // query rows per block
constexpr int kMaxSplits = 16;
// Splits are added until the grid has about this many blocks per
// multiprocessor (3 blocks of 4 warps are resident per SM at head dim 128).
constexpr int kBlocksPerSm = 3;
// Blocks whose partial rows the split scratch holds (attention_prefill_scratch_floats).
constexpr int kMaxSplitBlocks = 512;

// Head dims the tensor-core kernel is compiled for (and so takes).
constexpr int kMmaHeadDims[] = {64, 96, 128};

struct FlashArgs {
    const float* q;
    int ldq;
    int n_head, group;  // group: query heads per KV head
    const int32_t* d_pos0;
    int ntok, window;
    float qscale;  // scale * log2 e
    float* out;
    int ldo;
    const float* sinks;  // natural-log logits, or null
    float* scratch;      // split partials, when nsplit > 1
    int nsplit;
};

// Grid (query tiles, heads, splits); query tiles run latest-first (they
// have the most keys). Lane roles follow the m16n8k16 fragment layout:
// g = lane / 4 picks rows g and g + 8 of the warp's 16, tq = lane % 4 the
// column pair 2 tq, 2 tq + 1 of each 8-wide accumulator tile.
template <int HD, class C>
__global__ void __launch_bounds__(kWarps * 32) flash_prefill_kernel(FlashArgs f, KvRows<C> kr, KvRows<C> vr) {
    using T = Tile<HD, C>;
    constexpr bool kSplit = T::kSplit;
    constexpr int KS = HD / 16;        // k-steps of Q K^T
    constexpr int NO = HD / 8;         // 8-wide output column tiles
    constexpr int NS = kKeyTile / 8;   // 8-key score tiles
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* smem = reinterpret_cast<__half*>(smem_raw);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int qt = int(gridDim.x) - 1 - int(blockIdx.x);
    const int head = blockIdx.y, split = blockIdx.z;
    const int kvh = head / f.group;

    pdl_entry();
    const int pos0 = *f.d_pos0;
    const int t0 = qt * kQTile;
    const int t_last = min(t0 + kQTile, f.ntok) - 1;
    int ks = f.window > 0 ? max(0, pos0 + t0 - f.window + 1) : 0;
    int ke = pos0 + t_last + 1;
    if (f.nsplit > 1) {
        const int per = ((ke - ks + f.nsplit - 1) / f.nsplit + kKeyTile - 1) / kKeyTile * kKeyTile;
        ks += split * per;
        ke = min(ke, ks + per);
    }

    // This thread's two query rows (token index) and their positions.
    const int r0 = t0 + warp * 16 + g, r1 = r0 + 8;
    const int qp0 = pos0 + r0, qp1 = pos0 + r1;

    // Q fragments (A operand, row-major 16 x HD), scaled into log2 units.
    uint32_t qh[KS][4], ql[kSplit ? KS : 1][4];
    detail::q_fragments<HD, kSplit>(f.q + size_t(r0) * f.ldq + size_t(head) * HD,
                                    f.q + size_t(r1) * f.ldq + size_t(head) * HD, r0 < f.ntok, r1 < f.ntok, f.qscale,
                                    tq, qh, ql);

    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    const int ntiles = ke > ks ? (ke - ks + kKeyTile - 1) / kKeyTile : 0;
    if (ntiles > 0) {
        detail::stage_tile<HD, C, kWarps * 32>(smem, kr, vr, kvh, ks, ke);
        if constexpr (!kSplit) cp_async_commit();
    }
    for (int it = 0; it < ntiles; ++it) {
        const int kb = ks + it * kKeyTile;
        const __half* st = smem + (kSplit ? 0 : (it & 1) * 2 * T::kMat);
        if constexpr (!kSplit) {
            if (it + 1 < ntiles) {
                detail::stage_tile<HD, C, kWarps * 32>(smem + ((it + 1) & 1) * 2 * T::kMat, kr, vr, kvh, kb + kKeyTile, ke);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
        }
        __syncthreads();

        // S = Q K^T (16 x kKeyTile per warp).
        float s[NS][4];
#pragma unroll
        for (int j = 0; j < NS; ++j) detail::qk_keys8<HD, C>(st, 8 * j, lane, qh, ql, s[j]);

        // Mask where some key of the tile may be invalid for some row of
        // the block: past the split's end, past the first row's position
        // (causal), or before the last row's window.
        const bool need_mask = kb + kKeyTile > ke || kb + kKeyTile - 1 > pos0 + t0 ||
                               (f.window > 0 && kb <= pos0 + t_last - f.window);
        if (need_mask) {
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kb + 8 * j + 2 * tq + (e & 1);
                    const int qp = e < 2 ? qp0 : qp1;
                    const bool ok = key < ke && key <= qp && (f.window <= 0 || key > qp - f.window);
                    if (!ok) s[j][e] = -INFINITY;
                }
        }

        // Online softmax over the tile (rows g and g + 8), then O += P V in
        // 16-key steps.
        detail::softmax_fold(s, m0, m1, l0, l1, o);
        const __half* vs = st + (kSplit ? 2 : 1) * T::kMat;
#pragma unroll
        for (int kk = 0; kk < kKeyTile / 16; ++kk) detail::pv_keys16<HD, C>(vs, 16 * kk, lane, s[2 * kk], s[2 * kk + 1], o);
        __syncthreads();  // every warp is done with this stage before it is refilled
        if constexpr (kSplit) {
            if (it + 1 < ntiles) {
                detail::stage_tile<HD, C, kWarps * 32>(smem, kr, vr, kvh, kb + kKeyTile, ke);
                __syncthreads();
            }
        }
    }

    // Row sums over the quad's four column pairs.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

    if (f.nsplit > 1) {
        // Partial rows [m, l, o[HD]] of this (query tile, head, split).
        const size_t blk = (size_t(qt) * f.n_head + head) * f.nsplit + split;
        float* p0 = f.scratch + (blk * kQTile + warp * 16 + g) * (HD + 2);
        float* p1 = p0 + 8 * (HD + 2);
        if (tq == 0) {
            p0[0] = m0;
            p0[1] = l0;
            p1[0] = m1;
            p1[1] = l1;
        }
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            const int c = 8 * n + 2 * tq;
            p0[2 + c] = o[n][0];
            p0[3 + c] = o[n][1];
            p1[2 + c] = o[n][2];
            p1[3 + c] = o[n][3];
        }
        return;
    }
    float inv0, inv1;
    {
        float sc0 = 1.0f, sc1 = 1.0f;
        if (f.sinks) {
            // The sink logit joins the denominator and attends no value.
            const float sk = f.sinks[head] * kLog2e;
            const float M0 = fmaxf(m0, sk), M1 = fmaxf(m1, sk);
            sc0 = m0 == -INFINITY ? 0.0f : exp2f(m0 - M0);
            sc1 = m1 == -INFINITY ? 0.0f : exp2f(m1 - M1);
            l0 = l0 * sc0 + exp2f(sk - M0);
            l1 = l1 * sc1 + exp2f(sk - M1);
        }
        inv0 = l0 > 0.0f ? sc0 / l0 : 0.0f;
        inv1 = l1 > 0.0f ? sc1 / l1 : 0.0f;
    }
    if (r0 < f.ntok) {
        float* y = f.out + size_t(r0) * f.ldo + size_t(head) * HD + 2 * tq;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            y[8 * n] = o[n][0] * inv0;
            y[8 * n + 1] = o[n][1] * inv0;
        }
    }
    if (r1 < f.ntok) {
        float* y = f.out + size_t(r1) * f.ldo + size_t(head) * HD + 2 * tq;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            y[8 * n] = o[n][2] * inv1;
            y[8 * n + 1] = o[n][3] * inv1;
        }
    }
}

// One warp per (token, head): the splits' partial rows in split order.
template <int HD>
__global__ void __launch_bounds__(128) flash_merge_kernel(FlashArgs f) {
    pdl_entry();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * 4 + warp, head = blockIdx.y;
    if (t >= f.ntok) return;
    const int qt = t / kQTile, row = t % kQTile;
    auto part = [&](int s) {
        return f.scratch + (((size_t(qt) * f.n_head + head) * f.nsplit + s) * kQTile + row) * (HD + 2);
    };
    float M = f.sinks ? f.sinks[head] * kLog2e : -INFINITY;
    for (int s = 0; s < f.nsplit; ++s) M = fmaxf(M, part(s)[0]);
    float L = f.sinks ? exp2f(f.sinks[head] * kLog2e - M) : 0.0f;
    constexpr int DPL = (HD + 31) / 32;
    float acc[DPL] = {};
    for (int s = 0; s < f.nsplit; ++s) {
        const float* p = part(s);
        const float ms = p[0];
        if (ms == -INFINITY) continue;  // nothing attended: its o is not read
        const float w = exp2f(ms - M);
        L += p[1] * w;
#pragma unroll
        for (int i = 0; i < DPL; ++i)
            if (lane + 32 * i < HD) acc[i] += p[2 + lane + 32 * i] * w;
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float* y = f.out + size_t(t) * f.ldo + size_t(head) * HD;
#pragma unroll
    for (int i = 0; i < DPL; ++i)
        if (lane + 32 * i < HD) y[lane + 32 * i] = acc[i] * inv;
}

template <int HD, class C>
void launch_flash_rows(const AttnArgs& a, AttnSplitScratch split, const KvRows<C>& kr, const KvRows<C>& vr,
                       cudaStream_t stream) {
    using T = Tile<HD, C>;
    allow_dynamic_smem(flash_prefill_kernel<HD, C>, T::kSmem);
    FlashArgs f;
    f.q = a.q;
    f.ldq = a.ldq;
    f.n_head = a.n_head;
    f.group = a.n_head / a.n_kv;
    f.d_pos0 = a.d_pos0;
    f.ntok = a.ntok;
    f.window = a.window;
    f.qscale = a.scale * kLog2e;
    f.out = a.out;
    f.ldo = a.ldo;
    f.sinks = a.sinks;
    f.scratch = split.data;
    const int qtiles = (a.ntok + kQTile - 1) / kQTile;
    f.nsplit = attention_prefill_splits(a.ntok, a.n_head, split.data ? split.floats : 0, HD);
    launch("flash_prefill_kernel", flash_prefill_kernel<HD, C>, dim3(qtiles, a.n_head, f.nsplit), kWarps * 32, T::kSmem,
           stream, f, kr, vr);
    EHC_LAUNCHED("flash_prefill_kernel");
    if (f.nsplit > 1) {
        launch("flash_merge_kernel", flash_merge_kernel<HD>, dim3((a.ntok + 3) / 4, a.n_head), 128, 0, stream, f);
        EHC_LAUNCHED("flash_merge_kernel");
    }
}

template <int HD, class C>
void launch_flash(const AttnArgs& a, AttnSplitScratch split, const C* kc, const C* vc, cudaStream_t stream) {
    const KvRows<C> kr{kc, a.n_kv * HD, HD, a.kv_table}, vr{vc, a.n_kv * HD, HD, a.kv_table};
    launch_flash_rows<HD, C>(a, split, kr, vr, stream);
}

// A quantized paged pool (AttnArgs::kv_type), dequantized as staged.
template <int HD>
void launch_flash_quant(const AttnArgs& a, AttnSplitScratch split, cudaStream_t stream) {
    detail::by_kv_quant(a.kv_type, [&]<class C>() {
        const auto* kc = reinterpret_cast<const uint8_t*>(a.k_cache);
        const auto* vc = reinterpret_cast<const uint8_t*>(a.v_cache);
        const KvRows<C> kr{{kc, a.n_kv * HD, HD, a.kv_table}}, vr{{vc, a.n_kv * HD, HD, a.kv_table}};
        launch_flash_rows<HD, C>(a, split, kr, vr, stream);
    });
}

template <class F>
bool by_mma_head_dim(int hd, F&& f) {
    switch (hd) {
    case kMmaHeadDims[0]: f.template operator()<kMmaHeadDims[0]>(); return true;
    case kMmaHeadDims[1]: f.template operator()<kMmaHeadDims[1]>(); return true;
    case kMmaHeadDims[2]: f.template operator()<kMmaHeadDims[2]>(); return true;
    default: return false;
    }
}

}  // namespace

bool attention_prefill_mma_takes(int head_dim) {
    for (int hd : kMmaHeadDims)
        if (hd == head_dim) return true;
    return false;
}

size_t attention_prefill_scratch_floats(int head_dim) {
    return size_t(kMaxSplitBlocks) * kQTile * size_t(head_dim + 2);
}

int attention_prefill_splits(int ntok, int n_head, size_t scratch_floats, int head_dim) {
    if (ntok <= 0 || n_head <= 0 || !attention_prefill_mma_takes(head_dim)) return 1;
    const int blocks = (ntok + kQTile - 1) / kQTile * n_head;
    const int want = kBlocksPerSm * detail::sm_count() / blocks;
    const size_t fit = scratch_floats / (size_t(blocks) * kQTile * size_t(head_dim + 2));
    const int n = std::min({want, kMaxSplits, int(std::min<size_t>(fit, kMaxSplits))});
    return n >= 2 ? n : 1;
}

void attention_prefill(const AttnArgs& a, cudaStream_t stream) { attention_prefill(a, AttnSplitScratch{}, stream); }

void attention_prefill(const AttnArgs& a, AttnSplitScratch split, cudaStream_t stream) {
    if (!attention_head_dim_supported(a.head_dim))
        throw ehp::Error(EH_UNSUPPORTED, "attention: head_dim " + std::to_string(a.head_dim) + " unsupported (max " +
                                             std::to_string(kAttentionMaxHeadDim) + ")");
    if (a.n_kv <= 0 || a.n_head % a.n_kv) throw ehp::Error(EH_INTERNAL, "attention: n_head must be a multiple of n_kv");
    if (!attention_prefill_takes(a))
        throw ehp::Error(EH_INTERNAL, "attention_prefill: an FP32 cache or sinks need head dim 64, 96 or 128 (check attention_prefill_takes)");
    const bool quant = kv_type_quantized(a.kv_type);
    if (a.kv_type && a.kv_type != EH_TYPE_F16 && !quant)
        throw ehp::Error(EH_INTERNAL, "attention_prefill: KV type " + std::to_string(a.kv_type) + " unsupported");
    if (quant && (!a.kv_table || a.k_cache32 || !attention_prefill_mma_takes(a.head_dim)))
        throw ehp::Error(EH_INTERNAL, "attention_prefill: a quantized pool needs a paged table and head dim 64, 96 or 128");
    if (a.ntok <= 0) return;
    const bool mma = by_mma_head_dim(a.head_dim, [&]<int HD>() {
        if (quant) launch_flash_quant<HD>(a, split, stream);
        else if (a.k_cache32) launch_flash<HD, float>(a, split, a.k_cache32, a.v_cache32, stream);
        else launch_flash<HD, __half>(a, split, a.k_cache, a.v_cache, stream);
    });
    if (!mma && a.kv_table) throw ehp::Error(EH_INTERNAL, "attention_prefill: a paged cache needs head dim 64, 96 or 128");
    if (!mma) attention_prefill_simt(a, stream);
}

}  // namespace ehcuda
