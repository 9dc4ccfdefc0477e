// How a tensor-parallel load divides a model (ehcuda/tp_split.hpp), host
// code: the rank mode of the option "tensor_parallel", whole KV heads per
// rank, each rank's whole experts (gpt-cuda's expert parallelism) or its
// rows of every expert (tensor parallelism within experts), and the host
// copy of a row-parallel matrix's columns on whole blocks.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <ehcuda/tp_split.hpp>

namespace {

std::string refusal(auto&& fn, eh_status want) {
    try {
        fn();
    } catch (const ehp::Error& e) {
        EXPECT_EQ(e.status(), want) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no refusal";
    return "";
}

TEST(TpSplit, ExpertRangesCoverEveryExpertOnceAsEvenlyAsTheyCan) {
    for (int n_expert : {2, 4, 8, 10, 32, 128, 129})
        for (int ranks : {1, 2, 3, 4, 8}) {
            if (n_expert < ranks) continue;
            SCOPED_TRACE(std::to_string(n_expert) + " experts over " + std::to_string(ranks) + " ranks");
            int next = 0, most = 0, least = n_expert;
            for (int r = 0; r < ranks; ++r) {
                const ehcuda::ExpertRange e = ehcuda::expert_range(n_expert, ranks, r);
                EXPECT_EQ(e.first, next);  // contiguous, in rank order
                EXPECT_GE(e.count, 1);
                EXPECT_TRUE(e.holds(e.first));
                EXPECT_TRUE(e.holds(e.first + e.count - 1));
                EXPECT_FALSE(e.holds(e.first + e.count));
                EXPECT_FALSE(e.holds(e.first - 1));
                next += e.count;
                most = std::max(most, e.count);
                least = std::min(least, e.count);
            }
            EXPECT_EQ(next, n_expert);
            EXPECT_LE(most - least, 1);
        }
    // gpt-oss-20b's 32 over 2, Qwen3-30B-A3B's 128 over 8, 10 over 4
    EXPECT_EQ(ehcuda::expert_range(32, 2, 1).first, 16);
    EXPECT_EQ(ehcuda::expert_range(128, 8, 7).first, 112);
    EXPECT_EQ(ehcuda::expert_range(10, 4, 1).first, 3);
    EXPECT_EQ(ehcuda::expert_range(10, 4, 3).count, 2);
}

TEST(TpSplit, FewerExpertsThanRanksAreRefused) {
    const std::string why = refusal([] { ehcuda::expert_range(4, 8, 0); }, EH_UNSUPPORTED);
    EXPECT_NE(why.find("4 experts do not split over 8 ranks"), std::string::npos) << why;
}

TEST(TpSplit, KvHeadsSplitWholeOrAreRefused) {
    EXPECT_EQ(ehcuda::kv_heads_per_rank(8, 2), 4);
    EXPECT_EQ(ehcuda::kv_heads_per_rank(2, 2), 1);
    EXPECT_EQ(ehcuda::kv_heads_per_rank(4, 1), 4);
    const std::string why = refusal([] { ehcuda::kv_heads_per_rank(2, 4); }, EH_UNSUPPORTED);
    EXPECT_NE(why.find("2 KV heads do not split over 4 ranks"), std::string::npos) << why;
}

eh_tensor tensor_of(const char* name, uint32_t type, uint64_t cols, uint64_t rows, const std::vector<uint8_t>& bytes) {
    eh_tensor t{};
    t.name = eh_string{name, std::strlen(name)};
    t.type = type;
    t.n_dims = 2;
    t.dims[0] = cols;
    t.dims[1] = rows;
    t.dims[2] = t.dims[3] = 1;
    t.data = bytes.data();
    t.nbytes = bytes.size();
    return t;
}

TEST(TpSplit, ColumnSliceCopiesEachRowsShare) {
    // F32, 3 rows of 8: columns 2..5
    std::vector<float> m(24);
    for (size_t i = 0; i < m.size(); ++i) m[i] = float(i);
    std::vector<uint8_t> bytes(m.size() * 4);
    std::memcpy(bytes.data(), m.data(), bytes.size());
    const eh_tensor t = tensor_of("blk.0.attn_output.weight", EH_TYPE_F32, 8, 3, bytes);
    std::vector<uint8_t> out;
    EXPECT_EQ(ehcuda::column_slice(t, 3, 32, 2, 4, out), 16u);
    ASSERT_EQ(out.size(), 48u);
    std::vector<float> got(12);
    std::memcpy(got.data(), out.data(), out.size());
    EXPECT_EQ(got, (std::vector<float>{2, 3, 4, 5, 10, 11, 12, 13, 18, 19, 20, 21}));

    // Q8_0 (34-byte blocks of 32), 2 rows of 64: the second block of each
    std::vector<uint8_t> q(2 * 68);
    for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i);
    const eh_tensor tq = tensor_of("q", EH_TYPE_Q8_0, 64, 2, q);
    EXPECT_EQ(ehcuda::column_slice(tq, 2, 68, 32, 32, out), 34u);
    ASSERT_EQ(out.size(), 68u);
    EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + 34), std::vector<uint8_t>(q.begin() + 34, q.begin() + 68));
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + 34, out.end()), std::vector<uint8_t>(q.begin() + 102, q.end()));
}

TEST(TpSplit, ColumnSliceOffBlocksIsRefusedByName) {
    // Q4_K (blocks of 256, 144 bytes): 256 columns cannot be cut at 128
    std::vector<uint8_t> q(144 * 2);
    const eh_tensor t = tensor_of("blk.3.attn_output.weight", EH_TYPE_Q4_K, 256, 2, q);
    std::vector<uint8_t> out;
    const std::string why = refusal([&] { ehcuda::column_slice(t, 2, 144, 0, 128, out); }, EH_UNSUPPORTED);
    EXPECT_NE(why.find("'blk.3.attn_output.weight' (Q4_K) cannot be cut at columns 0..128"), std::string::npos) << why;
}

// MXFP4 (17-byte blocks of 32): a file row's blocks are cut as any type's
// (gpt-oss's down experts, their columns split within experts).
TEST(TpSplit, ColumnSliceCutsMxfp4FileRows) {
    std::vector<uint8_t> q(2 * 34);
    for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i);
    const eh_tensor t = tensor_of("blk.0.ffn_down_exps.weight", EH_TYPE_MXFP4, 64, 2, q);
    std::vector<uint8_t> out;
    EXPECT_EQ(ehcuda::column_slice(t, 2, 34, 32, 32, out), 17u);
    ASSERT_EQ(out.size(), 34u);
    EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + 17), std::vector<uint8_t>(q.begin() + 17, q.begin() + 34));
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + 17, out.end()), std::vector<uint8_t>(q.begin() + 51, q.end()));
}

// Tensor parallelism within experts: equal shares of the width, in rank
// order, each on whole blocks of down's type.
TEST(TpSplit, ExpertRowRangesSplitTheWidthEvenlyOnWholeBlocks) {
    const std::vector<uint8_t> none;
    const eh_tensor mx = tensor_of("blk.0.ffn_down_exps.weight", EH_TYPE_MXFP4, 2880, 2880, none);
    // gpt-oss-20b/120b's 2880 over 2: 45 MXFP4 blocks each
    EXPECT_EQ(ehcuda::expert_row_range(mx, 2880, 2, 0).first, 0);
    EXPECT_EQ(ehcuda::expert_row_range(mx, 2880, 2, 0).count, 1440);
    EXPECT_EQ(ehcuda::expert_row_range(mx, 2880, 2, 1).first, 1440);
    EXPECT_EQ(ehcuda::expert_row_range(mx, 2880, 2, 1).count, 1440);
    // the tiny gpt-oss files' 64 over 2; one rank holds the whole width
    EXPECT_EQ(ehcuda::expert_row_range(mx, 64, 2, 1).first, 32);
    EXPECT_EQ(ehcuda::expert_row_range(mx, 64, 1, 0).count, 64);
    // Qwen3-30B-A3B's 768 of Q4_K over 3: one 256-value block each
    const eh_tensor q4 = tensor_of("blk.0.ffn_down_exps.weight", EH_TYPE_Q4_K, 768, 2048, none);
    for (int r = 0; r < 3; ++r) {
        EXPECT_EQ(ehcuda::expert_row_range(q4, 768, 3, r).first, 256 * r);
        EXPECT_EQ(ehcuda::expert_row_range(q4, 768, 3, r).count, 256);
    }
    // F32 (blocks of one): any even share
    const eh_tensor f = tensor_of("blk.0.ffn_down_exps.weight", EH_TYPE_F32, 32, 64, none);
    EXPECT_EQ(ehcuda::expert_row_range(f, 32, 4, 3).first, 24);
}

// A rank's rows of every expert: a fused gate|up of width 3 (rows 0..2
// gate, 3..5 up) cut at rows 1..2 of each half keeps gate 1, 2 and up 1, 2
// of expert 0, then of expert 1; a bias (4-byte rows) the same way.
TEST(TpSplit, ExpertRowsCopyKeepsEachExpertsCutsInOrder) {
    std::vector<uint8_t> w(2 * 6 * 2);  // 2 experts x 6 rows x 2 bytes
    for (size_t i = 0; i < w.size(); ++i) w[i] = uint8_t(i);
    std::vector<uint8_t> out;
    const std::vector<ehcuda::RowRange> cuts{{1, 2}, {4, 2}};
    EXPECT_EQ(ehcuda::expert_rows_copy(w.data(), 2, 6, 2, cuts, out), 4);
    EXPECT_EQ(out, (std::vector<uint8_t>{2, 3, 4, 5, 8, 9, 10, 11, 14, 15, 16, 17, 20, 21, 22, 23}));
    const std::vector<float> bias{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};
    EXPECT_EQ(ehcuda::expert_rows_copy(bias.data(), 4, 6, 2, cuts, out), 4);
    std::vector<float> got(8);
    ASSERT_EQ(out.size(), 32u);
    std::memcpy(got.data(), out.data(), out.size());
    EXPECT_EQ(got, (std::vector<float>{1, 2, 4, 5, 11, 12, 14, 15}));
    // one cut (separate gate or up): rows 0..1 of 3 per expert
    EXPECT_EQ(ehcuda::expert_rows_copy(w.data(), 2, 3, 4, {{0, 2}}, out), 2);
    EXPECT_EQ(out, (std::vector<uint8_t>{0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15, 18, 19, 20, 21}));
}

TEST(TpSplit, ExpertRowRangesOffBlocksOrUnevenAreRefusedByName) {
    const std::vector<uint8_t> none;
    // Qwen3-MoE's 768 of Q4_K over 2: 384 is not whole 256-value blocks
    const eh_tensor q4 = tensor_of("blk.0.ffn_down_exps.weight", EH_TYPE_Q4_K, 768, 2048, none);
    std::string why = refusal([&] { ehcuda::expert_row_range(q4, 768, 2, 0); }, EH_UNSUPPORTED);
    EXPECT_NE(why.find("tensor 'blk.0.ffn_down_exps.weight' (Q4_K) cannot be cut at columns 0..384"), std::string::npos)
        << why;
    // the tiny Qwen3-MoE's 256 of Q4_K over 2
    why = refusal([&] { ehcuda::expert_row_range(q4, 256, 2, 1); }, EH_UNSUPPORTED);
    EXPECT_NE(why.find("(Q4_K) cannot be cut at columns 128..256"), std::string::npos) << why;
    // gpt-oss's 2880 over 4: 720 is not whole MXFP4 blocks of 32
    const eh_tensor mx = tensor_of("blk.5.ffn_down_exps.weight", EH_TYPE_MXFP4, 2880, 2880, none);
    why = refusal([&] { ehcuda::expert_row_range(mx, 2880, 4, 0); }, EH_UNSUPPORTED);
    EXPECT_NE(why.find("tensor 'blk.5.ffn_down_exps.weight' (MXFP4) cannot be cut at columns 0..720"), std::string::npos)
        << why;
    // a width the ranks do not divide
    why = refusal([&] { ehcuda::expert_row_range(mx, 2880, 7, 0); }, EH_UNSUPPORTED);
    EXPECT_NE(why.find("width of 2880 rows does not split evenly over 7 ranks"), std::string::npos) << why;
}

TEST(TpSplit, RankModeOption) {
    using ehcuda::Options;
    const std::vector<int> one_gpu{0, 0}, two_gpus{0, 1};
    EXPECT_FALSE(ehcuda::tp_streams_option(Options(nullptr), one_gpu));  // the shard mode by default
    EXPECT_TRUE(ehcuda::tp_streams_option(Options(R"({"tensor_parallel":"streams"})"), one_gpu));
    EXPECT_TRUE(ehcuda::tp_streams_option(Options(nullptr), two_gpus));
    EXPECT_FALSE(ehcuda::tp_streams_option(Options(R"({"tensor_parallel":"streams"})"), {0}));  // one rank
    const std::string why = refusal(
        [&] { ehcuda::tp_streams_option(Options(R"({"tensor_parallel":"serial"})"), two_gpus); }, EH_INVALID_ARGUMENT);
    EXPECT_NE(why.find("the device set names 0,1"), std::string::npos) << why;
    refusal([&] { ehcuda::tp_streams_option(Options(R"({"tensor_parallel":"rings"})"), one_gpu); }, EH_INVALID_ARGUMENT);
}

}  // namespace
