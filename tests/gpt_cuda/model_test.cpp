// Whole models through the plugin ABI: gpt-cuda's logits against the CPU
// reference plugin (itself checked against transformers) loaded in the same
// process, on the transformers-checked tiny gpt2 / gpt-oss / qwen3moe files
// (qwen3moe's F32 experts take the float expert kernels) and on
// forged tiny profiles (MXFP4 experts, F16 and Q8_0 GPT-2, Qwen3-MoE with
// Q4_K_M experts, QK-norm and the plain SwiGLU). One sequence through the
// batched step: a multi-token prompt step and graph-replayed one-token
// decode steps are both compared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>

#include <cuda_runtime_api.h>

#include <eh/model/model_file.hpp>
#include <eh/tools/forge.hpp>
#include <ehcuda/model_matrices.hpp>
#include <ehcuda/options.hpp>

#include "compare.hpp"
#include "plugins.hpp"

namespace fs = std::filesystem;
using namespace gpttest;

namespace {

constexpr double kTol = 1e-2;  // of the largest |logit|: the FP16 KV pool vs the reference's FP32

class GptModels : public ::testing::TestWithParam<std::string> {};

TEST_P(GptModels, LogitsMatchCpuReference) {
    if (!plugin_gpu_usable()) GTEST_SKIP() << "no usable CUDA device";
    ASSERT_NE(cpu_api(), nullptr) << "cpu-reference plugin not loadable";
    const std::string path = model_path(GetParam());
    ASSERT_TRUE(fs::exists(path)) << path;
    auto file = eh::model::ModelFile::open(path);
    Engine cpu(cpu_api(), &file->view(), 64), gpu(gpu_api(), &file->view(), 64);
    ASSERT_TRUE(cpu.ok()) << cpu.failure;
    ASSERT_TRUE(gpu.ok()) << gpu.failure;

    eh_model_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(gpu.api->model_get_info(gpu.model, &info), EH_OK);
    eh_model_info cinfo{};
    cinfo.struct_size = sizeof cinfo;
    ASSERT_EQ(cpu.api->model_get_info(cpu.model, &cinfo), EH_OK);
    EXPECT_STREQ(info.quant_kind, cinfo.quant_kind);
    EXPECT_EQ(info.vocab_size, cinfo.vocab_size);
    EXPECT_GT(info.device_bytes_used, 0u);
    int32_t resident = 0;
    EXPECT_EQ(gpu.api->model_check_residency(gpu.model, &resident), EH_OK);
    EXPECT_EQ(resident, 1);

    std::mt19937 rng(42);
    std::vector<int32_t> toks(40);
    for (auto& t : toks) t = int32_t(rng() % info.vocab_size);
    double worst = 0;
    // a 9-token prompt step (the multi-token path), then one token a step
    const std::vector<int32_t> head(toks.begin(), toks.begin() + 9);
    auto g = gpu.prefill(head), c = cpu.prefill(head);
    worst = std::max(worst, rel_err(g, c));
    EXPECT_LT(rel_err(g, c), kTol) << "batched prefill";
    EXPECT_TRUE(top1_ok(g, c, kTol)) << "batched prefill";
    for (size_t i = 9; i < toks.size(); ++i) {
        c = cpu.prefill({toks[i]});
        g = gpu.decode(toks[i]);
        worst = std::max(worst, rel_err(g, c));
        EXPECT_LT(rel_err(g, c), kTol) << "position " << i;
        EXPECT_TRUE(top1_ok(g, c, kTol)) << "top-1 at position " << i;
    }
    // the whole sequence in one prompt step gives the same last logits
    Engine again(gpu_api(), &file->view(), 64);
    ASSERT_TRUE(again.ok()) << again.failure;
    EXPECT_LT(rel_err(again.prefill(toks), g), kTol);
    std::printf("%s: quant %s, max relative logit error vs cpu-reference %.3g over %zu positions, %.1f MiB on the GPU\n",
                GetParam().c_str(), info.quant_kind, worst, toks.size() - 8, double(info.device_bytes_used) / (1 << 20));
}

// The load's log lists the routes of gpt_matrices' list, the one `engine-host
// inspect --kernels` prints: with the plugin's own verdicts on its experts
// (moe_decode_supported, ...), the same lines as inspect's from the types
// and shapes.
TEST_P(GptModels, LoadLogsTheRoutesInspectPrints) {
    if (!plugin_gpu_usable()) GTEST_SKIP() << "no usable CUDA device";
    const std::string path = model_path(GetParam());
    ASSERT_TRUE(fs::exists(path)) << path;
    auto file = eh::model::ModelFile::open(path);
    std::vector<std::string> stages;
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = "routes";
    lp.view = &file->view();
    lp.progress = [](void* u, float, const char* stage) {
        static_cast<std::vector<std::string>*>(u)->push_back(stage ? stage : "");
    };
    lp.progress_user = &stages;
    eh_model* m = nullptr;
    ASSERT_EQ(gpu_api()->model_load(&lp, &m), EH_OK) << gpu_api()->plugin_last_error();
    gpu_api()->model_release(m);
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    const ehcuda::DeviceTraits dev{prop.major, prop.minor, prop.multiProcessorCount};
    const ehcuda::KernelPlan p = ehcuda::load_plan(dev, true, ehcuda::Options(nullptr));
    const ehp::ModelView view(&file->view());
    const std::vector<std::string> lines = ehcuda::step_route_lines(p, dev, ehcuda::gpt_matrices(view, p, {}), 1, false);
    ASSERT_GE(lines.size(), 5u);
    for (const std::string& line : lines) EXPECT_EQ(std::count(stages.begin(), stages.end(), line), 1) << line;
    for (const char* kind : {"attn_qkv x", "attn_output x", "output x"})
        EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.rfind(kind, 0) == 0; }))
            << kind;
}

INSTANTIATE_TEST_SUITE_P(Tiny, GptModels,
                         ::testing::Values("gpt2", "gpt-oss", "tiny-gpt-oss-mxfp4", "tiny-gpt2-f16", "tiny-gpt2-q8_0",
                                           "qwen3moe", "tiny-qwen3-moe-q4_k_m"),
                         [](const auto& info) {
                             std::string s = info.param;
                             for (auto& ch : s) if (ch == '-') ch = '_';
                             return s;
                         });

TEST(GptCuda, DecodeIsDeterministicAndMatchesGreedy) {
    if (!plugin_gpu_usable()) GTEST_SKIP() << "no usable CUDA device";
    auto file = eh::model::ModelFile::open(model_path("gpt-oss"));
    std::vector<int32_t> runs[2];
    for (auto& ids : runs) {
        Engine gpu(gpu_api(), &file->view(), 64);
        ASSERT_TRUE(gpu.ok()) << gpu.failure;
        int32_t t = -1;
        const auto l0 = gpu.prefill({1, 17, 93, 4}, &t);
        EXPECT_EQ(size_t(t), argmax(l0)) << "greedy sample is the argmax after the prompt";
        for (int i = 0; i < 20; ++i) {
            ids.push_back(t);
            const auto l = gpu.decode(t, &t);
            EXPECT_EQ(size_t(t), argmax(l)) << "greedy sample is the argmax at step " << i;
        }
    }
    EXPECT_EQ(runs[0], runs[1]);
}

TEST(GptCuda, Gpt2ContextIsCappedAtLearnedPositions) {
    if (!plugin_gpu_usable()) GTEST_SKIP() << "no usable CUDA device";
    auto file = eh::model::ModelFile::open(model_path("gpt2"));  // 64 positions
    Engine gpu(gpu_api(), &file->view(), 1000);
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    EXPECT_EQ(gpu.kv.max_seq_tokens, 64u) << "kv_init grants no more than the learned positions";
    std::vector<int32_t> toks(64, 5);
    EXPECT_EQ(gpu.StepSeq::prefill(toks), EH_OK) << gpu.error();
    EXPECT_EQ(gpu.StepSeq::decode(5), EH_INVALID_ARGUMENT);
    EXPECT_NE(gpu.error().find("exceeds max_seq_tokens 64"), std::string::npos) << gpu.error();
}

TEST(GptCuda, RejectsOtherArchitectures) {
    if (!gpu_api()) GTEST_SKIP() << "plugin not loadable";
    auto file = eh::model::ModelFile::open(forged("tiny-qwen2.5-q4_k_m"));
    Engine gpu(gpu_api(), &file->view(), 16);
    EXPECT_EQ(gpu.status, plugin_gpu_usable() ? EH_UNSUPPORTED : gpu.status);
}

}  // namespace
