// gpt-cuda's tensor parallelism (ABI 1.6: the load names a GPU per rank) on
// the forged tiny gpt-oss (MXFP4 experts, sinks, sliding window) and tiny
// Qwen3-MoE (Q4_K experts of width 256, QK-norm), and the
// transformers-checked tiny gpt-oss and Qwen3-MoE: attention split by KV
// head, the experts whole per rank (expert parallelism: every rank routes
// alike and keeps its own experts' pairs), one all-reduce after
// attn_output and one after the experts. In the shard mode (one GPU named
// once per rank: the ranks one after another on the step's stream) and the
// streams mode on one GPU (each rank on its own stream with its own
// residual, the path of distinct GPUs). The sharded model must compute
// what the whole one does: teacher-forced top-1 agreement >= 99 % and
// |delta logprob| <= 0.02 at every position of a 3-prompt prefill step
// (the grouped expert kernels), batched decodes, and single-token decodes
// (CUDA graphs; the one-token expert kernel behind the filter). Both files
// have 2 KV heads, so 2 ranks is the most they split over; 4 is refused by
// name, as is everything else gpt-cuda does not shard. The load option
// "expert_split": "rows" (tensor parallelism within experts: every rank
// every expert, its rows of their width; no routing filter) on both tiny
// gpt-oss files in both modes, to the same bar; the tiny Qwen3-MoE's Q4_K
// width of 256 does not cut over 2 ranks and is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <eh/model/model_file.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/moe_expert_range.hpp>
#include <ehcuda/tp_split.hpp>

#include "compare.hpp"  // tests/gpt_cuda: forged tiny models
#include "plugins.hpp"  // tests/gpt_cuda: the gpt-cuda plugin
#include "tp_agreement.hpp"

namespace {

using gpttest::gpu_api;

const eh_model_view* view_of(const std::string& name) {
    static std::map<std::string, std::unique_ptr<eh::model::ModelFile>> files;
    auto& f = files[name];
    if (!f) f = eh::model::ModelFile::open(gpttest::model_path(name));
    return &f->view();
}

// tp_agreement.hpp's load of one of gpttest's model files.
struct Loaded : ehtest::TpLoaded {
    Loaded(const std::string& name, const std::vector<int32_t>& devices, const char* options = nullptr)
        : TpLoaded(gpu_api(), name.c_str(), view_of(name), devices, options) {}
};

// Teacher-forced logits at every position of tp_agreement.hpp's schedule
// (the load's log lines in *stages).
std::vector<std::vector<float>> teacher_forced(const std::string& name, const std::vector<int32_t>& devices,
                                               const char* options, std::vector<std::string>* stages = nullptr) {
    Loaded m(name, devices, options);
    EXPECT_EQ(m.status, EH_OK) << m.error;
    if (m.status != EH_OK) return {};
    if (stages) *stages = m.stages;
    return ehtest::tp_teacher_forced(*m.sm, m.vocab);
}

constexpr const char* kStreams = R"({"tensor_parallel":"streams"})";
constexpr const char* kRows = R"({"expert_split":"rows"})";
constexpr const char* kRowsStreams = R"({"expert_split":"rows","tensor_parallel":"streams"})";

struct TpCase {
    std::string label;
    std::string model;
    int tp;
    const char* options = nullptr;
};

class GptTensorParallel : public ::testing::TestWithParam<TpCase> {};

#define REQUIRE_GPT_CUDA()                                                        \
    if (!gpttest::plugin_gpu_usable()) GTEST_SKIP() << "no usable CUDA device";   \
    ASSERT_NE(gpu_api(), nullptr) << "gpt-cuda plugin not loadable"

TEST_P(GptTensorParallel, TeacherForcedLogitsAgreeWithOneRank) {
    REQUIRE_GPT_CUDA();
    const TpCase& tc = GetParam();
    const auto one = teacher_forced(tc.model, {}, nullptr);
    std::vector<std::string> stages;
    const auto many = teacher_forced(tc.model, std::vector<int32_t>(size_t(tc.tp), 0), tc.options, &stages);
    // the load says how it split the model (whole experts, or within them)
    const bool rows = tc.options && std::string(tc.options).find(R"("expert_split":"rows")") != std::string::npos;
    const std::string split = rows ? "expert rows 0+" : "experts 0+";
    const bool said = std::any_of(stages.begin(), stages.end(), [&](const std::string& l) {
        return l.find("tensor parallel: " + std::to_string(tc.tp) + " ranks") != std::string::npos &&
               l.find(split) != std::string::npos;
    });
    EXPECT_TRUE(said) << "no \"tensor parallel: " << tc.tp << " ranks ... " << split << "\" line in the load's log";
    ehtest::expect_tp_agreement(one, many, tc.model + " " + std::to_string(tc.tp) + " ranks " +
                                               (tc.options ? tc.options : "(shard mode)"));
}

INSTANTIATE_TEST_SUITE_P(
    Shards, GptTensorParallel,
    ::testing::Values(TpCase{"gpt_oss", "tiny-gpt-oss-mxfp4", 2}, TpCase{"qwen3moe", "tiny-qwen3-moe-q4_k_m", 2},
                      // the transformers-checked files: gpt-oss's window of 4 on even
                      // layers (shorter than every sequence); Qwen3-MoE's F32 experts
                      // (the per-pair and cuBLAS expert forms) and head dim 32
                      TpCase{"ref_gpt_oss", "gpt-oss", 2}, TpCase{"ref_qwen3moe", "qwen3moe", 2},
                      TpCase{"streams_gpt_oss", "tiny-gpt-oss-mxfp4", 2, kStreams},
                      TpCase{"streams_qwen3moe", "tiny-qwen3-moe-q4_k_m", 2, kStreams},
                      // within experts: MXFP4 widths of 64 cut 32 + 32 (gate and up
                      // rows with their biases, down's columns, its bias on rank 0)
                      TpCase{"rows_gpt_oss", "tiny-gpt-oss-mxfp4", 2, kRows},
                      TpCase{"rows_ref_gpt_oss", "gpt-oss", 2, kRows},
                      TpCase{"rows_streams_gpt_oss", "tiny-gpt-oss-mxfp4", 2, kRowsStreams},
                      TpCase{"rows_streams_ref_gpt_oss", "gpt-oss", 2, kRowsStreams}),
    [](const auto& info) { return info.param.label + "_tp" + std::to_string(info.param.tp); });

// The routing filter (moe_expert_range.hpp) against its host statement:
// every pair is kept, with its weight and its local index, by exactly the
// rank holding its expert; every other rank's copy is marked id -1, weight
// 0 (the expert kernels skip it: tests/gpt_cuda/moe_expert_skip_test.cpp).
// Uneven ranges (10 experts over 4 ranks), k 1 .. 8.
TEST(GptTensorParallelFilter, EachPairIsKeptByTheRankHoldingItsExpert) {
    REQUIRE_GPT_CUDA();
    std::mt19937 rng(3);
    for (int n_expert : {4, 10, 128})
        for (int ranks : {2, 4})
            for (int k : {1, 2, 4, 8}) {
                if (k > n_expert) continue;
                SCOPED_TRACE(std::to_string(n_expert) + " experts, " + std::to_string(ranks) + " ranks, k " + std::to_string(k));
                const int ntok = 300;
                std::vector<int32_t> ids(size_t(ntok) * k);
                std::vector<float> w(ids.size());
                for (size_t i = 0; i < ids.size(); ++i) {
                    ids[i] = int32_t(rng() % uint32_t(n_expert));
                    w[i] = 0.01f + float(rng() % 1000) / 1000.0f;
                }
                std::vector<int> kept(ids.size(), 0);
                for (int r = 0; r < ranks; ++r) {
                    const ehcuda::ExpertRange er = ehcuda::expert_range(n_expert, ranks, r);
                    ehcuda::DeviceBuffer dids(ids.size() * 4), dw(w.size() * 4);
                    ASSERT_EQ(cudaMemcpy(dids.get(), ids.data(), dids.size(), cudaMemcpyHostToDevice), cudaSuccess);
                    ASSERT_EQ(cudaMemcpy(dw.get(), w.data(), dw.size(), cudaMemcpyHostToDevice), cudaSuccess);
                    ehcuda::moe_keep_expert_range(dids.as<int32_t>(), dw.as<float>(), ntok, k, er.first, er.count, nullptr);
                    std::vector<int32_t> got_ids(ids.size());
                    std::vector<float> got_w(w.size());
                    ASSERT_EQ(cudaMemcpy(got_ids.data(), dids.get(), dids.size(), cudaMemcpyDeviceToHost), cudaSuccess);
                    ASSERT_EQ(cudaMemcpy(got_w.data(), dw.get(), dw.size(), cudaMemcpyDeviceToHost), cudaSuccess);
                    for (size_t i = 0; i < ids.size(); ++i) {
                        if (er.holds(ids[i])) {
                            ++kept[i];
                            EXPECT_EQ(got_ids[i], ids[i] - er.first);
                            EXPECT_EQ(got_w[i], w[i]);
                        } else {
                            EXPECT_EQ(got_ids[i], -1);
                            EXPECT_EQ(got_w[i], 0.0f);
                        }
                    }
                }
                for (int c : kept) ASSERT_EQ(c, 1);
            }
}

// What gpt-cuda does not shard is refused at load, by name.
TEST(GptTensorParallelLoad, RefusalsNameWhy) {
    REQUIRE_GPT_CUDA();
    auto refusal = [](const std::string& model, const std::vector<int32_t>& d, const char* options, eh_status want) {
        Loaded m(model, d, options);
        EXPECT_EQ(m.status, want) << m.error;
        EXPECT_EQ(m.model, nullptr);
        return m.error;
    };
    EXPECT_NE(refusal("tiny-qwen3-moe-q4_k_m", {0, 0, 0, 0}, nullptr, EH_UNSUPPORTED)
                  .find("2 KV heads do not split over 4 ranks"),
              std::string::npos);
    EXPECT_NE(refusal("tiny-gpt-oss-mxfp4", {0, 0}, R"({"batch_invariant":true})", EH_UNSUPPORTED)
                  .find("batch_invariant is not built for tensor parallelism"),
              std::string::npos);
    EXPECT_NE(refusal("tiny-gpt2-f16", {0, 0}, nullptr, EH_UNSUPPORTED).find("not built for gpt2"), std::string::npos);
    EXPECT_NE(refusal("tiny-gpt-oss-mxfp4", std::vector<int32_t>(9, 0), nullptr, EH_INVALID_ARGUMENT).find("at most 8 devices"),
              std::string::npos);
    EXPECT_NE(refusal("tiny-gpt-oss-mxfp4", {0, 0}, R"({"tensor_parallel":"rings"})", EH_INVALID_ARGUMENT)
                  .find("tensor_parallel"),
              std::string::npos);
    // within experts: the tiny Qwen3-MoE's width of 256 in 256-value blocks
    // (Q4_K / Q6_K) has no cut at 128, named with the tensor and its type
    const std::string cut = refusal("tiny-qwen3-moe-q4_k_m", {0, 0}, kRows, EH_UNSUPPORTED);
    EXPECT_NE(cut.find("tensor 'blk.0.ffn_down_exps.weight' (Q"), std::string::npos) << cut;
    EXPECT_NE(cut.find("cannot be cut at columns 0..128: not whole blocks of its type"), std::string::npos) << cut;
    EXPECT_NE(refusal("tiny-gpt-oss-mxfp4", {0, 0}, R"({"expert_split":"heads"})", EH_INVALID_ARGUMENT)
                  .find("expert_split"),
              std::string::npos);
}

// One rank splits nothing: "expert_split": "rows" loads the whole model.
TEST(GptTensorParallelLoad, ExpertSplitRowsOnOneRankIsTheWholeModel) {
    REQUIRE_GPT_CUDA();
    const auto plain = teacher_forced("tiny-gpt-oss-mxfp4", {}, nullptr);
    const auto rows = teacher_forced("tiny-gpt-oss-mxfp4", {}, kRows);
    ASSERT_EQ(plain.size(), rows.size());
    for (size_t p = 0; p < plain.size(); ++p) EXPECT_EQ(plain[p], rows[p]) << "position " << p;
}

}  // namespace
