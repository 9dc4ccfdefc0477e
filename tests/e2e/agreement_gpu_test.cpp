// GPU engines against the CPU reference plugin on forged real-shape models
// (same metadata, tensor names, shapes and quant types as the real files),
// through the real path: GGUF on disk -> host reader -> plugin loader ->
// one sequence through the batched step.
//
// Teacher forcing: both engines see the same 128 token ids, one position at
// a time, and must pick the same greedy next token at >= 99% of positions
// (issues 7 and 8). The models are random-weight, so logits are flat-ish and
// a rare top-1 tie-break difference is expected; 99% leaves room for that.
// The reference keeps its KV cache in FP16 as the GPU plugins' pool does:
// FP16 K/V against FP32 flip near-tied MoE router choices on gpt-oss-20b
// (issue 8: 15 of 128 positions), a difference of cache precision, not of
// the engines' arithmetic, which is what this compares.
//
// EH_FORGED_DIR: folder with already forged <profile>.gguf files (the device
// bench script leaves them there); otherwise the test forges into a temp dir.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tools/forge.hpp"
#include "../cuda/step_seq.hpp"

namespace fs = std::filesystem;

namespace {

struct Case {
    const char* profile;
    const char* gpu_plugin;
};

fs::path forged(const std::string& profile) {
    if (const char* dir = std::getenv("EH_FORGED_DIR")) {
        fs::path p = fs::path(dir) / (profile + ".gguf");
        if (fs::exists(p)) return p;
    }
    fs::path p = fs::temp_directory_path() / ("eh-agreement-" + profile + ".gguf");
    if (!fs::exists(p)) {
        eh::tools::ForgeOptions o;
        o.profile = profile;
        o.out = p.string();
        o.seed = 1;
        eh::tools::forge(o);
    }
    return p;
}

const eh::PluginRecord* find(const eh::Registry& reg, const std::string& name) {
    for (const auto* r : reg.accepted())
        if (r->caps.name == name) return r;
    return nullptr;
}

// Greedy next-token id after each of `tokens`, fed one at a time.
std::vector<int32_t> teacher_forced(const eh::PluginRecord& plugin, const eh::model::ModelFile& file,
                                    const std::vector<int32_t>& tokens) {
    auto model = eh::EngineModel::load(plugin.api, file.path(), &file.view(), nullptr, {});
    // (greedy sampling; the tokens' own logits are not kept)
    ehtest::KvShape kv = ehtest::one_seq(static_cast<uint32_t>(tokens.size() + 8));
    kv.kv_type = EH_TYPE_F16;
    ehtest::StepSeq s(&model->api(), model->raw(), kv);
    s.flags = EH_STEP_SAMPLE;
    std::vector<int32_t> out;
    EXPECT_TRUE(s.ok()) << s.failure;
    for (size_t i = 0; i < tokens.size() && s.ok(); ++i) {
        int32_t next = -1;
        if (s.decode(tokens[i], &next) != EH_OK) {
            ADD_FAILURE() << plugin.caps.name << " at position " << i << ": " << s.error();
            break;
        }
        out.push_back(next);
    }
    return out;
}

class Agreement : public ::testing::TestWithParam<Case> {};

TEST_P(Agreement, TeacherForcedTop1AgreesWithCpuReference) {
    const Case c = GetParam();
    // Once per process: after a CUDA plugin has run here, a new discovery's
    // forked pre-flight could not initialise CUDA (see plugin_loader.hpp).
    static const eh::Registry reg = eh::loader::discover_plugins(EH_PLUGIN_DIR);
    const auto* gpu = find(reg, c.gpu_plugin);
    const auto* cpu = find(reg, "cpu-reference");
    ASSERT_NE(cpu, nullptr);
    if (!gpu) GTEST_SKIP() << c.gpu_plugin << " is not accepted here (no GPU?)";

    auto file = eh::model::ModelFile::open(forged(c.profile).string());
    const eh_value* toks = nullptr;
    for (const auto& kv : std::span(file->view().metadata, file->view().n_metadata))
        if (std::string_view(kv.key.data, kv.key.size) == "tokenizer.ggml.tokens") toks = &kv.value;
    ASSERT_NE(toks, nullptr);
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(toks->count) - 1);
    std::vector<int32_t> tokens(128);
    for (auto& t : tokens) t = pick(rng);

    auto want = teacher_forced(*cpu, *file, tokens);
    auto got = teacher_forced(*gpu, *file, tokens);
    ASSERT_EQ(got.size(), want.size());
    size_t same = 0;
    for (size_t i = 0; i < want.size(); ++i) same += got[i] == want[i];
    double rate = double(same) / double(want.size());
    std::printf("[agreement] %s on %s: %zu/%zu positions (%.1f%%)\n", c.profile, c.gpu_plugin, same, want.size(),
                100 * rate);
    EXPECT_GE(rate, 0.99);
}

INSTANTIATE_TEST_SUITE_P(
    ForgedModels, Agreement,
    ::testing::Values(Case{"qwen2.5-0.5b-instruct-q4_k_m", "llama-cuda"},
                      Case{"phi-3-mini-4k-instruct-q4_k_m", "llama-cuda"},
                      Case{"gpt-oss-20b-mxfp4", "gpt-cuda"}),
    [](const auto& info) {
        std::string n = info.param.profile;
        for (char& ch : n)
            if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
        return n;
    });

}  // namespace
