// Decode attention for a whole query group at once, on the tensor cores.
//
// One query token, grouped-query attention: the n_head / n_kv query heads
// of a KV head attend the same keys. The fused decode kernels
// (attention_decode.cu, attention_decode_sinks.cu) run a block per query
// head, so each key is read once per query head (7 times for Qwen2.5, 8 for
// gpt-oss), and past a few thousand keys that traffic and its per-key warp
// reductions dominate the step. Here a block takes one KV head's share of
// the keys (a split) for all its query heads: the heads are the 16 rows of
// an m16n8k16 tile (rows past the group hold zero queries and are never
// written), so each key is read from memory once and scored on the tensor
// cores as in the prefill kernel (flash_tile.cuh: the same staging, FP16
// fragments, FP32 cache split into hi + lo).
//
// A block's 4 warps take 16 keys each of every staged 64-key tile and keep
// their own running max, sum and output; the block combines them in warp
// order, then either writes the output (one split) or a partial row per
// query head that flash_decode_merge_kernel combines in split order
// (deterministic, no atomics). Sinks join the denominator at the end.
//
// The split count comes from the current length on the device (the grid is
// sized for a full cache, so a captured decode step serves every length):
// chunks of whole tiles, as many splits as give the grid about kBlocksPerSm
// blocks per multiprocessor, at most the grid's.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "ehcuda/attention_decode_group.hpp"
#include "ehcuda/check.hpp"
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
constexpr int kRows = 16;  // query heads per block: one m16 tile
constexpr int kBlocksPerSm = 2;

struct GroupArgs {
    const float* q;  // row r's rotated queries at r * ldq, head h at h * head_dim
    int ldq;
    int n_head, group;
    // One row at *d_pos0 of a contiguous cache, or (paged) row r at d_pos[r]
    // whose keys' block ids start at tables + d_table[r].
    const int32_t* d_pos0;
    const int32_t *d_pos, *d_table, *tables;
    int window;
    float qscale;  // scale * log2 e
    const float* sinks;
    float* out;  // row r at r * ldo
    int ldo;
    float* scratch;  // [row][n_head][nsplit][head_dim + 2]: max, sum, unnormalised output
    int nsplit;      // grid splits
    int cap;         // the most splits a length gets
};

template <bool Paged>
__device__ __forceinline__ int row_pos(const GroupArgs& f, int row) {
    return Paged ? f.d_pos[row] : *f.d_pos0;
}

// The keys [ks, ke) of split `split` at position qpos, and how many splits
// are active (later ones exit). The same in every block and in the merge.
struct SplitRange {
    int ks, ke, nact;
};
__device__ __forceinline__ SplitRange split_range(const GroupArgs& f, int qpos, int split) {
    const int len = qpos + 1;
    const int kstart = f.window > 0 ? max(0, qpos - f.window + 1) : 0;
    const int range = len - kstart;
    const int per = (range + f.cap - 1) / f.cap;
    const int chunk = max(kKeyTile, (per + kKeyTile - 1) / kKeyTile * kKeyTile);
    SplitRange r;
    r.nact = (range + chunk - 1) / chunk;
    r.ks = kstart + split * chunk;
    r.ke = min(len, r.ks + chunk);
    return r;
}

// The block's warps' (max, sum, output) rows, combined after the key loop in
// the staging memory.
template <int HD>
struct Combine {
    float m[kWarps][kRows], l[kWarps][kRows];
    float o[kWarps][kRows][HD];
};

// Grid (n_kv, nsplit, rows), kWarps warps. Lane roles follow the m16n8k16
// fragment layout: g = lane / 4 picks rows (query heads) g and g + 8, tq =
// lane % 4 the column pair 2 tq, 2 tq + 1 of each 8-wide accumulator tile.
template <int HD, class C, bool Paged>
__global__ void __launch_bounds__(kWarps * 32) flash_decode_group_kernel(GroupArgs f, KvRows<C> kr, KvRows<C> vr) {
    using T = Tile<HD, C>;
    constexpr bool kSplit = T::kSplit;
    constexpr int KS = HD / 16;  // k-steps of Q K^T
    constexpr int NO = HD / 8;   // 8-wide output column tiles
    static_assert(sizeof(Combine<HD>) <= T::kSmem, "the warps' rows are combined in the staging memory");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* smem = reinterpret_cast<__half*>(smem_raw);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int kvh = blockIdx.x, split = blockIdx.y, row = blockIdx.z;
    const int h0 = kvh * f.group;  // the group's first query head

    pdl_entry();
    const int qpos = row_pos<Paged>(f, row);
    const SplitRange sr = split_range(f, qpos, split);
    if (split >= sr.nact) return;
    const int ks = sr.ks, ke = sr.ke;
    if constexpr (Paged) kr.table = vr.table = f.tables + f.d_table[row];
    const float* qrow = f.q + size_t(row) * f.ldq;

    // Q fragments (A operand, 16 heads x HD), scaled into log2 units.
    uint32_t qh[KS][4], ql[kSplit ? KS : 1][4];
    const bool in0 = g < f.group, in1 = g + 8 < f.group;  // absent heads read nothing (their rows stay zero)
    detail::q_fragments<HD, kSplit>(qrow + size_t(h0 + (in0 ? g : 0)) * HD, qrow + size_t(h0 + (in1 ? g + 8 : 0)) * HD,
                                    in0, in1, f.qscale, tq, qh, ql);

    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    const int ntiles = (ke - ks + kKeyTile - 1) / kKeyTile;
    detail::stage_tile<HD, C, kWarps * 32>(smem, kr, vr, kvh, ks, ke);
    if constexpr (!kSplit) cp_async_commit();
    for (int it = 0; it < ntiles; ++it) {
        const int kb = ks + it * kKeyTile;
        const __half* st = smem + (kSplit ? 0 : (it & 1) * 2 * T::kMat);
        if constexpr (!kSplit) {
            if (it + 1 < ntiles) {
                detail::stage_tile<HD, C, kWarps * 32>(smem + ((it + 1) & 1) * 2 * T::kMat, kr, vr, kvh,
                                                       kb + kKeyTile, ke);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
        }
        __syncthreads();

        // S = Q K^T for this warp's 16 keys of the tile (two 8-key tiles).
        float s[2][4];
        detail::qk_keys8<HD, C>(st, 16 * warp, lane, qh, ql, s[0]);
        detail::qk_keys8<HD, C>(st, 16 * warp + 8, lane, qh, ql, s[1]);
        // Every row sits at the same position, and [ks, ke) lies inside its
        // causal window: only keys past the split's end are masked.
        if (kb + kKeyTile > ke) {
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (kb + 16 * warp + 8 * j + 2 * tq + (e & 1) >= ke) s[j][e] = -INFINITY;
        }

        // Online softmax over the warp's keys (rows g and g + 8), then O += P V.
        detail::softmax_fold(s, m0, m1, l0, l1, o);
        detail::pv_keys16<HD, C>(st + (kSplit ? 2 : 1) * T::kMat, 16 * warp, lane, s[0], s[1], o);
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

    // The warps' rows, combined in warp order (the loop's last barrier
    // freed the staging memory).
    Combine<HD>& cb = *reinterpret_cast<Combine<HD>*>(smem_raw);
    if (tq == 0) {
        cb.m[warp][g] = m0;
        cb.l[warp][g] = l0;
        cb.m[warp][g + 8] = m1;
        cb.l[warp][g + 8] = l1;
    }
#pragma unroll
    for (int n = 0; n < NO; ++n) {
        const int c = 8 * n + 2 * tq;
        cb.o[warp][g][c] = o[n][0];
        cb.o[warp][g][c + 1] = o[n][1];
        cb.o[warp][g + 8][c] = o[n][2];
        cb.o[warp][g + 8][c + 1] = o[n][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < f.group * HD; i += kWarps * 32) {
        const int r = i / HD, d = i % HD, head = h0 + r;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) M = fmaxf(M, cb.m[w][r]);
        float L = 0.0f, A = 0.0f;  // the split has keys, so some warp's max is finite
#pragma unroll
        for (int w = 0; w < kWarps; ++w)
            if (cb.m[w][r] != -INFINITY) {
                const float x = exp2f(cb.m[w][r] - M);
                L += cb.l[w][r] * x;
                A += cb.o[w][r][d] * x;
            }
        if (sr.nact == 1) {
            float sc = 1.0f;
            if (f.sinks) {
                // The sink logit joins the denominator and attends no value.
                const float sk = f.sinks[head] * kLog2e, Mo = fmaxf(M, sk);
                sc = exp2f(M - Mo);
                L = L * sc + exp2f(sk - Mo);
            }
            f.out[size_t(row) * f.ldo + size_t(head) * HD + d] = L > 0.0f ? A * sc / L : 0.0f;
        } else {
            float* p = f.scratch + ((size_t(row) * f.n_head + head) * f.nsplit + split) * (HD + 2);
            p[2 + d] = A;
            if (d == 0) {
                p[0] = M;
                p[1] = L;
            }
        }
    }
}

// One block per (query head, row): the active splits' partial rows combined
// in split order. Every load round is issued at once (a loop over the
// splits, one load after another, cost ~20 us at 64 splits): the splits'
// maxima and sums in one round, then each thread's dims over its share of
// the splits, the shares added in order.
constexpr int kMergeThreads = 128;
template <int HD, bool Paged>
__global__ void __launch_bounds__(kMergeThreads) flash_decode_merge_kernel(GroupArgs f) {
    static_assert(kAttentionGroupMaxSplits <= kMergeThreads, "one split's max and sum per thread");
    constexpr int kShares = HD >= kMergeThreads ? 1 : kMergeThreads / HD;  // threads per dim
    __shared__ float sw[kMergeThreads], sl[kMergeThreads], red[kMergeThreads / 32];
    __shared__ float part[kShares][HD];
    pdl_entry();
    const int head = blockIdx.x, row = blockIdx.y, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int nact = split_range(f, row_pos<Paged>(f, row), 0).nact;
    if (nact <= 1) return;  // the one split wrote the output
    const float* base = f.scratch + (size_t(row) * f.n_head + head) * f.nsplit * (HD + 2);
    const float m = t < nact ? base[size_t(t) * (HD + 2)] : -INFINITY;
    const float l = t < nact ? base[size_t(t) * (HD + 2) + 1] : 0.0f;
    float M = m;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0) red[warp] = M;
    __syncthreads();
    const float sk = f.sinks ? f.sinks[head] * kLog2e : -INFINITY;
    M = sk;
#pragma unroll
    for (int w = 0; w < kMergeThreads / 32; ++w) M = fmaxf(M, red[w]);
    sw[t] = t < nact ? exp2f(m - M) : 0.0f;
    sl[t] = t < nact ? l * sw[t] : 0.0f;
    __syncthreads();
    static_assert(HD <= kMergeThreads, "a thread per dim at least");
    const int d = t % HD, share = t / HD;
    if (share < kShares) {
        float A = 0.0f;
#pragma unroll 8
        for (int s = share; s < nact; s += kShares) A += base[size_t(s) * (HD + 2) + 2 + d] * sw[s];
        part[share][d] = A;
    }
    __syncthreads();
    float L = f.sinks ? exp2f(sk - M) : 0.0f;
    for (int s = 0; s < nact; ++s) L += sl[s];  // (broadcast reads of shared memory, in split order)
    for (int e = t; e < HD; e += kMergeThreads) {
        float A = 0.0f;
#pragma unroll
        for (int q = 0; q < kShares; ++q) A += part[q][e];
        f.out[size_t(row) * f.ldo + size_t(head) * HD + e] = L > 0.0f ? A / L : 0.0f;
    }
}

template <int HD, class C, bool Paged>
void launch_group_rows(const GroupArgs& f, int n_kv, int rows, const KvRows<C>& kr, const KvRows<C>& vr,
                       cudaStream_t stream) {
    using T = Tile<HD, C>;
    auto kernel = flash_decode_group_kernel<HD, C, Paged>;
    allow_dynamic_smem(kernel, T::kSmem);
    launch("flash_decode_group_kernel", kernel, dim3(unsigned(n_kv), unsigned(f.nsplit), unsigned(rows)), kWarps * 32,
           T::kSmem, stream, f, kr, vr);
    EHC_LAUNCHED("flash_decode_group_kernel");
    if (f.nsplit > 1) {
        launch("flash_decode_merge_kernel", flash_decode_merge_kernel<HD, Paged>, dim3(unsigned(f.n_head), unsigned(rows)),
               kMergeThreads, 0, stream, f);
        EHC_LAUNCHED("flash_decode_merge_kernel");
    }
}

template <int HD, class C, bool Paged>
void launch_group(const GroupArgs& f, int n_kv, int rows, const C* kc, const C* vc, cudaStream_t stream) {
    const KvRows<C> kr{kc, n_kv * HD, HD, nullptr}, vr{vc, n_kv * HD, HD, nullptr};
    launch_group_rows<HD, C, Paged>(f, n_kv, rows, kr, vr, stream);
}

// A quantized paged pool (PagedAttnArgs::kv_type), dequantized as staged.
template <int HD>
void launch_group_quant(const GroupArgs& f, const PagedAttnArgs& a, cudaStream_t stream) {
    detail::by_kv_quant(a.kv_type, [&]<class C>() {
        const auto* kc = reinterpret_cast<const uint8_t*>(a.k_pool);
        const auto* vc = reinterpret_cast<const uint8_t*>(a.v_pool);
        const KvRows<C> kr{{kc, a.n_kv * HD, HD, nullptr}}, vr{{vc, a.n_kv * HD, HD, nullptr}};
        launch_group_rows<HD, C, true>(f, a.n_kv, a.ntok, kr, vr, stream);
    });
}

template <class F>
void by_head_dim(int hd, F&& f) {
    switch (hd) {
    case 64: f.template operator()<64>(); break;
    case 96: f.template operator()<96>(); break;
    default: f.template operator()<128>(); break;
    }
}

bool group_shape(int n_head, int n_kv, int head_dim) {
    return (head_dim == 64 || head_dim == 96 || head_dim == 128) && n_kv > 0 && n_head % n_kv == 0 &&
           n_head / n_kv >= 2 && n_head / n_kv <= kRows;
}

}  // namespace

bool attention_decode_group_takes(const AttnArgs& a) {
    const bool cache = a.k_cache32 ? a.v_cache32 && !a.k_cache : a.k_cache && a.v_cache;
    return a.ntok == 1 && cache && !a.kv_table && group_shape(a.n_head, a.n_kv, a.head_dim) &&
           a.ldq >= a.n_head * a.head_dim;
}

bool attention_decode_group_takes(const PagedAttnArgs& a) {
    return a.ntok >= 1 && a.k_pool && a.v_pool && group_shape(a.n_head, a.n_kv, a.head_dim) &&
           a.ldq >= a.n_head * a.head_dim && a.ldo >= a.n_head * a.head_dim && a.d_pos && a.d_table && a.tables;
}

int attention_decode_group_splits(int nsplit_cap, int n_kv, int rows) {
    const int want = std::max(1, kBlocksPerSm * detail::sm_count() / std::max(1, n_kv * std::max(1, rows)));
    return std::clamp(want, 1, std::clamp(nsplit_cap, 1, kAttentionGroupMaxSplits));
}

namespace {

GroupArgs group_args(int n_head, int n_kv, int window, float scale, const float* sinks, float* scratch, int nsplit) {
    if (nsplit < 1 || nsplit > kAttentionGroupMaxSplits || (nsplit > 1 && !scratch))
        throw ehp::Error(EH_INTERNAL, "attention_decode_group: 1..128 splits, several with scratch");
    GroupArgs f{};
    f.n_head = n_head;
    f.group = n_head / n_kv;
    f.window = window;
    f.qscale = scale * kLog2e;
    f.sinks = sinks;
    f.scratch = scratch;
    f.nsplit = nsplit;
    f.cap = nsplit;
    return f;
}

}  // namespace

void attention_decode_group(const AttnArgs& a, float* scratch, int nsplit, cudaStream_t stream) {
    if (!attention_decode_group_takes(a) || a.ldo < a.n_head * a.head_dim)
        throw ehp::Error(EH_INTERNAL, "attention_decode_group: one token, head dim 64/96/128, 2..16 query heads per "
                                      "KV head and a contiguous cache (check attention_decode_group_takes)");
    GroupArgs f = group_args(a.n_head, a.n_kv, a.window, a.scale, a.sinks, scratch, nsplit);
    f.q = a.q;
    f.ldq = a.ldq;
    f.d_pos0 = a.d_pos0;
    f.out = a.out;
    f.ldo = a.ldo;
    by_head_dim(a.head_dim, [&]<int HD>() {
        if (a.k_cache32) launch_group<HD, float, false>(f, a.n_kv, 1, a.k_cache32, a.v_cache32, stream);
        else launch_group<HD, __half, false>(f, a.n_kv, 1, a.k_cache, a.v_cache, stream);
    });
}

void attention_decode_group(const PagedAttnArgs& a, float* scratch, int nsplit, cudaStream_t stream) {
    if (!attention_decode_group_takes(a))
        throw ehp::Error(EH_INTERNAL, "attention_decode_group: head dim 64/96/128, 2..16 query heads per KV head, "
                                      "positions and block tables (check attention_decode_group_takes)");
    GroupArgs f = group_args(a.n_head, a.n_kv, a.window, a.scale, a.sinks, scratch, nsplit);
    f.q = a.q;
    f.ldq = a.ldq;
    f.d_pos = a.d_pos;
    f.d_table = a.d_table;
    f.tables = a.tables;
    f.out = a.out;
    f.ldo = a.ldo;
    const bool quant = kv_type_quantized(a.kv_type);
    if (a.kv_type && a.kv_type != EH_TYPE_F16 && !quant)
        throw ehp::Error(EH_INTERNAL, "attention_decode_group: KV type " + std::to_string(a.kv_type) + " unsupported");
    by_head_dim(a.head_dim, [&]<int HD>() {
        if (quant) launch_group_quant<HD>(f, a, stream);
        else launch_group<HD, __half, true>(f, a.n_kv, a.ntok, a.k_pool, a.v_pool, stream);
    });
}

}  // namespace ehcuda
