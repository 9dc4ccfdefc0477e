// `convert` on the transformers-made tiny models of tests/reference/data:
// the GGUF it writes, run on the cpu-reference plugin, must give the logits
// transformers recorded (reference.json), within the same tolerance as
// tests/cpu_reference/hf_reference_test.cpp. This checks every layout change
// the converter makes: llama's Q/K permutation, GPT-2's Conv1D transpose,
// gpt-oss's gate/up split, expert transposes and MXFP4 repacking.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <engine_host/quant_blocks.hpp>

#include "eh/loader/plugin_loader.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tools/convert.hpp"
#include "tools_test_util.hpp"

using namespace eh::tools;
using eh::tools::test::TempDir;
namespace fs = std::filesystem;

namespace {

const fs::path kRefDir = fs::path(EH_SOURCE_DIR) / "tests" / "reference" / "data";

struct Reference {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
    double tolerance = 2e-3;
};

Reference read_reference(const fs::path& file) {
    std::ifstream in(file);
    const auto j = nlohmann::json::parse(in);
    Reference r;
    r.tokens = j.at("tokens").get<std::vector<int32_t>>();
    r.logits = j.at("logits").get<std::vector<std::vector<float>>>();
    if (j.contains("tolerance")) r.tolerance = j["tolerance"].get<double>();
    return r;
}

const eh_plugin_api& cpu_plugin() {
    static const eh::PluginRecord rec =
        eh::loader::load_plugin(std::string(EH_PLUGIN_DIR) + "/cpu-reference.manifest.json");
    if (!rec.accepted || !rec.api) throw std::runtime_error("cpu-reference plugin not loadable");
    return *rec.api;
}

// Logits of every position, the tokens fed one at a time (the KV-cache path).
std::vector<std::vector<float>> run_logits(const std::string& model_path, const std::vector<int32_t>& tokens) {
    const eh_plugin_api& api = cpu_plugin();
    auto file = eh::model::ModelFile::open(model_path);
    eh_load_params lp{};
    lp.struct_size = sizeof(lp);
    lp.path = model_path.c_str();
    lp.view = &file->view();
    lp.n_threads = 2;
    eh_model* model = nullptr;
    if (api.model_load(&lp, &model) != EH_OK) throw std::runtime_error(std::string("load: ") + api.plugin_last_error());
    eh_session_params sp{};
    sp.struct_size = sizeof(sp);
    sp.n_ctx = 64;
    eh_session* s = nullptr;
    if (api.session_create(model, &sp, &s) != EH_OK) {
        api.model_release(model);
        throw std::runtime_error("session_create failed");
    }
    std::vector<std::vector<float>> out;
    for (int32_t t : tokens) {
        if (api.session_prefill(s, &t, 1) != EH_OK) break;
        const float* l = nullptr;
        uint32_t n = 0;
        if (api.session_logits(s, &l, &n) != EH_OK) break;
        out.emplace_back(l, l + n);
    }
    api.session_release(s);
    api.model_release(model);
    return out;
}

// max |got - want| <= tolerance * max |want|, per position.
void expect_logits(const std::string& model_path, const Reference& ref, const std::string& label) {
    const auto got = run_logits(model_path, ref.tokens);
    ASSERT_EQ(got.size(), ref.logits.size()) << label;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].size(), ref.logits[i].size()) << label << " position " << i;
        float scale = 1e-6f, diff = 0;
        for (size_t k = 0; k < got[i].size(); ++k) {
            scale = std::max(scale, std::fabs(ref.logits[i][k]));
            diff = std::max(diff, std::fabs(got[i][k] - ref.logits[i][k]));
        }
        worst = std::max(worst, double(diff) / scale);
        EXPECT_LE(diff / scale, ref.tolerance) << label << " position " << i;
    }
    std::printf("%s: max relative logit error %.3g (tolerance %.3g)\n", label.c_str(), worst, ref.tolerance);
}

std::string convert_dir(const TempDir& d, const fs::path& hf, const std::string& type) {
    ConvertOptions c;
    c.hf_dir = hf.string();
    c.out = d.file(hf.parent_path().filename().string() + "-" + hf.filename().string() + "-" + type + ".gguf");
    c.target = parse_quant_target(type);
    c.threads = 2;
    convert_hf(c);
    return c.out;
}

}  // namespace

class ConvertReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ConvertReference, ConvertedLogitsMatchTransformers) {
    const fs::path dir = kRefDir / GetParam();
    ASSERT_TRUE(fs::exists(dir / "reference.json")) << dir;
    const Reference ref = read_reference(dir / "reference.json");
    TempDir d;
    // F32 keeps every float weight exact; MXFP4 experts stay MXFP4.
    for (const char* sub : {"hf", "hf_mxfp4"}) {
        if (!fs::exists(dir / sub / "config.json")) continue;
        const std::string out = convert_dir(d, dir / sub, "F32");
        auto f = eh::model::ModelFile::open(out);
        EXPECT_EQ(f->get_string("general.source_format").value_or("gguf"), "gguf");
        expect_logits(out, ref, GetParam() + " " + sub + " -> F32");
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, ConvertReference, ::testing::Values("llama", "qwen2", "phi3", "gpt2", "gpt-oss"),
                         [](const auto& info) {
                             std::string s = info.param;
                             std::replace(s.begin(), s.end(), '-', '_');
                             return s;
                         });

// The gpt-oss file llama.cpp's layout expects: the tensors, shapes and types
// of tests/reference/data/gpt-oss/model.gguf, the same expert values, and its
// hyperparameter keys.
TEST(ConvertGptOss, MatchesTheReferenceGguf) {
    const fs::path dir = kRefDir / "gpt-oss";
    TempDir d;
    auto want = eh::model::ModelFile::open((dir / "model.gguf").string());
    for (const auto& [sub, type] : {std::pair{"hf_mxfp4", "F32"}, std::pair{"hf", "MXFP4_MOE"}}) {
        const std::string out = convert_dir(d, dir / sub, type);
        auto got = eh::model::ModelFile::open(out);
        ASSERT_EQ(got->tensors().size(), want->tensors().size()) << sub;
        for (const eh_tensor& w : want->tensors()) {
            const std::string name(eh::model::to_sv(w.name));
            const eh_tensor* g = got->find_tensor(name);
            ASSERT_NE(g, nullptr) << sub << ": " << name;
            ASSERT_EQ(g->n_dims, w.n_dims) << name;
            for (uint32_t k = 0; k < w.n_dims; ++k) EXPECT_EQ(g->dims[k], w.dims[k]) << name;
            if (w.type != EH_TYPE_MXFP4) continue;
            // the same values (the encodings may differ: a block has more
            // than one scale/code pair for some values)
            ASSERT_EQ(g->type, EH_TYPE_MXFP4) << sub << ": " << name;
            ASSERT_EQ(g->nbytes, w.nbytes) << name;
            const uint64_t n = w.nbytes / 17 * 32;
            std::vector<float> x(n), y(n);
            ehp::quant::dequantize_row(EH_TYPE_MXFP4, g->data, x.data(), n);
            ehp::quant::dequantize_row(EH_TYPE_MXFP4, w.data, y.data(), n);
            EXPECT_EQ(x, y) << sub << ": " << name;
        }
        for (const eh_metadata_kv& kv : want->metadata()) {
            const std::string key(eh::model::to_sv(kv.key));
            if (key.rfind("gpt-oss.", 0) != 0) continue;
            ASSERT_TRUE(got->has(key)) << key;
            if (kv.value.type == EH_VALUE_STRING) EXPECT_EQ(got->get_string(key), want->get_string(key)) << key;
            else EXPECT_NEAR(*got->get_float(key), *want->get_float(key), 1e-6) << key;
        }
        EXPECT_EQ(got->get_string("tokenizer.ggml.model"), "none");  // the tiny models' tokenizer is word-level
    }
}
