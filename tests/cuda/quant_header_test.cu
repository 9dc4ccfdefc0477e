// The integer decode dot's header readers against the byte-wise ones they
// replace: k4_head (one 16-byte load, no branch on the sub-block) must give
// f16_at's d and dmin and k4_scale_min's scale and min bit for bit, for
// every sub-block j of every header, and load_u16 f16_at's bits. A warp's
// lanes take different sub-blocks, as in the GEMV (lane = chunk).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <ehcuda/quant.cuh>

namespace {

__global__ void compare_headers(const uint8_t* blocks, int n, unsigned* mismatches) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * 8) return;
    const int blk = i / 8, j = (i + blk) % 8;  // lanes of a warp on different sub-blocks
    const uint8_t* b = blocks + size_t(blk) * 144;
    float sc, mn;
    ehcuda::k4_scale_min(b + 4, j, sc, mn);
    const ehcuda::K4Head h = ehcuda::k4_head(b, j);
    unsigned bad = 0;
    bad |= __float_as_uint(h.d) != __float_as_uint(ehcuda::f16_at(b)) ? 1u : 0u;
    bad |= __float_as_uint(h.dmin) != __float_as_uint(ehcuda::f16_at(b + 2)) ? 2u : 0u;
    bad |= __float_as_uint(h.sc) != __float_as_uint(sc) ? 4u : 0u;
    bad |= __float_as_uint(h.mn) != __float_as_uint(mn) ? 8u : 0u;
    // load_u16 at every even offset of the block, as Q6_K's readers use it
    for (int o = 0; o + 2 <= 144; o += 2)
        if (ehcuda::load_u16(b + o) != (uint32_t(b[o]) | (uint32_t(b[o + 1]) << 8))) bad |= 16u;
    if (bad) atomicOr(mismatches, bad);
}

TEST(QuantHeaders, K4HeadAndLoadU16MatchTheByteReaders) {
    // Random headers, then every value of each scale byte in turn (the
    // 6-bit fields and the two high bits borrowed by sub-blocks 4..7), and
    // FP16 specials in d / dmin.
    std::mt19937 rng(7);
    std::vector<uint8_t> host;
    auto add = [&](const uint8_t (&head)[16]) {
        uint8_t blk[144];
        for (auto& v : blk) v = uint8_t(rng());
        std::memcpy(blk, head, 16);
        host.insert(host.end(), blk, blk + 144);
    };
    for (int r = 0; r < 4096; ++r) {
        uint8_t h[16];
        for (auto& v : h) v = uint8_t(rng());
        add(h);
    }
    for (int byte = 4; byte < 16; ++byte)
        for (int v = 0; v < 256; ++v) {
            uint8_t h[16];
            for (auto& x : h) x = uint8_t(rng());
            h[byte] = uint8_t(v);
            add(h);
        }
    const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0x7BFF, 0x7C00, 0xFC00, 0x7E00};
    for (uint16_t d : specials)
        for (uint16_t m : specials) {
            uint8_t h[16];
            for (auto& x : h) x = uint8_t(rng());
            std::memcpy(h, &d, 2);
            std::memcpy(h + 2, &m, 2);
            add(h);
        }
    const int n = int(host.size() / 144);
    uint8_t* dev = nullptr;
    unsigned* bad = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, host.size()), cudaSuccess);  // 256-byte aligned: every block 16
    ASSERT_EQ(cudaMalloc(&bad, sizeof(unsigned)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(bad, 0, sizeof(unsigned)), cudaSuccess);
    compare_headers<<<(n * 8 + 255) / 256, 256>>>(dev, n, bad);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    unsigned got = 0;
    ASSERT_EQ(cudaMemcpy(&got, bad, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dev);
    cudaFree(bad);
    EXPECT_EQ(got, 0u) << "bits: 1 d, 2 dmin, 4 scale, 8 min, 16 load_u16";
}

}  // namespace
