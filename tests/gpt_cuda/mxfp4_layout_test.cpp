// The MXFP4 device layout: row sizes, mxfp4_repack_rows against the layout
// written out here independently (exponent and nibble positions, zeroed
// padding, nothing written past the rows), for whole and partial groups of
// 16 blocks; upload_weights with MXFP4 items in chunks of whole rows (a
// chunk smaller than one row, rows split over chunks, plain items between),
// its progress, cancellation and refusals; WeightPlan::add_mxfp4 sizes.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/mxfp4_layout.hpp>
#include <ehcuda/upload.hpp>
#include <ehcuda/weight_plan.hpp>

#include "gpu_test_util.hpp"

namespace {

using namespace gpttest;

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = uint8_t(rng());
    return b;
}

// The device layout of ggml rows, from its definition: per row, groups of
// 16 blocks of [16 exponents][16 x 16 code bytes], a partial last group's
// exponents zero-padded to 16; in a block's code bytes, value j < 16 is
// nibble j % 4 of word j / 4 and value 16 + j nibble 4 + j % 4 of word
// j / 4 (nibble i of a little-endian word: byte i / 2, high half if i odd).
std::vector<uint8_t> expected_layout(const std::vector<uint8_t>& ggml, size_t rows, int cols) {
    const int nb = cols / 32;
    const size_t row_out = size_t(17) * nb + size_t((16 - nb % 16) % 16);
    std::vector<uint8_t> out(rows * row_out, 0);
    for (size_t r = 0; r < rows; ++r)
        for (int c = 0; c < nb; ++c) {
            const uint8_t* blk = &ggml[(r * nb + c) * 17];
            uint8_t* row = &out[r * row_out];
            const size_t group = size_t(c / 16) * 272;
            row[group + size_t(c % 16)] = blk[0];
            uint8_t* codes = row + group + 16 + size_t(c % 16) * 16;
            for (int v = 0; v < 32; ++v) {
                const int j = v % 16;
                const uint8_t code = v < 16 ? blk[1 + j] & 15 : blk[1 + j] >> 4;
                const int nibble = (v < 16 ? 0 : 4) + j % 4;
                const int byte = 4 * (j / 4) + nibble / 2;
                codes[byte] = uint8_t(codes[byte] | (nibble % 2 ? code << 4 : code));
            }
        }
    return out;
}

TEST(Mxfp4Layout, RowBytes) {
    EXPECT_EQ(ehcuda::mxfp4_device_row_bytes(2880), 1536u);  // gpt-oss: 90 blocks, 1530 in the file
    EXPECT_EQ(ehcuda::mxfp4_file_row_bytes(2880), 1530u);
    EXPECT_EQ(ehcuda::mxfp4_device_row_bytes(32), 32u);   // 1 exponent + 15 padding + 16 codes
    EXPECT_EQ(ehcuda::mxfp4_device_row_bytes(512), 272u);  // one whole group, no padding
    EXPECT_EQ(ehcuda::mxfp4_device_row_bytes(544), 272u + 32u);
    for (int64_t bad : {0, -32, 16, 48, 2881}) {
        EXPECT_EQ(ehcuda::mxfp4_device_row_bytes(bad), 0u) << bad;
        EXPECT_EQ(ehcuda::mxfp4_file_row_bytes(bad), 0u) << bad;
    }
    for (int64_t cols = 32; cols <= 32 * 200; cols += 32) EXPECT_EQ(ehcuda::mxfp4_device_row_bytes(cols) % 16, 0u);
}

TEST(Mxfp4Layout, RepackMatchesTheLayoutByteForByte) {
    REQUIRE_GPU();
    std::mt19937 rng(11);
    // nb = 1, 5, 15 (one partial group), 16 (one whole), 33 (whole + 1), 90
    for (int cols : {32, 160, 480, 512, 1056, 2880}) {
        const size_t rows = 5;
        const auto ggml = random_bytes(rng, rows * ehcuda::mxfp4_file_row_bytes(cols));
        const auto want = expected_layout(ggml, rows, cols);
        ASSERT_EQ(want.size(), rows * ehcuda::mxfp4_device_row_bytes(cols));
        auto src = dev(ggml);
        ehcuda::DeviceBuffer dst(want.size() + 256);
        ASSERT_EQ(cudaMemset(dst.get(), 0xAB, dst.size()), cudaSuccess);  // padding must be written as 0
        ehcuda::mxfp4_repack_rows(src.get(), dst.get(), int64_t(rows), cols, nullptr);
        const auto got = host<uint8_t>(dst, dst.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << "cols " << cols;
        for (size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0xAB) << "cols " << cols << ": wrote past the rows";
    }
}

TEST(Mxfp4Layout, RepackRefusesBadColumnsAndMisalignedDestination) {
    REQUIRE_GPU();
    ehcuda::DeviceBuffer a(4096), b(4096);
    EXPECT_THROW(ehcuda::mxfp4_repack_rows(a.get(), b.get(), 1, 48, nullptr), ehp::Error);
    EXPECT_THROW(ehcuda::mxfp4_repack_rows(a.get(), b.as<uint8_t>() + 4, 1, 64, nullptr), ehp::Error);
}

// An MXFP4 item, a plain item, an MXFP4 item of a partial group, with
// chunk sizes below one row, of a few rows and not row multiples, and
// larger than everything.
TEST(Mxfp4Layout, UploadRepacksInChunksOfWholeRows) {
    REQUIRE_GPU();
    std::mt19937 rng(12);
    const size_t rows_a = 7, rows_c = 9;
    const int cols_a = 2880, cols_c = 160;
    const auto a = random_bytes(rng, rows_a * ehcuda::mxfp4_file_row_bytes(cols_a));
    const auto b = random_bytes(rng, 3001);
    const auto c = random_bytes(rng, rows_c * ehcuda::mxfp4_file_row_bytes(cols_c));
    const auto want_a = expected_layout(a, rows_a, cols_a), want_c = expected_layout(c, rows_c, cols_c);
    for (size_t chunk : {size_t(1000), size_t(3100), size_t(4096), size_t(1) << 20}) {
        ehcuda::DeviceBuffer da(want_a.size()), db(b.size()), dc(want_c.size());
        std::vector<ehcuda::UploadItem> items = {{a.data(), da.get(), a.size(), cols_a},
                                                 {b.data(), db.get(), b.size(), 0},
                                                 {c.data(), dc.get(), c.size(), cols_c}};
        ehcuda::UploadOptions opt;
        opt.chunk_bytes = chunk;
        opt.progress_lo = 0.5f;
        std::vector<float> progress;
        opt.progress = [&](float f) { progress.push_back(f); };
        const auto st = ehcuda::upload_weights(items, opt, nullptr);
        EXPECT_EQ(st.bytes, a.size() + b.size() + c.size());
        EXPECT_EQ(host<uint8_t>(da, want_a.size()), want_a) << "chunk " << chunk;
        EXPECT_EQ(host<uint8_t>(db, b.size()), b) << "chunk " << chunk;
        EXPECT_EQ(host<uint8_t>(dc, want_c.size()), want_c) << "chunk " << chunk;
        ASSERT_FALSE(progress.empty());
        EXPECT_FLOAT_EQ(progress.front(), 0.5f);
        EXPECT_FLOAT_EQ(progress.back(), 1.0f);
        for (size_t i = 1; i < progress.size(); ++i) EXPECT_LE(progress[i - 1], progress[i]);
    }
}

TEST(Mxfp4Layout, UploadCancelsAndRefusesMalformedItems) {
    REQUIRE_GPU();
    std::mt19937 rng(13);
    const auto a = random_bytes(rng, 4 * ehcuda::mxfp4_file_row_bytes(2880));
    ehcuda::DeviceBuffer da(4 * ehcuda::mxfp4_device_row_bytes(2880));
    ehcuda::UploadOptions opt;
    opt.chunk_bytes = 100;
    int polls = 0;
    opt.cancelled = [&] { return ++polls == 3; };
    try {
        ehcuda::upload_weights({{a.data(), da.get(), a.size(), 2880}}, opt, nullptr);
        ADD_FAILURE() << "not cancelled";
    } catch (const ehp::Error& e) {
        EXPECT_EQ(e.status(), EH_CANCELLED);
    }
    EXPECT_EQ(polls, 3);
    opt.cancelled = nullptr;
    // not whole rows; columns not whole blocks; a misaligned destination
    EXPECT_THROW(ehcuda::upload_weights({{a.data(), da.get(), a.size() - 17, 2880}}, opt, nullptr), ehp::Error);
    EXPECT_THROW(ehcuda::upload_weights({{a.data(), da.get(), a.size(), 2881}}, opt, nullptr), ehp::Error);
    EXPECT_THROW(ehcuda::upload_weights({{a.data(), da.as<uint8_t>() + 8, a.size(), 2880}}, opt, nullptr), ehp::Error);
}

// add_mxfp4 reserves the device rows and lists the file bytes for upload.
TEST(Mxfp4Layout, WeightPlanReservesDeviceRowsAndUploadsFileRows) {
    REQUIRE_GPU();
    std::mt19937 rng(14);
    const auto a = random_bytes(rng, 6 * ehcuda::mxfp4_file_row_bytes(2880));
    const auto want = expected_layout(a, 6, 2880);
    ehcuda::DeviceArena arena;
    ehcuda::WeightPlan plan(arena);
    const float one = 1.0f;
    plan.add(&one, 4, 4, "f", EH_TYPE_F32);
    const size_t off = plan.add_mxfp4(a.data(), 6, 2880, 0, "experts");
    EXPECT_EQ(arena.planned_bytes(), off + ehcuda::DeviceArena::align_up(want.size()));
    EXPECT_EQ(plan.dominant_type(), "MXFP4");
    EXPECT_THROW(plan.add_mxfp4(a.data(), 6, 100, 0, "bad"), ehp::Error);
    arena.allocate(nullptr);
    const auto items = plan.upload_items();
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[1].bytes, a.size());
    EXPECT_EQ(items[1].mxfp4_cols, 2880);
    EXPECT_EQ(items[0].mxfp4_cols, 0);
    ehcuda::upload_weights(items, {}, nullptr);
    std::vector<uint8_t> got(want.size());
    ASSERT_EQ(cudaMemcpy(got.data(), arena.at(off), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, want);
}

}  // namespace
