// `convert` on the transformers-made tiny models of tests/reference/data:
// the GGUF it writes, run on the cpu-reference plugin, must give the logits
// transformers recorded (reference.json), within the same tolerance as
// tests/cpu_reference/hf_reference_test.cpp. This checks every layout change
// the converter makes: llama's Q/K permutation, GPT-2's Conv1D transpose,
// gpt-oss's gate/up split, expert transposes and MXFP4 repacking, and
// Qwen3-MoE's experts stacked from both of its HF layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include <engine_host/quant_blocks.hpp>

#include "eh/error.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tools/convert.hpp"
#include "../reference/qwen3moe_hf_dir.hpp"
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

// `got` has `want`'s tensors (names and dims) and its "<arch>." keys;
// `values` compares each pair's contents.
void expect_same_file(const eh::model::ModelFile& got, const eh::model::ModelFile& want, const std::string& arch,
                      const std::string& label,
                      const std::function<void(const eh_tensor& got, const eh_tensor& want, const std::string& label)>& values) {
    ASSERT_EQ(got.tensors().size(), want.tensors().size()) << label;
    for (const eh_tensor& w : want.tensors()) {
        const std::string name(eh::model::to_sv(w.name));
        const eh_tensor* g = got.find_tensor(name);
        ASSERT_NE(g, nullptr) << label << ": " << name;
        ASSERT_EQ(g->n_dims, w.n_dims) << name;
        for (uint32_t k = 0; k < w.n_dims; ++k) EXPECT_EQ(g->dims[k], w.dims[k]) << name;
        values(*g, w, label + ": " + name);
    }
    for (const eh_metadata_kv& kv : want.metadata()) {
        const std::string key(eh::model::to_sv(kv.key));
        if (key.rfind(arch + ".", 0) != 0) continue;
        ASSERT_TRUE(got.has(key)) << key;
        if (kv.value.type == EH_VALUE_STRING) EXPECT_EQ(got.get_string(key), want.get_string(key)) << key;
        else EXPECT_NEAR(*got.get_float(key), *want.get_float(key), 1e-6) << key;
    }
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

INSTANTIATE_TEST_SUITE_P(Archs, ConvertReference,
                         ::testing::Values("llama", "llama3", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "gpt-oss", "gemma3"),
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
        expect_same_file(*got, *want, "gpt-oss", sub, [](const eh_tensor& g, const eh_tensor& w, const std::string& label) {
            if (w.type != EH_TYPE_MXFP4) return;
            // the same values (the encodings may differ: a block has more
            // than one scale/code pair for some values)
            ASSERT_EQ(g.type, EH_TYPE_MXFP4) << label;
            ASSERT_EQ(g.nbytes, w.nbytes) << label;
            const uint64_t n = w.nbytes / 17 * 32;
            std::vector<float> x(n), y(n);
            ehp::quant::dequantize_row(EH_TYPE_MXFP4, g.data, x.data(), n);
            ehp::quant::dequantize_row(EH_TYPE_MXFP4, w.data, y.data(), n);
            EXPECT_EQ(x, y) << label;
        });
        EXPECT_EQ(got->get_string("tokenizer.ggml.model"), "none");  // the tiny models' tokenizer is word-level
    }
}

// Qwen3-MoE written back as an HF directory in both expert layouts (one
// tensor per expert, fused gate_up_proj / down_proj) converts into the file
// llama.cpp's converter wrote for the same weights (the recorded model.gguf:
// its tensors, shapes and F32 values bit for bit, and its qwen3moe.* keys),
// which gives transformers' logits; quantized, the experts are each
// expert's rows quantized as the stacked tensor's rows would be.
TEST(ConvertQwen3Moe, BothExpertLayoutsGiveTheConvertersFile) {
    const fs::path dir = kRefDir / "qwen3moe";
    const Reference ref = read_reference(dir / "reference.json");
    auto want = eh::model::ModelFile::open((dir / "model.gguf").string());
    const ehp::ModelView wv(&want->view());
    TempDir d;
    for (const bool fused : {false, true}) {
        const fs::path hf = fs::path(d.file(fused ? "fused" : "experts")) / "hf";
        fs::create_directories(hf);
        std::deque<std::vector<uint8_t>> keep;
        eh::reference_test::write_qwen3moe_hf_dir(wv, hf, fused, keep);
        const std::string label = fused ? "fused" : "one tensor per expert";
        const std::string out = convert_dir(d, hf, "F32");
        auto got = eh::model::ModelFile::open(out);
        expect_same_file(*got, *want, "qwen3moe", label, [](const eh_tensor& g, const eh_tensor& w, const std::string& l) {
            ASSERT_EQ(g.type, uint32_t(EH_TYPE_F32)) << l;
            ASSERT_EQ(g.nbytes, w.nbytes) << l;
            EXPECT_EQ(std::memcmp(g.data, w.data, w.nbytes), 0) << l;
        });
        expect_logits(out, ref, "qwen3moe " + label + " -> F32");

        // Q8_0: an expert tensor's bytes are each expert's rows quantized
        const std::string q8 = convert_dir(d, hf, "Q8_0");
        auto gq = eh::model::ModelFile::open(q8);
        const eh_tensor* gate = gq->find_tensor("blk.1.ffn_gate_exps.weight");
        const eh_tensor* src = want->find_tensor("blk.1.ffn_gate_exps.weight");
        ASSERT_NE(gate, nullptr);
        ASSERT_EQ(gate->type, uint32_t(EH_TYPE_Q8_0)) << label;
        const uint64_t n = src->dims[0] * src->dims[1] * src->dims[2];
        std::vector<uint8_t> q(ehp::quant::row_bytes(EH_TYPE_Q8_0, n));
        ASSERT_TRUE(ehp::quant::quantize_row(EH_TYPE_Q8_0, static_cast<const float*>(src->data), q.data(), n));
        ASSERT_EQ(gate->nbytes, q.size());
        EXPECT_EQ(std::memcmp(gate->data, q.data(), q.size()), 0) << label;
    }
}

// What the converter refuses in a Qwen3-MoE directory, naming it: a config
// the GGUF layout cannot express, an expert with no tensor.
TEST(ConvertQwen3Moe, RefusesWhatTheLayoutCannotHoldByName) {
    const fs::path dir = kRefDir / "qwen3moe";
    auto want = eh::model::ModelFile::open((dir / "model.gguf").string());
    const ehp::ModelView wv(&want->view());
    TempDir d;
    const fs::path hf = fs::path(d.file("bad")) / "hf";
    fs::create_directories(hf);
    std::deque<std::vector<uint8_t>> keep;
    eh::reference_test::write_qwen3moe_hf_dir(wv, hf, false, keep);
    std::string config;
    {
        std::ifstream in(hf / "config.json");
        config.assign(std::istreambuf_iterator<char>(in), {});
    }
    // the config with one setting changed, refused naming it
    auto expect_refused = [&](const std::string& from, const std::string& to, const std::string& why) {
        eh::tools::test::write_edited_config(hf, config, from, to);
        if (auto e = eh::tools::test::convert_refusal(hf, d.file("o.gguf"))) {
            EXPECT_NE(std::string(e->what()).find(why), std::string::npos) << e->what();
        }
    };
    expect_refused("\"norm_topk_prob\": true", "\"norm_topk_prob\": false",
                   "norm_topk_prob false is not supported by the qwen3moe GGUF layout");
    expect_refused("\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2", "decoder_sparse_step 2");
    expect_refused("\"mlp_only_layers\": []", "\"mlp_only_layers\": [0]", "mlp_only_layers (dense layers)");
    // nine experts in the config, eight in the file
    expect_refused("\"num_experts\": 8", "\"num_experts\": 9", "'blk.0.ffn_down_exps.weight': expert 8 of 9 has no tensor");
}

// Llama 3.x: "rope_type": "llama3" becomes what llama.cpp's converter
// writes, no scaling type and the rope_freqs.weight divisors (the recorded
// model.gguf's values); longrope and llama3 outside llama stay refused.
TEST(ConvertLlama3, RopeFreqsAsTheConverterWritesThem) {
    const fs::path dir = kRefDir / "llama3";
    TempDir d;
    auto want = eh::model::ModelFile::open((dir / "model.gguf").string());
    auto got = eh::model::ModelFile::open(convert_dir(d, dir / "hf", "F32"));
    EXPECT_FALSE(got->has("llama.rope.scaling.type"));
    const eh_tensor* g = got->find_tensor("rope_freqs.weight");
    const eh_tensor* w = want->find_tensor("rope_freqs.weight");
    ASSERT_NE(g, nullptr);
    ASSERT_NE(w, nullptr);
    ASSERT_EQ(g->type, uint32_t(EH_TYPE_F32));
    ASSERT_EQ(g->dims[0], w->dims[0]);
    const auto* gv = static_cast<const float*>(g->data);
    const auto* wv = static_cast<const float*>(w->data);
    bool scaled = false;
    for (uint64_t i = 0; i < w->dims[0]; ++i) {
        EXPECT_NEAR(gv[i], wv[i], 1e-6 * wv[i]) << i;
        scaled = scaled || wv[i] != 1.0f;
    }
    EXPECT_TRUE(scaled) << "the reference's divisors are all 1: the test would not see a missing scaling";

    std::string config;
    {
        std::ifstream in(dir / "hf" / "config.json");
        config.assign(std::istreambuf_iterator<char>(in), {});
    }
    const fs::path hf = fs::path(d.file("longrope")) / "hf";
    fs::create_directories(hf);
    for (const char* f : {"model.safetensors", "tokenizer.json"}) fs::copy_file(dir / "hf" / f, hf / f);
    auto refused = [&](const std::string& from, const std::string& to, const std::string& why) {
        eh::tools::test::write_edited_config(hf, config, from, to);
        if (auto e = eh::tools::test::convert_refusal(hf, d.file("o.gguf"))) {
            EXPECT_NE(std::string(e->what()).find(why), std::string::npos) << e->what();
        }
    };
    refused("\"llama3\"", "\"longrope\"", "rope type 'longrope' is not supported");
    refused("\"high_freq_factor\": 4.0", "\"high_freq_factor\": 1.0", "llama3 rope parameters out of range");
}

// Gemma 3: the converted file holds what make_reference.py's GGUF (written
// as llama.cpp's converter writes gemma3) holds, value for value: every norm
// as 1 + w, the tied head left out. Its keys add what the transformers 5
// config says and llama.cpp's converter drops: the per-layer pattern and the
// attention scale (query_pre_attn_scalar 32).
TEST(ConvertGemma3, TensorsAsTheReferenceGgufAndTheConfigsKeys) {
    const fs::path dir = kRefDir / "gemma3";
    TempDir d;
    auto got = eh::model::ModelFile::open(convert_dir(d, dir / "hf", "F32"));
    auto want = eh::model::ModelFile::open((dir / "model.gguf").string());
    ASSERT_EQ(got->tensors().size(), want->tensors().size());
    EXPECT_EQ(got->find_tensor("output.weight"), nullptr);
    for (const eh_tensor& w : want->tensors()) {
        const std::string name(eh::model::to_sv(w.name));
        const eh_tensor* g = got->find_tensor(name);
        ASSERT_NE(g, nullptr) << name;
        ASSERT_EQ(g->type, uint32_t(EH_TYPE_F32)) << name;
        ASSERT_EQ(g->nbytes, w.nbytes) << name;
        EXPECT_EQ(std::memcmp(g->data, w.data, w.nbytes), 0) << name;
    }
    EXPECT_NEAR(*got->get_float("gemma3.rope.freq_base"), 1e6, 1e-3);
    EXPECT_NEAR(*got->get_float("gemma3.rope.freq_base_swa"), 1e4, 1e-3);
    EXPECT_EQ(got->get_string("gemma3.rope.scaling.type"), "linear");
    EXPECT_NEAR(*got->get_float("gemma3.rope.scaling.factor"), 8.0, 1e-6);
    EXPECT_NEAR(*got->get_float("gemma3.final_logit_softcapping"), 5.0, 1e-6);
    EXPECT_NEAR(*got->get_float("gemma3.attention.scale"), 1.0 / std::sqrt(32.0), 1e-7);
    const eh_value* pattern = got->find("gemma3.attention.sliding_window_pattern");
    ASSERT_NE(pattern, nullptr);
    ASSERT_EQ(pattern->type, uint32_t(EH_VALUE_ARRAY));
    ASSERT_EQ(pattern->elem_type, uint32_t(EH_VALUE_BOOL));
    ASSERT_EQ(pattern->count, 4u);
    const auto* b = static_cast<const uint8_t*>(pattern->v.array);
    EXPECT_EQ(std::vector<uint8_t>(b, b + 4), (std::vector<uint8_t>{1, 0, 1, 0}));
}

// Gemma3ForConditionalGeneration: the same decoder under language_model.*
// names with its settings in text_config, beside a vision tower the
// converter leaves out, converts to the same tensors.
TEST(ConvertGemma3, ConditionalGenerationFormGivesTheSameFile) {
    using eh::model::testing::StTensor;
    const fs::path src = kRefDir / "gemma3" / "hf";
    auto hf = eh::model::ModelFile::open(src.string());
    const std::map<std::string, std::string> names = {
        {"attn_norm.weight", "input_layernorm.weight"},          {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_k.weight", "self_attn.k_proj.weight"},            {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_output.weight", "self_attn.o_proj.weight"},       {"attn_q_norm.weight", "self_attn.q_norm.weight"},
        {"attn_k_norm.weight", "self_attn.k_norm.weight"},       {"post_attention_norm.weight", "post_attention_layernorm.weight"},
        {"ffn_norm.weight", "pre_feedforward_layernorm.weight"}, {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
        {"ffn_gate.weight", "mlp.gate_proj.weight"},             {"ffn_up.weight", "mlp.up_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"}};
    std::vector<StTensor> tensors;
    std::vector<const void*> data;
    for (const eh_tensor& t : hf->tensors()) {
        const std::string g(eh::model::to_sv(t.name));
        std::string name;
        if (g == "token_embd.weight") name = "language_model.model.embed_tokens.weight";
        else if (g == "output_norm.weight") name = "language_model.model.norm.weight";
        else {
            ASSERT_EQ(g.rfind("blk.", 0), 0u) << g;
            const size_t dot = g.find('.', 4);
            auto it = names.find(g.substr(dot + 1));
            ASSERT_NE(it, names.end()) << g;
            name = "language_model.model.layers." + g.substr(4, dot - 4) + "." + it->second;
        }
        ASSERT_EQ(t.type, uint32_t(EH_TYPE_F32)) << g;
        std::vector<uint64_t> shape;
        for (uint32_t k = t.n_dims; k-- > 0;) shape.push_back(t.dims[k]);
        tensors.push_back({name, "F32", shape});
        data.push_back(t.data);
    }
    const std::vector<float> vision(8, 0.25f);
    tensors.push_back({"vision_tower.vision_model.post_layernorm.weight", "F32", {8}});
    data.push_back(vision.data());
    TempDir d;
    const fs::path nested = fs::path(d.file("nested"));
    fs::create_directories(nested);
    eh::model::testing::write_st_data(nested / "model.safetensors", tensors, data);
    fs::copy_file(src / "tokenizer.json", nested / "tokenizer.json");
    std::ifstream in(src / "config.json");
    nlohmann::json text = nlohmann::json::parse(in);
    nlohmann::json cfg = {{"model_type", "gemma3"},
                          {"architectures", {"Gemma3ForConditionalGeneration"}},
                          {"eos_token_id", text["eos_token_id"]},
                          {"text_config", text},
                          {"vision_config", {{"model_type", "siglip_vision_model"}}}};
    cfg["text_config"].erase("eos_token_id");
    eh::model::testing::write_text(nested / "config.json", cfg.dump());

    auto plain = eh::model::ModelFile::open(convert_dir(d, src, "F32"));
    auto got = eh::model::ModelFile::open(convert_dir(d, nested, "F32"));
    ASSERT_EQ(got->tensors().size(), plain->tensors().size());
    for (const eh_tensor& w : plain->tensors()) {
        const std::string name(eh::model::to_sv(w.name));
        const eh_tensor* g = got->find_tensor(name);
        ASSERT_NE(g, nullptr) << name;
        ASSERT_EQ(g->nbytes, w.nbytes) << name;
        EXPECT_EQ(std::memcmp(g->data, w.data, w.nbytes), 0) << name;
    }
    for (const char* k : {"gemma3.attention.scale", "gemma3.rope.freq_base_swa", "gemma3.attention.sliding_window",
                          "gemma3.final_logit_softcapping", "tokenizer.ggml.eos_token_id"})
        EXPECT_EQ(got->get_float(k), plain->get_float(k)) << k;
}
