// A single token's input as the weight-streaming kernels read it: staged
// once per block into shared memory (float, or integer codes per 32-element
// chunk for the integer dot products of quant_dp4a.cuh), with the SwiGLU or
// RMSNorm fold applied on the way; and the same chunk layout written by a
// producer kernel to global memory, so a consumer reads it without staging.
// Used by the GEMV (gemv.cu) and the MoE decode kernels (moe_decode.cu).
#pragma once

#include "ehcuda/quant_dp4a.cuh"
#include "matmul_common.cuh"

namespace ehcuda::detail {

// Staged float rows are padded to 36 floats per 32-element chunk, so the
// 16-byte reads of neighbouring lanes (one chunk each) hit distinct banks.
constexpr int kChunkPad = 36;

inline size_t staged_bytes(int cols) { return size_t(cols / 32) * kChunkPad * sizeof(float); }

// Integer chunks: the codes (int8, int16, or for Bits 32 int16 codes then
// int8 residue codes), then a header: the float scale and the code sums of
// elements 0..15 and 16..31 (Bits 32: then the residue codes' sums of the
// two halves as one word of two int16). Strides of 48, 80 and 112 bytes
// (odd multiples of 16) keep the 16-byte reads of 8 neighbouring lanes on
// distinct banks.
template <int Bits>
constexpr int kIntStride = Bits == 8 ? 48 : Bits == 16 ? 80 : 112;
static_assert(size_t(kIntStride<8>) == int_chunk_bytes(GemvInput::Int8) &&
                  size_t(kIntStride<16>) == int_chunk_bytes(GemvInput::Int16) &&
                  size_t(kIntStride<32>) == int_chunk_bytes(GemvInput::Int16x2),
              "kernel_plan.hpp sizes staged inputs with these strides");
template <int Bits>
constexpr int kCodeBytes = Bits == 8 ? 32 : Bits == 16 ? 64 : 96;

// Bits 32: the rounding residue of a code (|.| <= 0.5) in units of
// 1/kResidueUnits of a code, as an int8 (+0.5 exactly, a tie, is kept at
// 127/256). Residue codes are dotted four at a time with __dp4a.
__device__ __forceinline__ int residue_code(float scaled, int q) {
    return min(__float2int_rn((scaled - float(q)) * float(kResidueUnits)), 127);
}
template <int Bits>
inline size_t staged_int_bytes(int cols) { return size_t(cols / 32) * kIntStride<Bits>; }

// The staging arguments of one token's input of `cols` values: x as is, or
// RMS-normalised times norm_w when norm_w is set.
inline DevArgs single_token_input(const float* x, int cols, const float* norm_w, float norm_eps) {
    DevArgs xa{};
    xa.cols = cols;
    xa.x = x;
    xa.ldx = cols;
    xa.xmode = int(norm_w ? XMode::RmsNorm : XMode::Plain);
    xa.norm_w = norm_w;
    xa.norm_eps = norm_w ? norm_eps : 0.0f;
    xa.ntok = 1;
    return xa;
}

// 1 / rms(x) from each thread's partial sum of squares `ss` of a.x (a
// block-wide sum, then a barrier); every thread of the block gets it.
__device__ __forceinline__ float block_inv_rms(float ss, const DevArgs& a) {
    __shared__ float red[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) tot += red[w];
    return rsqrtf(tot / float(a.cols) + a.norm_eps);
}

// 1 / rms(x) * (fold weight applied by the caller) for the RMSNorm fold;
// 1 otherwise. Every thread of the block gets the value.
__device__ __forceinline__ float block_rms_scale(const DevArgs& a) {
    if (a.xmode != int(XMode::RmsNorm)) return 1.0f;
    const int n4 = a.cols / 4;
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    float ss = 0.0f;
#pragma unroll 4
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        const float4 v = x4[i];
        ss = fmaf(v.x, v.x, ss);
        ss = fmaf(v.y, v.y, ss);
        ss = fmaf(v.z, v.z, ss);
        ss = fmaf(v.w, v.w, ss);
    }
    return block_inv_rms(ss, a);
}

// Float staging, 16-byte loads, unrolled, so the staging is a few memory
// round trips rather than one per element.
__device__ __forceinline__ void stage_x(const DevArgs& a, float* xs) {
    const int n4 = a.cols / 4;
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    const float scale = block_rms_scale(a);
#pragma unroll 4
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = x4[i];
        if (a.xmode == int(XMode::SwiGLU)) {
            const float4 u = x4[n4 + i];
            v.x = silu(v.x) * u.x;
            v.y = silu(v.y) * u.y;
            v.z = silu(v.z) * u.z;
            v.w = silu(v.w) * u.w;
        } else if (a.xmode == int(XMode::RmsNorm)) {
            const float4 w = reinterpret_cast<const float4*>(a.norm_w)[i];
            v.x *= scale * w.x;
            v.y *= scale * w.y;
            v.z *= scale * w.z;
            v.w *= scale * w.w;
        }
        const int e = 4 * i;
        *reinterpret_cast<float4*>(xs + (e >> 5) * kChunkPad + (e & 31)) = v;
    }
    __syncthreads();
}

// Packs two int16 codes into one word (low element in the low half).
__device__ __forceinline__ int pack16(int lo, int hi) { return (lo & 0xFFFF) | (hi << 16); }

// Quantizes the four input values v of float4 index i (elements 4i..4i+3)
// into the integer chunk layout at `smem` (one token's staged input). Every
// 8 consecutive threads own one chunk and all 32 lanes must call it (the
// amax and code sums are shuffled); `ok` false: a lane past the row, which
// takes part in the shuffles with v zero and stores nothing.
template <int Bits>
__device__ __forceinline__ void quantize_quad(float4 v, bool ok, int i, uint8_t* smem) {
    constexpr float kMax = Bits == 8 ? 127.0f : 32767.0f;
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax > 0.0f ? kMax / amax : 0.0f;
    const float s0 = v.x * id, s1 = v.y * id, s2 = v.z * id, s3 = v.w * id;
    const int q0 = __float2int_rn(s0), q1 = __float2int_rn(s1);
    const int q2 = __float2int_rn(s2), q3 = __float2int_rn(s3);
    // Code sums of each half chunk: 4 threads per 16 elements.
    int sum = q0 + q1 + q2 + q3;
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    int r0 = 0, r1 = 0, r2 = 0, r3 = 0, rsum = 0;
    if constexpr (Bits == 32) {
        r0 = residue_code(s0, q0);
        r1 = residue_code(s1, q1);
        r2 = residue_code(s2, q2);
        r3 = residue_code(s3, q3);
        rsum = r0 + r1 + r2 + r3;
        rsum += __shfl_xor_sync(0xffffffffu, rsum, 1);
        rsum += __shfl_xor_sync(0xffffffffu, rsum, 2);
    }
    if (!ok) return;
    const int e = 4 * i;
    uint8_t* chunk = smem + size_t(e >> 5) * kIntStride<Bits>;
    if constexpr (Bits == 8) {
        *reinterpret_cast<char4*>(chunk + (e & 31)) = make_char4(char(q0), char(q1), char(q2), char(q3));
    } else {
        *reinterpret_cast<int2*>(chunk + 2 * (e & 31)) = make_int2(pack16(q0, q1), pack16(q2, q3));
        if constexpr (Bits == 32)
            *reinterpret_cast<char4*>(chunk + 64 + (e & 31)) = make_char4(char(r0), char(r1), char(r2), char(r3));
    }
    int* hdr = reinterpret_cast<int*>(chunk + kCodeBytes<Bits>);
    if ((i & 7) == 0) {
        hdr[0] = __float_as_int(amax / kMax);
        hdr[1] = sum;
        if constexpr (Bits == 32) reinterpret_cast<int16_t*>(hdr + 3)[0] = int16_t(rsum);
    } else if ((i & 7) == 4) {
        hdr[2] = sum;
        if constexpr (Bits == 32) reinterpret_cast<int16_t*>(hdr + 3)[1] = int16_t(rsum);
    }
}

// Integer staging. Every 8 consecutive threads own one chunk (4 elements
// each). Returns the factor the consumer applies to each dot product: 1,
// or 1 / rms(x) for the RMSNorm fold. Codes and chunk scales are those of
// x * norm_w: a common factor leaves a chunk's codes as they are and only
// scales its scale, so the staging need not wait for the block's sum of
// squares (one pass over x, one barrier).
template <int Bits>
__device__ __forceinline__ float stage_x_int(const DevArgs& a, uint8_t* smem) {
    const int n4 = a.cols / 4;
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    const bool norm = a.xmode == int(XMode::RmsNorm);
    float ss = 0.0f;
    // n4 is a multiple of 8 and blockDim of 32: whole warps stay in step.
    // kBatch rows of float4 per thread are loaded before any is used: the
    // shuffles below keep the compiler from overlapping loads across
    // iterations, and one L2 round trip per 512 inputs made the staging of a
    // long row (ffn_down, 4864-8192 inputs) cost most of a small GEMV.
    constexpr int kBatch = 4;
    for (int base = 0; base < n4; base += kBatch * blockDim.x) {
        float4 vb[kBatch], ub[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int i = base + k * blockDim.x + threadIdx.x;
            vb[k] = i < n4 ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
            if (a.xmode == int(XMode::SwiGLU)) ub[k] = i < n4 ? x4[n4 + i] : make_float4(0.f, 0.f, 0.f, 0.f);
            else if (a.xmode == int(XMode::RmsNorm)) ub[k] = i < n4 ? reinterpret_cast<const float4*>(a.norm_w)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int i = base + k * blockDim.x + threadIdx.x;
            if (base + k * blockDim.x >= n4) break;  // uniform across the block
            const bool ok = i < n4;
            float4 v = vb[k];
            if (ok) {
                if (a.xmode == int(XMode::SwiGLU)) {
                    const float4 u = ub[k];
                    v.x = silu(v.x) * u.x;
                    v.y = silu(v.y) * u.y;
                    v.z = silu(v.z) * u.z;
                    v.w = silu(v.w) * u.w;
                } else if (norm) {
                    const float4 w = ub[k];
                    ss = fmaf(v.x, v.x, ss);
                    ss = fmaf(v.y, v.y, ss);
                    ss = fmaf(v.z, v.z, ss);
                    ss = fmaf(v.w, v.w, ss);
                    v.x *= w.x;
                    v.y *= w.y;
                    v.z *= w.z;
                    v.w *= w.w;
                }
            }
            quantize_quad<Bits>(v, ok, i, smem);
        }
    }
    // (norm is the same for the whole block; either branch has its barrier)
    if (norm) return block_inv_rms(ss, a);
    __syncthreads();
    return 1.0f;
}

// The inputs of `ntok` tokens (rows a.x + t * a.ldx, XMode Plain or SwiGLU:
// no fold that needs a per-token reduction), each staged as stage_x_int
// stages one token, token t at smem + t * stride: the same codes, so a
// token's dot products are bitwise those of a single-token launch. The
// tokens' float4 indices form one range over the block (a token's n4 is a
// multiple of 8, so a chunk's 8 threads never straddle two tokens).
template <int Bits>
__device__ __forceinline__ void stage_x_int_tokens(const DevArgs& a, uint8_t* smem, int ntok, int stride) {
    const int n4 = a.cols / 4, total = ntok * n4;
    const bool swiglu = a.xmode == int(XMode::SwiGLU);
    constexpr int kBatch = 4;
    for (int base = 0; base < total; base += kBatch * blockDim.x) {
        float4 vb[kBatch], ub[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int f = base + k * blockDim.x + threadIdx.x;
            const int t = f / n4, i = f - t * n4;
            const float4* x4 = reinterpret_cast<const float4*>(a.x + size_t(t) * a.ldx);
            vb[k] = f < total ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
            if (swiglu) ub[k] = f < total ? x4[n4 + i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int f = base + k * blockDim.x + threadIdx.x;
            if (base + k * blockDim.x >= total) break;  // uniform across the block
            const bool ok = f < total;
            const int t = f / n4, i = f - t * n4;
            float4 v = vb[k];
            if (ok && swiglu) {
                const float4 u = ub[k];
                v.x = silu(v.x) * u.x;
                v.y = silu(v.y) * u.y;
                v.z = silu(v.z) * u.z;
                v.w = silu(v.w) * u.w;
            }
            quantize_quad<Bits>(v, ok, i, smem + size_t(ok ? t : 0) * stride);
        }
    }
    __syncthreads();
}

// The low bytes of v on lanes 4k..4k+3 as one word, on lane 4k (other
// lanes: undefined): four one-byte codes packed by the whole warp.
__device__ __forceinline__ int pack_bytes_warp(int v) {
    const int b1 = __shfl_down_sync(0xffffffffu, v, 1), b2 = __shfl_down_sync(0xffffffffu, v, 2);
    const int b3 = __shfl_down_sync(0xffffffffu, v, 3);
    return (v & 0xFF) | ((b1 & 0xFF) << 8) | ((b2 & 0xFF) << 16) | (b3 << 24);
}

// The integer chunk of 32 values held one per lane (lane = element),
// written by the whole warp to `chunk` (any memory, kIntStride<Bits> bytes,
// 16-byte aligned): how a producer leaves its output ready for a consumer's
// integer dot products. Rounds exactly as stage_x_int<Bits> does, so a
// consumer gets the same codes either way.
template <int Bits>
__device__ __forceinline__ void store_chunk_warp(float v, uint8_t* chunk) {
    constexpr float kMax = Bits == 8 ? 127.0f : 32767.0f;
    const int lane = threadIdx.x & 31;
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax > 0.0f ? kMax / amax : 0.0f;
    const float sv = v * id;
    const int q = __float2int_rn(sv);
    const int r = Bits == 32 ? residue_code(sv, q) : 0;
    int sq = q, sr = r;
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if constexpr (Bits == 32) sr += __shfl_xor_sync(0xffffffffu, sr, o);
    }
    int* words = reinterpret_cast<int*>(chunk);
    if constexpr (Bits == 8) {
        const int w = pack_bytes_warp(q);
        if ((lane & 3) == 0) words[lane >> 2] = w;
    } else {
        const int qn = __shfl_down_sync(0xffffffffu, q, 1);
        if ((lane & 1) == 0) words[lane >> 1] = pack16(q, qn);
        if constexpr (Bits == 32) {
            const int w = pack_bytes_warp(r);
            if ((lane & 3) == 0) words[16 + (lane >> 2)] = w;
        }
    }
    int* hdr = reinterpret_cast<int*>(chunk + kCodeBytes<Bits>);
    int sr_hi = 0;
    if constexpr (Bits == 32) sr_hi = __shfl_sync(0xffffffffu, sr, 16);
    if (lane == 0) {
        hdr[0] = __float_as_int(amax / kMax);
        hdr[1] = sq;
        if constexpr (Bits == 32) hdr[3] = pack16(sr, sr_hi);
    } else if (lane == 16) {
        hdr[2] = sq;
    }
}

// store_chunk_warp with the bits known at run time (8, 16 or 32): element e
// (= 32 c + lane) of a vector kept as chunks at `base`.
__device__ __forceinline__ void store_chunk_warp_bits(int bits, float v, void* base, int e) {
    uint8_t* b = static_cast<uint8_t*>(base);
    const int c = e >> 5;
    if (bits == 8) store_chunk_warp<8>(v, b + size_t(c) * kIntStride<8>);
    else if (bits == 16) store_chunk_warp<16>(v, b + size_t(c) * kIntStride<16>);
    else store_chunk_warp<32>(v, b + size_t(c) * kIntStride<32>);
}

// Bits of the current GemvInput's chunks; 0 for GemvInput::Float.
inline int gemv_chunk_bits() {
    switch (gemv_input()) {
    case GemvInput::Int8: return 8;
    case GemvInput::Int16: return 16;
    case GemvInput::Int16x2: return 32;
    default: return 0;
    }
}

// Chunk c of a staged (shared) or produced (global) integer input.
template <int Bits>
__device__ __forceinline__ void load_staged_int(const uint8_t* base, int c, XChunk<Bits>& x) {
    const uint8_t* chunk = base + size_t(c) * kIntStride<Bits>;
    const int4* p = reinterpret_cast<const int4*>(chunk);
#pragma unroll
    for (int i = 0; i < XChunk<Bits>::kWords / 4; ++i) {
        const int4 g = p[i];
        x.w[4 * i] = g.x; x.w[4 * i + 1] = g.y; x.w[4 * i + 2] = g.z; x.w[4 * i + 3] = g.w;
    }
    const int* hdr = reinterpret_cast<const int*>(chunk + kCodeBytes<Bits>);
    x.d = __int_as_float(hdr[0]);
    if constexpr (Bits == 32) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int4 g = p[4 + i];
            x.r[4 * i] = g.x; x.r[4 * i + 1] = g.y; x.r[4 * i + 2] = g.z; x.r[4 * i + 3] = g.w;
        }
        const int rs = hdr[3];
        x.sum_lo = I2{hdr[1], int(int16_t(rs & 0xFFFF))};
        x.sum_hi = I2{hdr[2], rs >> 16};
    } else {
        x.sum_lo = hdr[1];
        x.sum_hi = hdr[2];
    }
}

__device__ __forceinline__ void load_staged32(const float* xs, int c, float (&v)[32]) {
    const float4* p = reinterpret_cast<const float4*>(xs + c * kChunkPad);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        float4 g = p[i];
        v[4 * i] = g.x; v[4 * i + 1] = g.y; v[4 * i + 2] = g.z; v[4 * i + 3] = g.w;
    }
}

}  // namespace ehcuda::detail
