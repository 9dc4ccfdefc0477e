// Device decoding of MXFP4 blocks (OCP microscaling). A block is 32 values:
// one E8M0 shared exponent e (value 2^(e-127)) and 32 E2M1 codes (bit 3
// sign, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}). Files (ggml) store a block
// as 17 bytes: e, then qs[16] with value j in the low nibble of qs[j] and
// value j+16 in the high nibble. On the device the same exponents and codes
// are kept rearranged (mxfp4_repack_rows, mxfp4_layout.hpp, writes it;
// every device reader uses the accessors below):
//
// Device layout of a row of nb = cols/32 blocks:
//   groups of 16 blocks, each [16 exponent bytes][16 x 16 code bytes]
//   (272 bytes); a last partial group of m = nb % 16 blocks is
//   [m exponent bytes, zero padding to 16][m x 16 code bytes]. Row bytes =
//   17 nb + (16 - nb % 16) % 16, a multiple of 16 (gpt-oss: nb = 90, 1536
//   bytes instead of 1530), so with a 16-byte aligned tensor every block's
//   codes are one aligned 16-byte load. Block c: exponent at
//   (c >> 4) * 272 + (c & 15), codes at (c >> 4) * 272 + 16 + (c & 15) * 16.
//   Within the 16 code bytes, 32-bit word k (k = 0..3, little-endian) holds
//   values 4k..4k+3 in nibbles 0..3 and values 16+4k..16+4k+3 in nibbles
//   4..7: one word expands to the int8 codes of input words k and 4 + k of
//   an XChunk (quant_dp4a.cuh) with byte permutes (mxfp4_x2_bytes).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "quant.cuh"

namespace ehcuda {

constexpr int kMxfp4GroupBlocks = 16;
constexpr int kMxfp4GroupBytes = 16 + 16 * 16;

// Bytes of a device row of nb blocks.
constexpr size_t mxfp4_device_row_bytes_nb(int64_t nb) {
    return size_t(nb) * 17 + size_t((kMxfp4GroupBlocks - nb % kMxfp4GroupBlocks) % kMxfp4GroupBlocks);
}
// Block c's group, its exponent byte and its 16 code bytes within a row.
__host__ __device__ constexpr size_t mxfp4_group_offset(int c) { return size_t(c >> 4) * kMxfp4GroupBytes; }
__host__ __device__ constexpr size_t mxfp4_exp_offset(int c) { return mxfp4_group_offset(c) + (c & 15); }
__host__ __device__ constexpr size_t mxfp4_codes_offset(int c) {
    return mxfp4_group_offset(c) + 16 + size_t(c & 15) * 16;
}

// 2^(e-127) as float bits; e = 0 is the subnormal 2^-127, e = 255 is +inf
// (as the host's ldexp gives).
__device__ __forceinline__ float e8m0_value(uint32_t e) {
    return e == 0 ? __int_as_float(0x00400000) : __int_as_float(int(e << 23));
}

// Block c of a device row: its exponent byte and its four code words. The
// exponent comes from one 16-byte load of the group's whole exponent header
// (the 16 lanes reading a group load the same address: one broadcast), both
// loads off one group pointer. A byte load at a second address per row cost
// the decode kernels registers (ptxas, sm_90: gate|up 80 -> 98 per thread,
// 3 -> 2 blocks per SM, gpt-oss decode -5 %); this form, these exact
// selects included, keeps them at 80 (down 76). Check with -Xptxas -v after
// touching it.
__device__ __forceinline__ void mxfp4_block(const uint8_t* row, int c, uint32_t& exponent, uint4& codes) {
    const uint8_t* grp = row + mxfp4_group_offset(c);
    const int i = c & 15;
    const uint4 hd = __ldg(reinterpret_cast<const uint4*>(grp));
    codes = __ldg(reinterpret_cast<const uint4*>(grp + 16 + i * 16));
    const uint32_t w = i < 4 ? hd.x : i < 8 ? hd.y : i < 12 ? hd.z : hd.w;
    exponent = (w >> (8 * (i & 3))) & 255u;
}

// Code word u (layout above) as signed bytes of twice the values: lo gets
// values 4k..4k+3 (nibbles 0..3), hi values 16+4k..16+4k+3 (nibbles 4..7).
// A selector nibble's low 3 bits are the magnitude code, which picks from
// {0, 1, 2, 3, 4, 6, 8, 12} and from their negatives; the sign bit then
// picks per byte between the two (selector n or 4 + n). Selector nibbles
// stay below 8: prmt's sign-replicate bit is never set.
__device__ __forceinline__ void mxfp4_x2_bytes(uint32_t u, uint32_t& lo, uint32_t& hi) {
    constexpr uint32_t kPos03 = 0x03020100u, kPos47 = 0x0C080604u;
    constexpr uint32_t kNeg03 = 0xFDFEFF00u, kNeg47 = 0xF4F8FAFCu;
    const uint32_t s_lo = u & 0x7777u, s_hi = (u >> 16) & 0x7777u;
    const uint32_t pos_lo = __byte_perm(kPos03, kPos47, s_lo), neg_lo = __byte_perm(kNeg03, kNeg47, s_lo);
    const uint32_t pos_hi = __byte_perm(kPos03, kPos47, s_hi), neg_hi = __byte_perm(kNeg03, kNeg47, s_hi);
    lo = __byte_perm(pos_lo, neg_lo, 0x3210u | ((u >> 1) & 0x4444u));
    hi = __byte_perm(pos_hi, neg_hi, 0x3210u | ((u >> 17) & 0x4444u));
}

// Chunk c as floats: the doubled integer codes times half the block scale
// (both exact, so the products are the values' single roundings, as the
// host's code * scale).
__device__ __forceinline__ void load_mxfp4_chunk(const uint8_t* row, int c, float (&v)[32]) {
    uint32_t e;
    uint4 q;
    mxfp4_block(row, c, e, q);
    const float half_scale = 0.5f * e8m0_value(e);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        uint32_t lo, hi;
        mxfp4_x2_bytes(w[k], lo, hi);
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            v[4 * k + n] = float(int8_t(lo >> (8 * n))) * half_scale;
            v[16 + 4 * k + n] = float(int8_t(hi >> (8 * n))) * half_scale;
        }
    }
}

// load_chunk<T> for the matmul types plus MXFP4 (device layout).
template <int T>
__device__ __forceinline__ void load_any_chunk(const uint8_t* row, int c, float (&v)[32]) {
    if constexpr (T == EH_TYPE_MXFP4) load_mxfp4_chunk(row, c, v);
    else load_chunk<T>(row, c, v);
}

}  // namespace ehcuda
