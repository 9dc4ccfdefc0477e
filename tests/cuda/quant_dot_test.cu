// The decode GEMV's integer dot (dot_chunk_int) against the shift-and-mask
// form it replaced, bit for bit: Q4_K takes odd sub-blocks' codes in place
// as 16 q (high nibbles, unsigned bytes) with the 1/16 folded into the
// scale, Q6_K moves its two high bits by one rotate (int8 and int16
// inputs; int16 + residue keeps the shifted forms and is checked too). Each
// must give the float the older form gave, for every chunk, every input
// form and headers with FP16 specials and extremes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <ehcuda/quant_dp4a.cuh>

namespace {

using namespace ehcuda;

// The forms before nibble_dot and the rotate (kept here as the reference).
template <class X>
__device__ float q4k_shift_form(const uint8_t* row, int c, const X& x) {
    using S = typename X::Sum;
    const S sx = x.sum_lo + x.sum_hi;
    const uint8_t* b = row + size_t(c >> 3) * 144;
    const int s = c & 7;
    const K4Head hd = k4_head(b, s);
    const uint4* q4 = reinterpret_cast<const uint4*>(b + 16 + 32 * (s >> 1));
    const uint4 qa = q4[0], qb = q4[1];
    const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    const int shift = (s & 1) * 4;
    S si{};
#pragma unroll
    for (int k = 0; k < 8; ++k) si = dot4(x, k, (q[k] >> shift) & 0x0F0F0F0Fu, si);
    return x.d * (hd.d * hd.sc * to_f(si) - hd.dmin * hd.mn * to_f(sx));
}

template <class X>
__device__ float q6k_shift_form(const uint8_t* row, int c, const X& x) {
    using S = typename X::Sum;
    const uint8_t* b = row + size_t(c >> 3) * 210;
    const int s = c & 7;
    const int half = s >> 2, quarter = s & 3;
    const uint8_t* ql = b + 64 * half + ((quarter & 1) ? 32 : 0);
    const uint8_t* qh = b + 128 + 32 * half;
    const uint32_t sc2 = load_u16(b + 192 + 8 * half + 2 * quarter);
    const int sc[2] = {int(int8_t(sc2 & 0xFFu)), int(int8_t(sc2 >> 8))};
    const float d6 = __half2float(__ushort_as_half(uint16_t(load_u16(b + 208))));
    const int lshift = (quarter >> 1) * 4, hshift = quarter * 2;
    uint32_t lw[8], hw[8];
    load_words2<8>(ql, lw);
    load_words2<8>(qh, hw);
    S si0{}, si1{};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const uint32_t v = ((lw[k] >> lshift) & 0x0F0F0F0Fu) | (((hw[k] >> hshift) & 0x03030303u) << 4);
        if (k < 4) si0 = dot4(x, k, v, si0);
        else si1 = dot4(x, k, v, si1);
    }
    return d6 * x.d * (float(sc[0]) * to_f(si0 - 32 * x.sum_lo) + float(sc[1]) * to_f(si1 - 32 * x.sum_hi));
}

// Input chunk i of `xw` (24 random words: codes, then residue codes) in
// the form Bits, with its sums and a scale.
template <int Bits>
__device__ XChunk<Bits> make_x(const int* xw, float d) {
    XChunk<Bits> x{};
    int lo = 0, hi = 0, rlo = 0, rhi = 0;
    for (int k = 0; k < XChunk<Bits>::kWords; ++k) {
        x.w[k] = xw[k];
        for (int e = 0; e < (Bits == 8 ? 4 : 2); ++e) {
            const int v = Bits == 8 ? int(int8_t(xw[k] >> (8 * e))) : int(int16_t(xw[k] >> (16 * e)));
            ((Bits == 8 ? k < 4 : k < 8) ? lo : hi) += v;
        }
    }
    if constexpr (Bits == 32)
        for (int k = 0; k < 8; ++k) {
            x.r[k] = xw[16 + k];
            for (int e = 0; e < 4; ++e) (k < 4 ? rlo : rhi) += int(int8_t(xw[16 + k] >> (8 * e)));
        }
    if constexpr (Bits == 32) {
        x.sum_lo = I2{lo, rlo};
        x.sum_hi = I2{hi, rhi};
    } else {
        x.sum_lo = lo;
        x.sum_hi = hi;
    }
    x.d = d;
    return x;
}

// One thread a chunk of the row: both forms for each input form; bit 1
// (int8), 2 (int16), 4 (int16 + residue) of `bad` where they differ.
template <int T>
__global__ void compare_dots(const uint8_t* row, int nch, const int* xw, const float* xd, unsigned* bad) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= nch) return;
    const int* w = xw + size_t(c) * 24;
    unsigned m = 0;
    auto check = [&](const auto& x, unsigned bit) {
        const float got = dot_chunk_int<T>(row, c, x);
        const float want = T == EH_TYPE_Q4_K ? q4k_shift_form(row, c, x) : q6k_shift_form(row, c, x);
        if (__float_as_uint(got) != __float_as_uint(want)) m |= bit;
    };
    check(make_x<8>(w, xd[c]), 1u);
    check(make_x<16>(w, xd[c]), 2u);
    check(make_x<32>(w, xd[c]), 4u);
    if (m) atomicOr(bad, m);
}

// Random blocks of `bytes` with the FP16 d (and for Q4_K dmin) at
// `d_offset` cycling through normal values, subnormals, zero and the
// largest finite values; random input words with full-range codes (every
// 16-bit code incl. -32768, every residue) and random scales.
template <int T>
unsigned run_case(int blocks, int block_bytes, int d_offset) {
    std::mt19937 rng(T * 131 + blocks);
    std::vector<uint8_t> row(size_t(blocks) * block_bytes + 16);
    for (auto& v : row) v = uint8_t(rng());
    const uint16_t ds[] = {0x3C00, 0x2E66, 0x1400, 0x0001, 0x0000, 0x8001, 0x7BFF, 0xFBFF, 0x03FF, 0xB800};
    for (int b = 0; b < blocks; ++b) {
        const uint16_t d = (b % 3 == 0) ? ds[(b / 3) % 10] : uint16_t(0x2000 + rng() % 0x1800);
        std::memcpy(&row[size_t(b) * block_bytes + d_offset], &d, 2);
        if (T == EH_TYPE_Q4_K) {
            const uint16_t dm = ds[(b + 4) % 10];
            std::memcpy(&row[size_t(b) * block_bytes + 2], &dm, 2);
        }
    }
    const int nch = blocks * 8;
    std::vector<int> xw(size_t(nch) * 24);
    for (auto& v : xw) v = int(rng());
    for (int k = 0; k < 16; ++k) xw[k] = int(0x80008000u);  // chunk 0: every code -32768 (int8: -128)
    std::vector<float> xd(static_cast<size_t>(nch));
    for (auto& v : xd) v = std::ldexp(float(rng() % 1000 + 1), -int(rng() % 40));
    uint8_t* drow = nullptr;
    int* dx = nullptr;
    float* dd = nullptr;
    unsigned* dbad = nullptr;
    EXPECT_EQ(cudaMalloc(&drow, row.size()), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&dx, xw.size() * sizeof(int)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&dd, xd.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&dbad, sizeof(unsigned)), cudaSuccess);
    cudaMemcpy(drow, row.data(), row.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dx, xw.data(), xw.size() * sizeof(int), cudaMemcpyHostToDevice);
    cudaMemcpy(dd, xd.data(), xd.size() * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemset(dbad, 0, sizeof(unsigned));
    compare_dots<T><<<(nch + 127) / 128, 128>>>(drow, nch, dx, dd, dbad);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    unsigned bad = ~0u;
    cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost);
    cudaFree(drow);
    cudaFree(dx);
    cudaFree(dd);
    cudaFree(dbad);
    return bad;
}

TEST(QuantDot, Q4KHighNibblesInPlaceGiveTheShiftedFormsBits) {
    EXPECT_EQ(run_case<EH_TYPE_Q4_K>(4096, 144, 0), 0u) << "bits: 1 int8, 2 int16, 4 int16 + residue";
}

// Q6_K blocks of 210 bytes: every other block 2 mod 4 (load_words2's
// funnel shift), as in a row.
TEST(QuantDot, Q6KHighBitsByOneRotateGiveTheShiftedFormsBits) {
    EXPECT_EQ(run_case<EH_TYPE_Q6_K>(4096, 210, 208), 0u) << "bits: 1 int8, 2 int16, 4 int16 + residue";
}

}  // namespace
