// llama-cuda against Hugging Face transformers: the logits recorded by
// tests/reference/make_reference.py for every llama-family architecture
// (llama, qwen2, phi3, and llama3 = Llama 3.x rope_freqs, mistral = own
// head_dim, qwen3 = QK-norm, gemma3 = window 4 of 12 tokens on alternate
// layers with their own RoPE base, linear x8 on the others, pre/post norms
// stored as w in the HF directory and 1 + w in the GGUF, GeLU-tanh MLP,
// scaled embedding, soft-cap 5), from the GGUF file and from the HF directory
// (the host's safetensors view). Teacher-forced: the first token through
// prefill, the rest through the decode graph. Each position: max |cuda - HF|
// <= 2e-2 x max |HF| (FP16 KV cache, reordered sums) and the same top-1
// wherever HF's top two are further apart than that.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <simdjson.h>

#include <eh/model/model_file.hpp>

#include "plugin_handle.hpp"
#include "plugin_positions.hpp"

namespace {

namespace fs = std::filesystem;

bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void compare(const eh_model_view& view, const std::vector<int32_t>& toks,
             const std::vector<std::vector<float>>& want, const std::string& label) {
    constexpr double kTol = 2e-2;
    const auto got = ehtest::run_positions(ehtest::llama_cuda_api(), &view, toks, 64);
    ASSERT_EQ(got.size(), want.size()) << label;
    double worst = 0;
    for (size_t t = 0; t < want.size(); ++t) {
        ASSERT_EQ(got[t].size(), want[t].size()) << label;
        double mx = 1e-6, err = 0;
        for (size_t i = 0; i < want[t].size(); ++i) {
            mx = std::max(mx, double(std::fabs(want[t][i])));
            err = std::max(err, double(std::fabs(got[t][i] - want[t][i])));
        }
        worst = std::max(worst, err / mx);
        EXPECT_LE(err / mx, kTol) << label << " position " << t;
        std::vector<float> sorted = want[t];
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        const auto top = [](const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
        if (sorted[0] - sorted[1] > kTol * mx) {
            EXPECT_EQ(top(got[t]), top(want[t])) << label << " top-1 at " << t;
        }
    }
    std::printf("%s: max relative logit error %.3g over %zu positions\n", label.c_str(), worst, want.size());
}

class LlamaCudaVsTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCudaVsTransformers, GgufAndHfDirectory) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    ASSERT_NE(ehtest::llama_cuda_api(), nullptr) << "llama-cuda plugin not loadable";
    const fs::path dir = fs::path(EH_REFERENCE_DIR) / GetParam();
    ASSERT_TRUE(fs::exists(dir / "reference.json")) << dir;
    simdjson::dom::parser parser;
    simdjson::dom::element doc = parser.load((dir / "reference.json").string());
    std::vector<int32_t> toks;
    for (auto v : simdjson::dom::array(doc["tokens"])) toks.push_back(int32_t(int64_t(v)));
    std::vector<std::vector<float>> want;
    for (auto row : simdjson::dom::array(doc["logits"])) {
        want.emplace_back();
        for (auto x : simdjson::dom::array(row)) want.back().push_back(float(double(x)));
    }
    auto gguf = eh::model::ModelFile::open((dir / "model.gguf").string());
    compare(gguf->view(), toks, want, GetParam() + " (model.gguf)");
    auto hf = eh::model::ModelFile::open((dir / "hf").string());
    compare(hf->view(), toks, want, GetParam() + " (hf/)");
}

INSTANTIATE_TEST_SUITE_P(Transformers, LlamaCudaVsTransformers,
                         ::testing::Values("llama", "qwen2", "phi3", "llama3", "mistral", "qwen3", "gemma3"));

}  // namespace
