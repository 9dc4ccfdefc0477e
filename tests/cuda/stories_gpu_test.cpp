// stories260K (a real trained llama: head dim 8, 172-wide FFN rows, F32)
// on llama-cuda against the CPU reference plugin, through the real path:
// GGUF on disk -> host reader -> plugin loader -> one sequence through the
// engine's batched step. Greedy from the
// prompt "Once upon a time" (the model's own tokenizer, with BOS) for 200
// tokens: the ids must be identical. On a divergence the test names the
// first differing step and both engines' logit gaps there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tokenizer/tokenizer.hpp"
#include "step_seq.hpp"

namespace {

const std::string kStories = std::string(EH_TESTDATA_DIR) + "/models/stories260K.gguf";
constexpr size_t kSteps = 200;

struct Greedy {
    std::vector<int32_t> ids;
    std::vector<std::vector<float>> logits;  // logits[i] chose ids[i]
};

const eh::PluginRecord* find(const eh::Registry& reg, const std::string& name) {
    for (const auto* r : reg.accepted())
        if (r->caps.name == name) return r;
    return nullptr;
}

Greedy greedy(const eh::PluginRecord& plugin, const eh::model::ModelFile& file, const std::vector<int32_t>& prompt) {
    auto model = eh::EngineModel::load(plugin.api, file.path(), &file.view(), nullptr, {});
    // (greedy sampling)
    ehtest::StepSeq s(&model->api(), model->raw(), ehtest::one_seq(uint32_t(prompt.size() + kSteps + 8)));
    Greedy r;
    EXPECT_TRUE(s.ok()) << s.failure;
    int32_t t = -1;
    if (!s.ok() || s.prefill(prompt, &t) != EH_OK) {
        ADD_FAILURE() << plugin.caps.name << ": " << s.error();
        return r;
    }
    for (;;) {
        r.logits.push_back(s.logits());
        r.ids.push_back(t);
        if (r.ids.size() == kSteps) break;
        if (s.decode(t, &t) != EH_OK) {
            ADD_FAILURE() << plugin.caps.name << ": " << s.error();
            break;
        }
    }
    return r;
}

size_t argmax(const std::vector<float>& v) { return size_t(std::max_element(v.begin(), v.end()) - v.begin()); }

// Top-1 minus top-2 of one logit vector.
float margin(const std::vector<float>& v) {
    std::vector<float> s = v;
    std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
    return s[0] - s[1];
}

TEST(Stories260KGpu, GreedyIdsIdenticalToCpuReferenceFor200Tokens) {
    if (!std::filesystem::exists(kStories)) GTEST_SKIP() << "missing " << kStories;
    static const eh::Registry reg = eh::loader::discover_plugins(EH_PLUGIN_DIR);
    const auto* gpu = find(reg, "llama-cuda");
    const auto* cpu = find(reg, "cpu-reference");
    ASSERT_NE(cpu, nullptr);

    auto file = eh::model::ModelFile::open(kStories);
    auto tok = eh::tokenizer::Tokenizer::from_view(file->view());
    const std::vector<int32_t> prompt = tok->encode("Once upon a time", true, false);
    // BOS, "▁Once", "▁upon", "▁a", "▁time" (see cpu_reference/real_model_test).
    ASSERT_EQ(prompt, (std::vector<int32_t>{1, 403, 407, 261, 378}));

    const Greedy want = greedy(*cpu, *file, prompt);
    ASSERT_EQ(want.ids.size(), kSteps);
    if (!gpu) GTEST_SKIP() << "llama-cuda is not accepted here (no GPU?)";
    const Greedy got = greedy(*gpu, *file, prompt);
    ASSERT_EQ(want.ids.size(), kSteps);
    ASSERT_EQ(got.ids.size(), kSteps);

    float min_margin = 1e30f;
    size_t min_at = 0;
    double max_err = 0;
    for (size_t i = 0; i < kSteps; ++i) {
        if (got.ids[i] != want.ids[i]) break;
        const float mg = margin(want.logits[i]);
        if (mg < min_margin) { min_margin = mg; min_at = i; }
        for (size_t k = 0; k < want.logits[i].size(); ++k)
            max_err = std::max(max_err, double(std::fabs(got.logits[i][k] - want.logits[i][k])));
    }
    std::printf("[stories] GPU text: \"Once upon a time%s\"\n", tok->decode(got.ids).c_str());
    std::printf("[stories] smallest CPU top-1 margin on the agreeing prefix: %.4f at step %zu; largest |logit diff| %.3g\n",
                double(min_margin), min_at, max_err);

    for (size_t i = 0; i < kSteps; ++i) {
        if (got.ids[i] == want.ids[i]) continue;
        const auto& c = want.logits[i];
        const auto& g = got.logits[i];
        const size_t ci = size_t(want.ids[i]), gi = size_t(got.ids[i]);
        ADD_FAILURE() << "first divergence at step " << i << ": cpu-reference " << ci << ", llama-cuda " << gi
                      << "; cpu logits " << c[ci] << " vs " << c[gi] << " (gap " << c[ci] - c[gi] << ")"
                      << "; gpu logits " << g[gi] << " vs " << g[ci] << " (gap " << g[gi] - g[ci] << ")"
                      << "; argmax check cpu " << argmax(c) << " gpu " << argmax(g);
        break;
    }
    EXPECT_EQ(got.ids, want.ids);
}

}  // namespace
