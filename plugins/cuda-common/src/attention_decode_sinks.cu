// The fused decode attention with sinks (gpt-oss; the llama form is
// attention_decode.cu): attention_sinks and rope_sink_attention_decode of
// gpt_ops.hpp, split-K over the cache with per-head sink logits, RoPE from
// the frequency table and the K/V store fused in.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "block_reduce.cuh"
#include "gemv_stage.cuh"
#include "ehcuda/attention_prefill.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/gpt_ops.hpp"
#include "ehcuda/quant.cuh"
#include "kv_prefetch.cuh"
#include "online_softmax.cuh"
#include "rope_table.cuh"

namespace ehcuda {
namespace {

using detail::load_kv;
using detail::rope_apply;
using detail::rope_table_angle;
using detail::rope_table_pair;
using detail::store_kv;

constexpr int kAttnWarps = 8;
static_assert(kAttnWarps >= 2, "the fused kernel's QK-norm takes warps 0 and 1");
// Keys a warp scores together (independent loads in flight). 8 (the llama
// form's KernelPlan::attn_keys) measured slower: H100, Qwen3-30B-A3B tg128
// after 512 tokens 403 against 407 tok/s.
constexpr int kKeyGroup = 4;
constexpr int kMinSinkChunk = kAttnWarps * kKeyGroup;  // the fewest keys a split takes: a key group per warp
constexpr int kMaxDpl = 8;    // head_dim <= 256
constexpr int kMaxSinkSplits = 128;  // the split kernel's merge stages one float pair per split
constexpr int kOneRoundMerge = 16;   // splits the split kernel merges from registers

// The K and V rows of keys kb .. kb + kKeyGroup - 1 of KV head kvh, lane i
// holding dims i, i+32, ... Slots past k1 load key k1 again (a select, so
// the group's loads go out together; they are masked when folded).
template <int DPL, class C>
__device__ __forceinline__ void load_key_group(const SinkAttnArgs& a, const C* k_cache, const C* v_cache, int kvh,
                                               int kb, int k1, float (&kf)[kKeyGroup][DPL],
                                               float (&vf)[kKeyGroup][DPL]) {
    const int lane = threadIdx.x & 31;
    const int hd = a.head_dim;
    const int kv_ld = a.n_kv * hd;
#pragma unroll
    for (int g = 0; g < kKeyGroup; ++g) {
        const int key = min(kb + g, k1);
        const C* kr = k_cache + size_t(key) * kv_ld + size_t(kvh) * hd;
        const C* vr = v_cache + size_t(key) * kv_ld + size_t(kvh) * hd;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            const int d = lane + 32 * i;
            kf[g][i] = d < hd ? load_kv(kr + d) : 0.0f;
            vf[g][i] = d < hd ? load_kv(vr + d) : 0.0f;
        }
    }
}

// Keys k0..k1 (inclusive) of one query head against q (pre-scaled): warp w
// takes groups of kKeyGroup consecutive keys, kAttnWarps groups apart; lane
// i holds dims i, i+32, ... of the query and of its running output. With
// first_loaded, kf and vf already hold the warp's first group. Leaves the
// warp's running max m, sum l and unnormalised output acc.
template <int DPL, class C>
__device__ __forceinline__ void attend_keys(const SinkAttnArgs& a, const C* k_cache, const C* v_cache,
                                            const float (&q)[DPL], int kvh, int k0, int k1, bool first_loaded,
                                            float (&kf)[kKeyGroup][DPL], float (&vf)[kKeyGroup][DPL], float& m,
                                            float& l, float (&acc)[DPL]) {
    const int warp = threadIdx.x >> 5;
    m = -INFINITY;
    l = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
    const int first = k0 + warp * kKeyGroup;
    for (int kb = first; kb <= k1; kb += kAttnWarps * kKeyGroup) {
        if (kb != first || !first_loaded) load_key_group<DPL, C>(a, k_cache, v_cache, kvh, kb, k1, kf, vf);
        float s[kKeyGroup];
        detail::score_keys<kKeyGroup, DPL>(q, kf, s);
        detail::softmax_fold<kKeyGroup, DPL>(s, vf, k1 - kb + 1, m, l, acc);
    }
}

template <int DPL>
__device__ __forceinline__ void load_query(const SinkAttnArgs& a, int t, int head, float (&q)[DPL]) {
    const int lane = threadIdx.x & 31;
    const float* qr = a.q + size_t(t) * a.ldq + size_t(head) * a.head_dim;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        q[i] = d < a.head_dim ? qr[d] * a.scale : 0.0f;
    }
}

// The block's warps' (m, l, acc) in shared memory, combined: M = max over
// the warps and `floor_m` (a sink logit, or -inf), L = sum of l scaled to M.
template <int DPL>
struct WarpParts {
    float m[kAttnWarps], l[kAttnWarps];
    float acc[kAttnWarps][DPL * 32];

    __device__ void put(float wm, float wl, const float (&wacc)[DPL]) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (lane == 0) {
            m[warp] = wm;
            l[warp] = wl;
        }
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[warp][lane + 32 * i] = wacc[i];
    }
    __device__ float max_m(float floor_m) const {
        float M = floor_m;
#pragma unroll
        for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, m[w]);
        return M;
    }
    __device__ float sum_l(float M) const {
        float L = 0.0f;
#pragma unroll
        for (int w = 0; w < kAttnWarps; ++w)
            if (m[w] != -INFINITY) L += l[w] * __expf(m[w] - M);
        return L;
    }
    __device__ float sum_acc(int d, float M) const {
        float A = 0.0f;
#pragma unroll
        for (int w = 0; w < kAttnWarps; ++w)
            if (m[w] != -INFINITY) A += acc[w][d] * __expf(m[w] - M);
        return A;
    }
};

// One block per (query token, head) over all its keys.
template <int DPL, class C>
__global__ void __launch_bounds__(kAttnWarps * 32) sink_attn_kernel(SinkAttnArgs a, const C* k_cache,
                                                                    const C* v_cache) {
    pdl_entry();
    pdl_release();
    __shared__ WarpParts<DPL> parts;
    const int t = blockIdx.x, head = blockIdx.y;
    const int kvh = head / (a.n_head / a.n_kv);
    const int qpos = *a.d_pos0 + t;
    const int kstart = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    float q[DPL], m, l, acc[DPL], kf[kKeyGroup][DPL], vf[kKeyGroup][DPL];
    load_query<DPL>(a, t, head, q);
    attend_keys<DPL, C>(a, k_cache, v_cache, q, kvh, kstart, qpos, false, kf, vf, m, l, acc);
    parts.put(m, l, acc);
    __syncthreads();

    const float sink = a.sinks ? a.sinks[head] : -INFINITY;
    const float M = parts.max_m(sink);
    const float L = parts.sum_l(M) + (a.sinks ? __expf(sink - M) : 0.0f);
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float* o = a.out + size_t(t) * a.ldo + size_t(head) * a.head_dim;
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) o[d] = parts.sum_acc(d, M) * inv;
}

__device__ __forceinline__ float kv_round(const __half*, float v) { return __half2float(__float2half_rn(v)); }
__device__ __forceinline__ float kv_round(const float*, float v) { return v; }

// A head's output at dim d, and its integer chunk for the projection when
// asked (warp-wide: out_chunks needs head_dim % 32 == 0, so whole warps
// take the same side of d < head_dim).
__device__ __forceinline__ void emit_sink_out(const SinkAttnArgs& a, int xb, int head, int hd, int d, float v) {
    a.out[size_t(head) * hd + d] = v;
    if (a.out_chunks) detail::store_chunk_warp_bits(xb, v, a.out_chunks, head * hd + d);
}

// One query (decode), block (split, head): the keys are cut into
// gridDim.x ranges. Each block leaves its (M, L, acc) in the scratch; the
// last block of a head to finish (counted with an atomic) merges all splits
// in split order 0, 1, ... with the sink, so the result does not depend on
// which block finished last, and resets the head's counter for the next
// launch. One kernel instead of attention + merge.
//
// Fused (rope_sink_attention_decode): the block also takes its query head
// and its KV head's new K and V from the qkv row, normalises (QK-norm) and
// rotates them (as head_rmsnorm_kernel and rope_table_kernel do), and warp 0
// of the split holding the new position attends that key from registers; of
// the heads sharing a KV head, the first writes K and V to the cache. No block reads the new
// cache row during the launch: one kernel instead of RoPE + attention.
//
// min_chunk: the fewest keys a split takes (sink_min_chunk() below).
// early (attention_early(), kv_prefetch.cuh): with 1 or 2 the fused kernel's
// warps load their first key group before pdl_entry(), and with 2 L2 is
// asked for the block's other cache rows below the new position.
//
// Blocks per SM: 3 for head dims up to 64 (gpt-oss-20b's 64 heads in 5 splits
// are 320 blocks: at 2 a SM, 86 registers, its tg128 fell 537 -> 530 tok/s on
// an H100), else 2.
template <int DPL>
constexpr int sink_split_min_blocks() {
    return DPL <= 2 ? 3 : 2;
}
template <int DPL, class C, bool Fused>
__global__ void __launch_bounds__(kAttnWarps * 32, sink_split_min_blocks<DPL>()) sink_attn_split_kernel(SinkAttnArgs a, RopeTableArgs r, C* k_cache,
                                                                          C* v_cache, int xb, int early, int min_chunk) {
    if (!early) {
        pdl_entry();
        pdl_release();
    }
    __shared__ WarpParts<DPL> parts;
    __shared__ bool last;
    __shared__ float merge_w[kMaxSinkSplits], merge_l[kMaxSinkSplits];
    __shared__ float qs[Fused ? DPL * 32 : 1], ks[Fused ? DPL * 32 : 1], vs[Fused ? DPL * 32 : 1];
    const int split = blockIdx.x, nsplit = gridDim.x, head = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hd = a.head_dim;
    const int group = a.n_head / a.n_kv;
    const int kvh = head / group;
    const int qpos = *a.d_pos0;
    const int kstart = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    const int range = qpos - kstart + 1;
    const int chunk = max(min_chunk, (range + nsplit - 1) / nsplit);
    // Only the splits the current length needs run; the rest (most of the
    // grid early in a sequence, and on sliding-window layers) leave at once.
    const int nact = (range + chunk - 1) / chunk;
    if (split >= nact) return;
    const int k0 = kstart + split * chunk, k1 = min(qpos, k0 + chunk - 1);
    const bool has_new = Fused && k0 <= qpos && qpos <= k1;
    // The thread's first rotary angle needs only the position (and the
    // frequency table, written at load).
    // Registers (in_regs): NEOX rotation of the whole head of 64 dims or
    // more puts both dims of every rotary pair (i, i + hd/2) in one lane
    // (slots k and k + DPL/2), so each warp normalises and rotates its own
    // copy of the query, and warp 0 of the split holding the new position
    // the new key, without shared memory or a block barrier. Else thread t
    // rotates pair t through shared memory. The same arithmetic either way
    // (and as head_rmsnorm_kernel + rope_table_kernel), bit for bit.
    constexpr int kPairs = DPL / 2 > 0 ? DPL / 2 : 1;
    const bool in_regs = Fused && DPL % 2 == 0 && r.neox && r.n_rot == hd && hd == 32 * DPL;
    float sn0 = 0.0f, cs0 = 1.0f, rsn[kPairs], rcs[kPairs], qw[DPL], kw[DPL];
    if (in_regs) {
        // weights and angles only: none of it is written by the kernels before
#pragma unroll
        for (int k = 0; k < DPL / 2; ++k) rope_table_angle(r, qpos, lane + 32 * k, rsn[k], rcs[k]);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            qw[i] = r.q_norm ? r.q_norm[lane + 32 * i] : 1.0f;
            kw[i] = r.k_norm ? r.k_norm[lane + 32 * i] : 1.0f;
        }
    } else if (Fused && int(threadIdx.x) < r.n_rot / 2) {
        rope_table_angle(r, qpos, threadIdx.x, sn0, cs0);
    }
    // Fused: the cache up to qpos - 1 (the new key is attended apart), all
    // written by earlier steps, so the warp's first key group may be read
    // before the wait. Empty when k0 > kc1.
    const int kc1 = Fused ? min(k1, qpos - 1) : k1;
    float kf[kKeyGroup][DPL], vf[kKeyGroup][DPL];
    const bool first_loaded = Fused && early && k0 + warp * kKeyGroup <= kc1;
    if (first_loaded) load_key_group<DPL, C>(a, k_cache, v_cache, kvh, k0 + warp * kKeyGroup, kc1, kf, vf);
    if (early) {
        const int p0 = Fused ? k0 + kAttnWarps * kKeyGroup : k0, p1 = min(k1, qpos - 1);  // past the first groups
        if (early >= 2 && p0 <= p1) detail::prefetch_kv_rows(k_cache, v_cache, a.n_kv * hd, kvh, hd, p0, p1);
        pdl_entry();
        pdl_release();
    }
    float q[DPL], m, l, acc[DPL];
    float kn[DPL], vn[DPL];  // the new key (normalised, rotated) and value: warp 0 where has_new
    if constexpr (Fused) {
        const int nq = a.n_head * hd, nk = a.n_kv * hd;
        if (in_regs) {
            auto norm_rope = [&](float(&x)[DPL], const float(&w)[DPL]) {
                if (r.q_norm) {
                    float ss = 0.0f;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) ss = fmaf(x[i], x[i], ss);
#pragma unroll
                    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
                    const float scale = rsqrtf(ss / float(hd) + r.norm_eps);
#pragma unroll
                    for (int i = 0; i < DPL; ++i) x[i] = x[i] * scale * w[i];
                }
#pragma unroll
                for (int k = 0; k < DPL / 2; ++k) rope_apply(rsn[k], rcs[k], x[k], x[k + DPL / 2]);
            };
#pragma unroll
            for (int i = 0; i < DPL; ++i) q[i] = r.qkv[size_t(head) * hd + lane + 32 * i];
            if (has_new && warp == 0) {
#pragma unroll
                for (int i = 0; i < DPL; ++i) {
                    kn[i] = r.qkv[nq + size_t(kvh) * hd + lane + 32 * i];
                    vn[i] = r.qkv[nq + nk + size_t(kvh) * hd + lane + 32 * i];
                }
                norm_rope(kn, kw);
                if (head % group == 0) {
                    C* kc = k_cache + size_t(qpos) * nk + size_t(kvh) * hd;
                    C* vc = v_cache + size_t(qpos) * nk + size_t(kvh) * hd;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) {
                        store_kv(kc + lane + 32 * i, kn[i]);
                        store_kv(vc + lane + 32 * i, vn[i]);
                    }
                }
            }
            norm_rope(q, qw);
#pragma unroll
            for (int i = 0; i < DPL; ++i) q[i] *= a.scale;
        } else {
            for (int d = threadIdx.x; d < hd; d += blockDim.x) {
                qs[d] = r.qkv[size_t(head) * hd + d];
                ks[d] = r.qkv[nq + size_t(kvh) * hd + d];
                vs[d] = r.qkv[nq + nk + size_t(kvh) * hd + d];
            }
            __syncthreads();
            if (r.q_norm && warp < 2) {
                // QK-norm: warp 0 the query head, warp 1 the key head
                float* x = warp == 0 ? qs : ks;
                const float* w = warp == 0 ? r.q_norm : r.k_norm;
                float ss = 0.0f;
                for (int i = lane; i < hd; i += 32) ss = fmaf(x[i], x[i], ss);
#pragma unroll
                for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
                const float scale = rsqrtf(ss / float(hd) + r.norm_eps);
                for (int i = lane; i < hd; i += 32) x[i] = x[i] * scale * w[i];
            }
            if (r.q_norm) __syncthreads();
            const int half_rot = r.n_rot / 2;
            for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
                const int i0 = r.neox ? i : 2 * i, i1 = r.neox ? i + half_rot : 2 * i + 1;
                float sn = sn0, cs = cs0;
                if (i != int(threadIdx.x)) rope_table_angle(r, qpos, i, sn, cs);
                rope_apply(sn, cs, qs[i0], qs[i1]);
                rope_apply(sn, cs, ks[i0], ks[i1]);
            }
            __syncthreads();
            if (has_new && head % group == 0) {
                C* kc = k_cache + size_t(qpos) * nk + size_t(kvh) * hd;
                C* vc = v_cache + size_t(qpos) * nk + size_t(kvh) * hd;
                for (int d = threadIdx.x; d < hd; d += blockDim.x) {
                    store_kv(kc + d, ks[d]);
                    store_kv(vc + d, vs[d]);
                }
            }
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const int d = lane + 32 * i;
                q[i] = d < hd ? qs[d] * a.scale : 0.0f;
                kn[i] = d < hd ? ks[d] : 0.0f;
                vn[i] = d < hd ? vs[d] : 0.0f;
            }
        }
    } else {
        load_query<DPL>(a, 0, head, q);
    }
    attend_keys<DPL, C>(a, k_cache, v_cache, q, kvh, k0, kc1, first_loaded, kf, vf, m, l, acc);
    if (has_new && warp == 0) {
        // as rounded in the cache, so the result matches the unfused kernels'
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) part = fmaf(q[i], kv_round(k_cache, kn[i]), part);
        const float sn[1] = {detail::warp_sum(part)};
        float vr[1][DPL];
#pragma unroll
        for (int i = 0; i < DPL; ++i) vr[0][i] = kv_round(v_cache, vn[i]);
        detail::softmax_fold<1, DPL>(sn, vr, 1, m, l, acc);
    }
    parts.put(m, l, acc);
    __syncthreads();

    const float M = parts.max_m(-INFINITY);
    const float sink = a.sinks ? a.sinks[head] : -INFINITY;
    if (nact == 1) {
        // The only split: the merge below with one split, on the values it
        // would have read back from the scratch (the same bits), without the
        // scratch, the fence and the counter.
        const float Ls = parts.sum_l(M);
        const float Mx = fmaxf(sink, M);
        const float w0 = M != -INFINITY ? __expf(M - Mx) : 0.0f;
        const float L = (a.sinks ? __expf(sink - Mx) : 0.0f) + Ls * w0;
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        const int d = threadIdx.x;  // head_dim <= 32 * DPL <= blockDim.x
        if (d < hd) emit_sink_out(a, xb, head, hd, d, parts.sum_acc(d, M) * w0 * inv);
        return;
    }
    float* mine = a.split_scratch + (size_t(head) * nsplit + split) * (hd + 2);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) mine[2 + d] = parts.sum_acc(d, M);
    if (threadIdx.x == 0) {
        mine[0] = M;
        mine[1] = parts.sum_l(M);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(a.split_counters + head, 1) == nact - 1;
        if (last) a.split_counters[head] = 0;  // every split of this launch has counted
    }
    __syncthreads();
    if (!last) return;
    __threadfence();

    // Splits in order 0, 1, ..., so the result does not depend on which
    // block merges.
    const float* all = a.split_scratch + size_t(head) * nsplit * (hd + 2);
    if (nact <= kOneRoundMerge) {
        // One load round: each thread reads every split's maximum and sum
        // (the same words across the block) with its dim's sums, then
        // merges in registers (the same bits as below).
        const int d = threadIdx.x;  // head_dim <= 32 * DPL <= blockDim.x
        float ms[kOneRoundMerge], ls[kOneRoundMerge], as[kOneRoundMerge];
#pragma unroll
        for (int s = 0; s < kOneRoundMerge; ++s) {
            if (s >= nact) break;
            ms[s] = __ldcg(all + size_t(s) * (hd + 2));
            ls[s] = __ldcg(all + size_t(s) * (hd + 2) + 1);
            as[s] = d < hd ? __ldcg(all + size_t(s) * (hd + 2) + 2 + d) : 0.0f;
        }
        float Mx = sink;
#pragma unroll
        for (int s = 0; s < kOneRoundMerge; ++s)
            if (s < nact) Mx = fmaxf(Mx, ms[s]);
        float L = a.sinks ? __expf(sink - Mx) : 0.0f;
#pragma unroll
        for (int s = 0; s < kOneRoundMerge; ++s)
            if (s < nact) {
                ms[s] = ms[s] != -INFINITY ? __expf(ms[s] - Mx) : 0.0f;
                L += ls[s] * ms[s];
            }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        float A = 0.0f;
#pragma unroll
        for (int s = 0; s < kOneRoundMerge; ++s)
            if (s < nact) A += as[s] * ms[s];
        if (d < hd) emit_sink_out(a, xb, head, hd, d, A * inv);
        return;
    }
    // More splits: maxima and sums in one load round, then the weights, then
    // each dim's sum over the splits with its loads independent of one another.
    for (int s = threadIdx.x; s < nact; s += blockDim.x) {
        merge_w[s] = __ldcg(all + size_t(s) * (hd + 2));
        merge_l[s] = __ldcg(all + size_t(s) * (hd + 2) + 1);
    }
    __syncthreads();
    float Mx = sink;
    for (int s = 0; s < nact; ++s) Mx = fmaxf(Mx, merge_w[s]);
    __syncthreads();  // all read the maxima before they become weights
    for (int s = threadIdx.x; s < nact; s += blockDim.x)
        merge_w[s] = merge_w[s] != -INFINITY ? __expf(merge_w[s] - Mx) : 0.0f;
    __syncthreads();
    float L = a.sinks ? __expf(sink - Mx) : 0.0f;
    for (int s = 0; s < nact; ++s) L += merge_l[s] * merge_w[s];
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f;
#pragma unroll 8
        for (int s = 0; s < nact; ++s) A += __ldcg(all + size_t(s) * (hd + 2) + 2 + d) * merge_w[s];
        emit_sink_out(a, xb, head, hd, d, A * inv);
    }
}

}  // namespace

int attention_sink_splits(uint32_t n_ctx) { return int(std::clamp<uint32_t>((n_ctx + 127) / 128, 1, 32)); }

size_t attention_sink_scratch_floats(int n_head, int head_dim, int nsplit) {
    return size_t(n_head) * size_t(nsplit) * size_t(head_dim + 2);
}

namespace {

// The fewest keys a split of the decode sink attention takes: the plan's
// sink_min_chunk (at least kMinSinkChunk) on layers that see the whole cache;
// a sliding-window layer of at most kOneSplitWindow keys (gpt-oss's 128) runs
// as one split, which writes its output without the scratch, fence and
// counter (H100, gpt-oss-20b bench -r 3, every split at least 32 -> 128 keys:
// pp512/tg128 501.7-501.9 -> 502.3-503.0 tok/s, pp2048/tg64 462.3 -> 465.1).
constexpr int kOneSplitWindow = 128;
int sink_min_chunk(int window) {
    const int mc = std::max(kMinSinkChunk, plan().sink_min_chunk);
    return window > 0 && window <= kOneSplitWindow ? std::max(mc, window) : mc;
}

void check_sink_args(const SinkAttnArgs& a) {
    if (a.head_dim <= 0 || a.head_dim > 32 * kMaxDpl)
        throw ehp::Error(EH_UNSUPPORTED, "attention: head_dim " + std::to_string(a.head_dim) + " unsupported (1..256)");
    if (a.n_kv <= 0 || a.n_head % a.n_kv) throw ehp::Error(EH_INTERNAL, "attention: n_head must be a multiple of n_kv");
}

// The chunk bits for a.out_chunks (0 without), which only the split kernel
// writes.
int check_chunk_output(const SinkAttnArgs& a, bool split) {
    if (!a.out_chunks) return 0;
    const int xb = detail::gemv_chunk_bits();
    if (!split || !xb || a.head_dim % 32 || reinterpret_cast<uintptr_t>(a.out_chunks) % 16)
        throw ehp::Error(EH_INTERNAL, "attention: chunk output needs the split decode, an integer GemvInput, a head dim "
                                      "multiple of 32 and 16-byte alignment");
    return xb;
}

// f.template operator()<DPL>() for the head dim's dims per lane.
template <class F>
void by_dpl(int head_dim, F&& f) {
    const int dpl = (head_dim + 31) / 32;
    if (dpl == 1) f.template operator()<1>();
    else if (dpl == 2) f.template operator()<2>();
    else if (dpl <= 4) f.template operator()<4>();
    else f.template operator()<8>();
}

}  // namespace

AttnArgs attn_args_of(const SinkAttnArgs& a) {
    AttnArgs t;
    t.q = a.q;
    t.ldq = a.ldq;
    t.k_cache = a.k_cache;
    t.v_cache = a.v_cache;
    t.k_cache32 = a.k_cache32;
    t.v_cache32 = a.v_cache32;
    t.n_head = a.n_head;
    t.n_kv = a.n_kv;
    t.head_dim = a.head_dim;
    t.d_pos0 = a.d_pos0;
    t.ntok = a.ntok;
    t.window = a.window;
    t.scale = a.scale;
    t.sinks = a.sinks;
    t.out = a.out;
    t.ldo = a.ldo;
    return t;
}

void attention_sinks(const SinkAttnArgs& a, cudaStream_t stream) {
    if (a.ntok <= 0) return;
    check_sink_args(a);
    const bool split = a.ntok == 1 && a.nsplit > 1 && a.split_scratch && a.split_counters;
    const int xb = check_chunk_output(a, split);
    if (split && a.nsplit > kMaxSinkSplits) throw ehp::Error(EH_INTERNAL, "attention: at most 128 splits");
    if (a.ntok > 1) {
        // Several queries: attention_prefill (tensor cores for head dims 64,
        // 96, 128), which stages each K/V tile once for a tile of queries
        // (one block per query and head read every key once per query:
        // gpt-oss-20b pp512 spent 521 us per layer there, ncu on an H100).
        const AttnArgs t = attn_args_of(a);
        if (attention_prefill_takes(t) && attention_head_dim_fast(t.head_dim))
            return attention_prefill(t, AttnSplitScratch{a.prefill_scratch, a.prefill_scratch_floats}, stream);
    }
    const dim3 grid = split ? dim3(unsigned(a.nsplit), unsigned(a.n_head)) : dim3(unsigned(a.ntok), unsigned(a.n_head));
    auto go = [&](auto kc, auto vc) {
        using C = std::remove_const_t<std::remove_pointer_t<decltype(kc)>>;
        by_dpl(a.head_dim, [&]<int D>() {
            if (split)
                launch("sink_attn_split_kernel", sink_attn_split_kernel<D, C, false>, grid, kAttnWarps * 32, 0, stream, a,
                       RopeTableArgs{}, const_cast<C*>(kc), const_cast<C*>(vc), xb, detail::attention_early(),
                       sink_min_chunk(a.window));
            else launch("sink_attn_kernel", sink_attn_kernel<D, C>, grid, kAttnWarps * 32, 0, stream, a, kc, vc);
        });
    };
    if (a.k_cache32 && a.v_cache32) go(a.k_cache32, a.v_cache32);
    else go(a.k_cache, a.v_cache);
    EHC_LAUNCHED("sink_attn_kernel");
}

void rope_sink_attention_decode(const RopeTableArgs& r, const SinkAttnArgs& a, cudaStream_t stream) {
    check_sink_args(a);
    if (a.ntok != 1 || r.ntok != 1 || a.nsplit < 1 || !a.split_scratch || !a.split_counters)
        throw ehp::Error(EH_INTERNAL, "fused decode attention: one token, a split scratch and counters");
    if (r.qkv != a.q || r.n_head != a.n_head || r.n_kv != a.n_kv || r.head_dim != a.head_dim || r.d_pos0 != a.d_pos0 ||
        a.ldq != r.ld || r.d_pos || r.d_rows)
        throw ehp::Error(EH_INTERNAL, "fused decode attention: RoPE and attention arguments disagree");
    if (r.n_rot < 0 || r.n_rot > r.head_dim || r.n_rot % 2 || (r.n_rot > 0 && !r.inv_freq))
        throw ehp::Error(EH_INTERNAL, "rope: bad rotary dimension or missing frequency table");
    if (!r.q_norm != !r.k_norm) throw ehp::Error(EH_INTERNAL, "fused decode attention: QK-norm needs both weights");
    const int xb = check_chunk_output(a, true);
    if (a.nsplit > kMaxSinkSplits) throw ehp::Error(EH_INTERNAL, "fused decode attention: at most 128 splits");
    const dim3 grid(unsigned(a.nsplit), unsigned(a.n_head));
    auto go = [&](auto kc, auto vc) {
        using C = std::remove_pointer_t<decltype(kc)>;
        by_dpl(a.head_dim, [&]<int D>() {
            launch("rope_sink_attn_kernel", sink_attn_split_kernel<D, C, true>, grid, kAttnWarps * 32, 0, stream, a, r,
                   kc, vc, xb, detail::attention_early(), sink_min_chunk(a.window));
        });
    };
    if (r.k_cache32 && r.v_cache32) go(r.k_cache32, r.v_cache32);
    else go(r.k_cache, r.v_cache);
    EHC_LAUNCHED("rope_sink_attn_kernel");
}

}  // namespace ehcuda
