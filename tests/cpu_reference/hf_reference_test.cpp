// The plugin against Hugging Face transformers: logits recorded by
// tests/reference/make_reference.py (tiny seeded models of every
// architecture, plus stories260K) into tests/reference/data/<name>/.
//
// Checks, for every position of the recorded token sequence (fed one token
// at a time, so the KV cache path is what is compared):
//   - max |plugin - HF| over the vocabulary <= tolerance * max |HF logit|
//     (tolerance from reference.json: 1e-4 when recorded on CPU in float32,
//     2e-3 on GPU);
//   - the same top-1 token (unless HF's top two are within 1e-5 of a tie);
// and the greedy continuation ids are identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include <simdjson.h>

#include <deque>
#include <fstream>
#include <map>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>
#include <eh/model/model_file.hpp>
#include <fmt/format.h>

#include "../model/safetensors_test_files.hpp"
#include "../reference/qwen3moe_hf_dir.hpp"

#include "plugin_handle.hpp"

using namespace cpuref_test;
namespace fs = std::filesystem;

namespace {

struct Reference {
    std::string model_path;
    std::vector<int32_t> tokens, greedy_prompt, greedy_ids;
    std::vector<std::vector<float>> logits;
    double tolerance = 2e-3;
};

std::vector<int32_t> ints(simdjson::dom::array a) {
    std::vector<int32_t> out;
    for (auto v : a) out.push_back(static_cast<int32_t>(int64_t(v)));
    return out;
}

Reference read_reference(const fs::path& dir) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc = parser.load((dir / "reference.json").string());
    Reference r;
    const std::string model{std::string_view(doc["model"])};
    const std::string prefix = "testdata:";
    r.model_path = model.rfind(prefix, 0) == 0 ? std::string(EH_TESTDATA_DIR) + "/" + model.substr(prefix.size())
                                               : (dir / model).string();
    r.tokens = ints(doc["tokens"]);
    r.greedy_prompt = ints(doc["greedy_prompt"]);
    r.greedy_ids = ints(doc["greedy_ids"]);
    for (auto row : simdjson::dom::array(doc["logits"])) {
        std::vector<float> v;
        for (auto x : simdjson::dom::array(row)) v.push_back(static_cast<float>(double(x)));
        r.logits.push_back(std::move(v));
    }
    double tol;
    if (doc["tolerance"].get(tol) == simdjson::SUCCESS) r.tolerance = tol;
    return r;
}

size_t argmax(const std::vector<float>& v) {
    return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

// Feeds the tokens one at a time and compares every position's logits.
void compare_logits(const eh_model_view& view, const Reference& ref, const std::string& label) {
    Loaded run(&view, 64);
    ASSERT_EQ(ref.logits.size(), ref.tokens.size());
    double worst = 0.0;
    for (size_t i = 0; i < ref.tokens.size(); ++i) {
        const std::vector<float> got = run.prefill({ref.tokens[i]});
        const std::vector<float>& want = ref.logits[i];
        ASSERT_EQ(got.size(), want.size()) << label << ": vocab size at position " << i;
        const double scale = std::max(1e-6f, max_abs(want));
        const double rel = max_abs_diff(got, want) / scale;
        worst = std::max(worst, rel);
        EXPECT_LE(rel, ref.tolerance) << label << " position " << i;
        std::vector<float> sorted = want;
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        if (sorted[0] - sorted[1] > 1e-5 * scale) {
            EXPECT_EQ(argmax(got), argmax(want)) << label << " top-1 at position " << i;
        }
    }
    std::printf("%s: max relative logit error %.3g over %zu positions (tolerance %.3g)\n", label.c_str(), worst,
                ref.tokens.size(), ref.tolerance);
}

class HfReference : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReference, LogitsAndGreedyMatchTransformers) {
    const fs::path root(CPUREF_REFERENCE_DIR);
    if (!fs::exists(root))
        GTEST_SKIP() << root.string() << " does not exist yet: run tests/reference/make_reference.py "
                     << "(needs torch + transformers) to record transformers' logits";
    const fs::path dir = root / GetParam();
    // stories260K's entry needs the shared test data where the script runs
    // (--testdata); the tiny random models need nothing.
    if (GetParam() == "stories260K" && !fs::exists(dir / "reference.json"))
        GTEST_SKIP() << (dir / "reference.json").string() << " not recorded yet: run make_reference.py with "
                     << "--testdata pointing at shared/testdata (--only stories260K)";
    ASSERT_TRUE(fs::exists(dir / "reference.json")) << "missing " << (dir / "reference.json").string();
    const Reference ref = read_reference(dir);
    ASSERT_TRUE(fs::exists(ref.model_path)) << ref.model_path;
    auto file = eh::model::ModelFile::open(ref.model_path);
    compare_logits(file->view(), ref, GetParam() + " (" + fs::path(ref.model_path).filename().string() + ")");

    // The same weights as a Hugging Face directory read by the host (names
    // mapped, data as stored): hf/ from save_pretrained, and for gpt-oss
    // hf_mxfp4/ with MXFP4 blocks+scales experts.
    for (const char* sub : {"hf", "hf_mxfp4"}) {
        if (!fs::exists(dir / sub / "config.json")) continue;
        auto hf = eh::model::ModelFile::open((dir / sub).string());
        compare_logits(hf->view(), ref, GetParam() + " (" + sub + "/)");
    }

    // greedy continuation
    Loaded g(&file->view(), 64);
    g.prefill(ref.greedy_prompt);
    const eh_plugin_api& api = plugin();
    std::vector<int32_t> ids;
    int32_t t;
    ASSERT_EQ(api.session_sample(g.session, &t), EH_OK);
    while (ids.size() < ref.greedy_ids.size()) {
        ids.push_back(t);
        ASSERT_EQ(api.session_decode(g.session, t, &t), EH_OK);
    }
    EXPECT_EQ(ids, ref.greedy_ids);
}

// Qwen3-MoE from a Hugging Face directory, in both expert layouts: the same
// logits as transformers recorded (HfReference reads the GGUF of the same
// weights).
TEST(HfReferenceQwen3Moe, PerExpertAndFusedDirectoriesMatchTransformers) {
    const fs::path dir = fs::path(CPUREF_REFERENCE_DIR) / "qwen3moe";
    if (!fs::exists(dir / "reference.json")) GTEST_SKIP() << "no qwen3moe reference recorded";
    const Reference ref = read_reference(dir);
    auto gguf = eh::model::ModelFile::open(ref.model_path);
    const ehp::ModelView v(&gguf->view());
    for (const bool fused : {false, true}) {
        eh::model::testing::TempDir out(fused ? "q3moe_fused" : "q3moe_experts");
        std::deque<std::vector<uint8_t>> keep;
        eh::reference_test::write_qwen3moe_hf_dir(v, out.path, fused, keep);
        auto hf = eh::model::ModelFile::open(out.path.string());
        const ehp::ModelView hv(&hf->view());
        ASSERT_NE(hv.find_tensor(fused ? "blk.0.ffn_gate_up_exps.weight" : "blk.0.ffn_gate.7.weight"), nullptr);
        compare_logits(hf->view(), ref, std::string("qwen3moe (HF dir, ") + (fused ? "fused experts)" : "one tensor per expert)"));
    }
}

// An expert set whose experts differ in type, or with one missing, is
// refused by name.
TEST(HfReferenceQwen3Moe, AMissingOrMistypedExpertIsRefusedByName) {
    const fs::path dir = fs::path(CPUREF_REFERENCE_DIR) / "qwen3moe";
    if (!fs::exists(dir / "reference.json")) GTEST_SKIP() << "no qwen3moe reference recorded";
    auto gguf = eh::model::ModelFile::open(read_reference(dir).model_path);
    const ehp::ModelView v(&gguf->view());
    eh::model::testing::TempDir out("q3moe_missing");
    std::deque<std::vector<uint8_t>> keep;
    eh::reference_test::write_qwen3moe_hf_dir(v, out.path, false, keep);
    // drop expert 5's up_proj of layer 1 by renaming it to a name no rule maps
    const fs::path st = out.path / "model.safetensors";
    std::string bytes;
    {
        std::ifstream in(st, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string from = "model.layers.1.mlp.experts.5.up_proj.weight";
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, from.size(), "model.layers.1.mlp.experts.5.up_proj.weighx");
    {
        std::ofstream o(st, std::ios::binary);
        o << bytes;
    }
    const eh_plugin_api& api = plugin();
    auto refused = [&](const fs::path& d, eh_status want, const std::string& why) {
        auto hf = eh::model::ModelFile::open(d.string());
        eh_model* model = nullptr;
        eh_load_params lp = load_params(&hf->view());
        EXPECT_EQ(api.model_load(&lp, &model), want) << why;
        EXPECT_NE(std::string(api.plugin_last_error()).find(why), std::string::npos) << api.plugin_last_error();
        if (model) api.model_release(model);
    };
    refused(out.path, EH_MODEL_LOAD_FAILED, "missing tensor 'blk.1.ffn_up.5.weight'");

    eh::model::testing::TempDir typed("q3moe_mistyped");
    eh::reference_test::write_qwen3moe_hf_dir(v, typed.path, false, keep, 3);
    refused(typed.path, EH_UNSUPPORTED,
            "tensor 'blk.0.ffn_gate.3.weight' has type F16, expert 0 F32: the experts of a matrix must share a type");
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfReference,
                         ::testing::Values("llama", "qwen2", "phi3", "gpt2", "gpt-oss", "llama3", "mistral", "qwen3", "qwen3moe", "gemma3", "stories260K"),
                         [](const auto& info) {
                             std::string s = info.param;
                             for (auto& c : s) if (c == '-') c = '_';
                             return s;
                         });
