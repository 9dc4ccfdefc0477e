// Host tests of the whole-call prefill slab (ehcuda/prefill_slab.hpp).
#include <gtest/gtest.h>

#include <ehcuda/prefill_slab.hpp>

namespace {

constexpr size_t MiB = size_t(1) << 20;

TEST(PrefillSlab, HoldsTheLargestCallWhole) {
    // Gemma 3 27B: Q|K|V 8,192 + 4,096 x 2 rows, attn_out, gate|up 43,008
    // rows, ffn_down, all 5,376 wide (ffn_down 21,504) in FP16.
    const std::vector<size_t> calls{size_t(16384) * 5376 * 2, size_t(5376) * 4096 * 2, size_t(43008) * 5376 * 2,
                                    size_t(5376) * 21504 * 2};
    EXPECT_EQ(ehcuda::whole_gemm_slab_mb(calls), 441);  // gate|up: 462,422,016 bytes
    EXPECT_EQ(ehcuda::whole_gemm_slab_mb({size_t(12) * MiB + 1}), 13);
}

TEST(PrefillSlab, SmallCallsKeepTheDefaultSlab) {
    EXPECT_EQ(ehcuda::whole_gemm_slab_mb({}), 0);
    EXPECT_EQ(ehcuda::whole_gemm_slab_mb({size_t(4) * MiB, size_t(12) * MiB}), 0);
}

TEST(PrefillSlab, HugeCallsTakeTheCap) {
    EXPECT_EQ(ehcuda::whole_gemm_slab_mb({size_t(3) << 30}), ehcuda::kMaxWholeGemmSlabMb);
    EXPECT_EQ(ehcuda::whole_gemm_slab_mb({size_t(ehcuda::kMaxWholeGemmSlabMb) * MiB}), ehcuda::kMaxWholeGemmSlabMb);
}

}  // namespace
