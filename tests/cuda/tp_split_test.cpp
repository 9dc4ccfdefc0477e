// How a tensor-parallel load divides a model (ehcuda/tp_split.hpp), host
// code: the rank mode of the option "tensor_parallel", whole KV heads per
// rank, each rank's whole experts (gpt-cuda's expert parallelism), and the
// host copy of a row-parallel matrix's columns on whole blocks.
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
