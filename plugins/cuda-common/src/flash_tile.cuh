// The pieces of flash attention on the tensor cores that the prefill kernel
// (attention_prefill.cu) and the query-group decode kernel
// (attention_decode_group.cu) share: where a key's K/V row lives, FP16
// packing (and the hi + lo split that keeps an FP32 cache's precision)
// and the staging of one tile of keys into shared memory.
#pragma once

#include <cuda_fp16.h>

#include <cmath>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ehcuda/attention_paged.hpp"
#include "kv_quant.cuh"
#include "mma.cuh"

namespace ehcuda::detail {

constexpr int kKeyTile = 64;  // keys per staged tile
constexpr int kPad = 8;       // halves of padding per smem row: ldmatrix rows hit distinct banks
constexpr float kLog2e = 1.4426950408889634f;

// Where key `pos` of KV head `kvh` lives: row pos of one [pos][n_kv][head_dim]
// array per layer, or (table set) the pool row its block holds it in.
template <class C>
struct KvRows {
    const C* base;
    int ld;  // elements per position (n_kv * head_dim)
    int hd;
    const int32_t* table;  // block ids of a paged pool, or null
    __device__ __forceinline__ const C* row(int pos, int kvh) const {
        const size_t r = table ? size_t(table[pos / kPagedBlockTokens]) * kPagedBlockTokens + pos % kPagedBlockTokens
                               : size_t(pos);
        return base + r * ld + size_t(kvh) * hd;
    }
};

// A quantized pool (C a kv_quant.cuh tag): its rows' codes and scales.
template <>
struct KvRows<KvQ8> : KvQuantRows<KvQ8> {};
template <>
struct KvRows<KvF8> : KvQuantRows<KvF8> {};

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
}
// hi = fp16(a, b); lo = fp16 of what hi missed.
__device__ __forceinline__ void split_half2(float a, float b, uint32_t& hi, uint32_t& lo) {
    __half2 h = __floats2half2_rn(a, b);
    const float2 hf = __half22float2(h);
    hi = *reinterpret_cast<uint32_t*>(&h);
    lo = pack_half2(a - hf.x, b - hf.y);
}

// A staged tile of kKeyTile keys: K and V (FP16 cache, kStages deep for
// cp.async; a quantized pool's the same, dequantized to FP16 as staged) or
// K hi, K lo, V hi, V lo (FP32 cache, one stage).
template <int HD, class C>
struct Tile {
    static constexpr bool kSplit = std::is_same_v<C, float>;
    static constexpr int kLd = HD + kPad;                  // smem row stride (halves)
    static constexpr int kMat = kKeyTile * kLd;            // one staged matrix (halves)
    static constexpr int kStages = kSplit ? 1 : 2;
    static constexpr int kMatsPerStage = kSplit ? 4 : 2;   // K, V (and their lo parts)
    static constexpr size_t kSmem = size_t(kStages) * kMatsPerStage * kMat * sizeof(__half);
};

// Stages keys kb .. kb+kKeyTile-1 of [.., ke) (zeros past ke) into `dst`,
// the block's kThreads threads sharing the copies: K at dst, V at dst +
// kMat (FP16 cache, asynchronous: commit and wait follow) or K hi, K lo,
// V hi, V lo (FP32 cache, split; synchronous).
template <int HD, class C, int kThreads>
__device__ __forceinline__ void stage_tile(__half* dst, const KvRows<C>& kr, const KvRows<C>& vr, int kvh, int kb,
                                           int ke) {
    using T = Tile<HD, C>;
    constexpr int kChunks = kKeyTile * HD / 8;  // 8-element pieces per matrix
    if constexpr (kQuantKv<C>) {
        // Eight codes and their block's scale per piece, every piece of the
        // thread loaded before the first is converted (one memory wait, not
        // one per piece), then stored as FP16 (synchronously: the commit and
        // wait that follow find nothing).
        constexpr int kPer = (kChunks + kThreads - 1) / kThreads;
        uint2 kc[kPer], vc[kPer];
        __half ks[kPer], vs[kPer];
#pragma unroll
        for (int u = 0; u < kPer; ++u) {
            const int c = threadIdx.x + u * kThreads;
            const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
            kc[u] = vc[u] = make_uint2(0, 0);
            ks[u] = vs[u] = __float2half(0.0f);
            if (c < kChunks && kb + r < ke) {
                const size_t row = kr.row_of(kb + r);
                const int b = col / kKvQuantBlock;
                kc[u] = *reinterpret_cast<const uint2*>(kr.codes(row, kvh) + col);
                vc[u] = *reinterpret_cast<const uint2*>(vr.codes(row, kvh) + col);
                ks[u] = kr.scales(row, kvh)[b];
                vs[u] = vr.scales(row, kvh)[b];
            }
        }
#pragma unroll
        for (int u = 0; u < kPer; ++u) {
            const int c = threadIdx.x + u * kThreads;
            if (c >= kChunks) break;
            const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
            *reinterpret_cast<uint4*>(dst + r * T::kLd + col) = kv_dequant8<C>(kc[u], ks[u]);
            *reinterpret_cast<uint4*>(dst + T::kMat + r * T::kLd + col) = kv_dequant8<C>(vc[u], vs[u]);
        }
    } else {
        for (int c = threadIdx.x; c < kChunks; c += kThreads) {
            const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
            const int pos = kb + r;
            const bool in = pos < ke;
            if constexpr (!T::kSplit) {
                const int p = in ? pos : kb;  // a readable row; 0 bytes are read from it
                cp_async16(dst + r * T::kLd + col, kr.row(p, kvh) + col, in ? 16 : 0);
                cp_async16(dst + T::kMat + r * T::kLd + col, vr.row(p, kvh) + col, in ? 16 : 0);
            } else {
                float4 k0 = {}, k1 = {}, v0 = {}, v1 = {};
                if (in) {
                    const float4* kp = reinterpret_cast<const float4*>(kr.row(pos, kvh) + col);
                    const float4* vp = reinterpret_cast<const float4*>(vr.row(pos, kvh) + col);
                    k0 = kp[0];
                    k1 = kp[1];
                    v0 = vp[0];
                    v1 = vp[1];
                }
                uint4 kh, kl, vh, vl;
                split_half2(k0.x, k0.y, kh.x, kl.x);
                split_half2(k0.z, k0.w, kh.y, kl.y);
                split_half2(k1.x, k1.y, kh.z, kl.z);
                split_half2(k1.z, k1.w, kh.w, kl.w);
                split_half2(v0.x, v0.y, vh.x, vl.x);
                split_half2(v0.z, v0.w, vh.y, vl.y);
                split_half2(v1.x, v1.y, vh.z, vl.z);
                split_half2(v1.z, v1.w, vh.w, vl.w);
                const int o = r * T::kLd + col;
                *reinterpret_cast<uint4*>(dst + o) = kh;
                *reinterpret_cast<uint4*>(dst + T::kMat + o) = kl;
                *reinterpret_cast<uint4*>(dst + 2 * T::kMat + o) = vh;
                *reinterpret_cast<uint4*>(dst + 3 * T::kMat + o) = vl;
            }
        }
    }
}

// The per-warp steps of flash attention over a staged tile, in the
// m16n8k16 fragment layout: g = lane / 4 picks rows g and g + 8 of the
// warp's 16, tq = lane % 4 the column pair 2 tq, 2 tq + 1 of each 8-wide
// accumulator tile.

// Q fragments (A operand, 16 rows x HD) of rows q0 (row g) and q1 (row
// g + 8), scaled (into log2 units); zeros where a row is absent. An FP32
// cache's products take hi + lo parts of Q too.
template <int HD, bool kSplit>
__device__ __forceinline__ void q_fragments(const float* q0, const float* q1, bool in0, bool in1, float qscale, int tq,
                                            uint32_t (&qh)[HD / 16][4], uint32_t (&ql)[kSplit ? HD / 16 : 1][4]) {
#pragma unroll
    for (int d = 0; d < HD / 16; ++d) {
        const int c0 = 16 * d + 2 * tq, c1 = c0 + 8;
        float v[4][2];
        v[0][0] = in0 ? q0[c0] * qscale : 0.0f;
        v[0][1] = in0 ? q0[c0 + 1] * qscale : 0.0f;
        v[1][0] = in1 ? q1[c0] * qscale : 0.0f;
        v[1][1] = in1 ? q1[c0 + 1] * qscale : 0.0f;
        v[2][0] = in0 ? q0[c1] * qscale : 0.0f;
        v[2][1] = in0 ? q0[c1 + 1] * qscale : 0.0f;
        v[3][0] = in1 ? q1[c1] * qscale : 0.0f;
        v[3][1] = in1 ? q1[c1 + 1] * qscale : 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (kSplit) split_half2(v[i][0], v[i][1], qh[d][i], ql[d][i]);
            else qh[d][i] = pack_half2(v[i][0], v[i][1]);
        }
    }
}

// s = Q K^T for the 8 staged keys from row `key0` of the tile at st (K at
// st, its lo part at st + kMat for an FP32 cache).
template <int HD, class C>
__device__ __forceinline__ void qk_keys8(const __half* st, int key0, int lane, const uint32_t (&qh)[HD / 16][4],
                                         const uint32_t (&ql)[Tile<HD, C>::kSplit ? HD / 16 : 1][4], float (&s)[4]) {
    using T = Tile<HD, C>;
    s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
    for (int dd = 0; dd < HD / 32; ++dd) {
        const int off = (key0 + (lane & 7)) * T::kLd + 32 * dd + 8 * (lane >> 3);
        uint32_t b[4];
        ldsm_x4(b, st + off);
        mma16816(s, qh[2 * dd], b[0], b[1]);
        mma16816(s, qh[2 * dd + 1], b[2], b[3]);
        if constexpr (T::kSplit) {
            uint32_t bl[4];
            ldsm_x4(bl, st + T::kMat + off);
            mma16816(s, qh[2 * dd], bl[0], bl[1]);
            mma16816(s, qh[2 * dd + 1], bl[2], bl[3]);
            mma16816(s, ql[2 * dd], b[0], b[1]);
            mma16816(s, ql[2 * dd + 1], b[2], b[3]);
        }
    }
}

// Folds NS score tiles (rows g and g + 8) into the running max m, sum l and
// output o (online softmax, base 2), leaving the tiles as probabilities
// relative to the new max.
template <int NS, int NO>
__device__ __forceinline__ void softmax_fold(float (&s)[NS][4], float& m0, float& m1, float& l0, float& l1,
                                             float (&o)[NO][4]) {
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
        mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
        mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // A row with no valid key yet keeps max -inf; base 0 keeps exp2 finite.
    const float b0 = mx0 == -INFINITY ? 0.0f : mx0, b1 = mx1 == -INFINITY ? 0.0f : mx1;
    const float a0 = exp2f(m0 - b0), a1 = exp2f(m1 - b1);
    m0 = mx0;
    m1 = mx1;
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
        s[j][0] = exp2f(s[j][0] - b0);
        s[j][1] = exp2f(s[j][1] - b0);
        s[j][2] = exp2f(s[j][2] - b1);
        s[j][3] = exp2f(s[j][3] - b1);
        rs0 += s[j][0] + s[j][1];
        rs1 += s[j][2] + s[j][3];
    }
    l0 = l0 * a0 + rs0;
    l1 = l1 * a1 + rs1;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
        o[n][0] *= a0;
        o[n][1] *= a0;
        o[n][2] *= a1;
        o[n][3] *= a1;
    }
}

// o += P V for the 16 staged keys from row `key0` of the V matrix at vs
// (its lo part at vs + kMat for an FP32 cache); P's A fragment is the two
// score tiles p0 (keys key0..+7) and p1 (+8..+15), whose accumulator layout
// is the A-operand layout.
template <int HD, class C>
__device__ __forceinline__ void pv_keys16(const __half* vs, int key0, int lane, const float (&p0)[4],
                                          const float (&p1)[4], float (&o)[HD / 8][4]) {
    using T = Tile<HD, C>;
    uint32_t ph[4], pl[4];
    if constexpr (T::kSplit) {
        split_half2(p0[0], p0[1], ph[0], pl[0]);
        split_half2(p0[2], p0[3], ph[1], pl[1]);
        split_half2(p1[0], p1[1], ph[2], pl[2]);
        split_half2(p1[2], p1[3], ph[3], pl[3]);
    } else {
        ph[0] = pack_half2(p0[0], p0[1]);
        ph[1] = pack_half2(p0[2], p0[3]);
        ph[2] = pack_half2(p1[0], p1[1]);
        ph[3] = pack_half2(p1[2], p1[3]);
    }
#pragma unroll
    for (int nn = 0; nn < HD / 16; ++nn) {
        const int off = (key0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * T::kLd + 16 * nn + 8 * (lane >> 4);
        uint32_t b[4];
        ldsm_x4_trans(b, vs + off);
        mma16816(o[2 * nn], ph, b[0], b[1]);
        mma16816(o[2 * nn + 1], ph, b[2], b[3]);
        if constexpr (T::kSplit) {
            uint32_t bl[4];
            ldsm_x4_trans(bl, vs + T::kMat + off);
            mma16816(o[2 * nn], ph, bl[0], bl[1]);
            mma16816(o[2 * nn + 1], ph, bl[2], bl[3]);
            mma16816(o[2 * nn], pl, b[0], b[1]);
            mma16816(o[2 * nn + 1], pl, b[2], b[3]);
        }
    }
}

}  // namespace ehcuda::detail
