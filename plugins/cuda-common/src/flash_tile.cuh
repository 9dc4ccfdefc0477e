// The pieces of flash attention on the tensor cores that the prefill kernel
// (attention_prefill.cu) and the query-group decode kernel
// (attention_decode_group.cu) share: where a key's K/V row lives, FP16
// packing (and the hi + lo split that keeps an FP32 cache's precision),
// ldmatrix loads, and the staging of one tile of keys into shared memory.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ehcuda/attention_paged.hpp"
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

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __half* p) {
    const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __half* p) {
    const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// A staged tile of kKeyTile keys: K and V (FP16 cache, kStages deep for
// cp.async) or K hi, K lo, V hi, V lo (FP32 cache, one stage).
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

}  // namespace ehcuda::detail
