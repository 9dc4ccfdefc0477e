// The converter, given an HF directory holding exactly the forge's values,
// must write the same tensors (names, types, shapes, bytes) as the forge.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "eh/model/model_file.hpp"
#include "eh/tools/convert.hpp"
#include "eh/tools/forge.hpp"
#include "eh/tools/profiles.hpp"
#include "eh/tools/safetensors.hpp"
#include "eh/error.hpp"
#include "tools_test_util.hpp"

using namespace eh::tools;
using eh::tools::test::TempDir;
namespace fs = std::filesystem;

namespace {

// GGUF name -> HF name for qwen2
std::string hf_name(const std::string& g) {
    static const std::pair<const char*, const char*> map[] = {
        {"attn_norm.weight", "input_layernorm.weight"}, {"attn_q.", "self_attn.q_proj."},
        {"attn_k.", "self_attn.k_proj."}, {"attn_v.", "self_attn.v_proj."},
        {"attn_output.weight", "self_attn.o_proj.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"ffn_gate.", "mlp.gate_proj."}, {"ffn_up.", "mlp.up_proj."}, {"ffn_down.", "mlp.down_proj."},
    };
    if (g == "token_embd.weight") return "model.embed_tokens.weight";
    if (g == "output_norm.weight") return "model.norm.weight";
    std::smatch m;
    static const std::regex re(R"(blk\.(\d+)\.(.*))");
    if (!std::regex_match(g, m, re)) return g;
    std::string rest = m[2];
    for (auto [from, to] : map)
        if (rest.rfind(from, 0) == 0) { rest = to + rest.substr(std::strlen(from)); break; }
    return "model.layers." + std::string(m[1]) + "." + rest;
}

}  // namespace

TEST(Convert, Qwen2DirectoryEqualsTheForgedFile) {
    TempDir d;
    const uint64_t seed = 11;
    auto p = find_profile("tiny-qwen2.5-q4_k_m");
    ForgeOptions f{p.name, d.file("forged.gguf"), seed, "", 2, {}};
    forge(f);

    // an HF directory with the same values, in HF shapes
    const fs::path hf = d.path / "hf";
    fs::create_directories(hf);
    fs::copy_file(test::testdata("tokenizers/qwen2.5/tokenizer.json"), hf / "tokenizer.json");
    fs::copy_file(test::testdata("tokenizers/qwen2.5/tokenizer_config.json"), hf / "tokenizer_config.json");
    const auto& s = p.shape;
    nlohmann::json cfg = {
        {"model_type", "qwen2"}, {"num_hidden_layers", s.n_layer}, {"hidden_size", s.n_embd},
        {"intermediate_size", s.n_ff}, {"num_attention_heads", s.n_head}, {"num_key_value_heads", s.n_head_kv},
        {"max_position_embeddings", s.n_ctx}, {"rope_theta", 1000000.0}, {"rms_norm_eps", 1e-6},
        {"vocab_size", p.n_vocab}, {"tie_word_embeddings", true}, {"bos_token_id", 151643},
        {"eos_token_id", 151645}, {"pad_token_id", 151643},
    };
    std::ofstream(hf / "config.json") << cfg.dump(2);
    std::vector<std::pair<std::string, std::pair<std::vector<uint64_t>, std::vector<float>>>> st;
    for (const auto& t : p.tensors(p.n_vocab)) {
        uint64_t n = 1;
        for (auto x : t.dims) n *= x;
        std::vector<float> v(n);
        synth_values(tensor_seed(seed, t.name), 0, n, t.scale, t.init == Init::Ones ? 1.0f : 0.0f, v.data());
        st.push_back({hf_name(t.name), {std::vector<uint64_t>(t.dims.rbegin(), t.dims.rend()), std::move(v)}});
    }
    write_safetensors_f32((hf / "model.safetensors").string(), st);

    ConvertOptions c;
    c.hf_dir = hf.string();
    c.out = d.file("converted.gguf");
    c.target = parse_quant_target("Q4_K_M");
    c.threads = 2;
    auto r = convert_hf(c);
    EXPECT_EQ(r.architecture, "qwen2");

    auto a = eh::model::ModelFile::open(f.out);
    auto b = eh::model::ModelFile::open(c.out);
    ASSERT_EQ(a->tensors().size(), b->tensors().size());
    for (size_t i = 0; i < a->tensors().size(); ++i) {
        const eh_tensor& x = a->tensors()[i];
        const eh_tensor* y = b->find_tensor(eh::model::to_sv(x.name));
        ASSERT_NE(y, nullptr) << eh::model::to_sv(x.name);
        EXPECT_EQ(x.type, y->type) << eh::model::to_sv(x.name);
        ASSERT_EQ(x.nbytes, y->nbytes) << eh::model::to_sv(x.name);
        EXPECT_EQ(0, std::memcmp(x.data, y->data, x.nbytes)) << eh::model::to_sv(x.name);
    }
    for (const auto& [k, v] : p.metadata) {
        if (k.rfind("qwen2.", 0) == 0) {
            EXPECT_TRUE(b->has(k)) << k;
        }
    }
    EXPECT_EQ(b->get_uint("qwen2.block_count"), s.n_layer);
    EXPECT_EQ(b->get_string_array("tokenizer.ggml.tokens").size(), p.n_vocab);
    EXPECT_EQ(b->get_string_array("tokenizer.ggml.merges").size(), a->get_string_array("tokenizer.ggml.merges").size());
    EXPECT_EQ(b->get_uint("tokenizer.ggml.eos_token_id"), 151645u);
}

TEST(Convert, RejectsUnsupportedAndMalformed) {
    TempDir d;
    std::ofstream(d.path / "config.json") << R"({"model_type": "mamba"})";
    EXPECT_THROW(convert_hf({d.path.string(), d.file("o.gguf"), parse_quant_target("F16"), 1, {}}), eh::Error);
    std::ofstream(d.path / "config.json") << R"({"model_type": "qwen2")";
    EXPECT_THROW(convert_hf({d.path.string(), d.file("o.gguf"), parse_quant_target("F16"), 1, {}}), eh::Error);
}

// A temp directory holding the llama3 test model's weights and tokenizer;
// returns its config.json for the caller to edit and write.
static std::string llama3_dir_without_config(const TempDir& d) {
    const fs::path src = fs::path(EH_SOURCE_DIR) / "tests/reference/data/llama3/hf";
    for (const char* f : {"model.safetensors", "tokenizer.json"}) fs::copy_file(src / f, d.path / f);
    std::ifstream in(src / "config.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// A config key of the wrong JSON type is the request's error (InvalidRequest,
// naming the file), not an internal one.
TEST(Convert, AConfigKeyOfTheWrongTypeIsNamedAsTheCallersError) {
    TempDir d;
    std::string config = llama3_dir_without_config(d);
    struct Edit {
        std::string from, to, why;
    };
    const Edit edits[] = {
        {"\"rope_type\": \"llama3\"", "\"rope_type\": 3", "config.json': a key has the wrong type"},
        {"\"model_type\": \"llama\"", "\"model_type\": [\"llama\"]", "config.json': a key has the wrong type"},
        {"\"factor\": 8.0", "\"factor\": \"8\"", "config.json': key 'factor' must be a number, not \"8\""},
        {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": -2",
         "config.json': key 'num_hidden_layers' must be an integer from 0 to 4294967295, not -2"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": true", "config.json': key 'rms_norm_eps' must be a number, not true"},
    };
    for (const auto& [from, to, why] : edits) {
        eh::tools::test::write_edited_config(d.path, config, from, to);
        if (auto e = eh::tools::test::convert_refusal(d.path, d.file("o.gguf"))) {
            EXPECT_EQ(e->code(), eh::Code::InvalidRequest) << to << ": " << e->what();
            EXPECT_NE(std::string(e->what()).find(why), std::string::npos) << e->what();
        }
    }
}

TEST(Convert, GptOssBlocksWithoutScalesNameTheTensor) {
    TempDir d;
    const fs::path src = fs::path(EH_SOURCE_DIR) / "tests/reference/data/gpt-oss/hf_mxfp4";
    fs::copy_file(src / "config.json", d.path / "config.json");
    fs::copy_file(src / "tokenizer.json", d.path / "tokenizer.json");
    write_safetensors_f32((d.path / "model.safetensors").string(),
                          {{"model.layers.0.mlp.experts.down_proj_blocks", {{4, 64, 2, 16}, std::vector<float>(4 * 64 * 2 * 16)}}});
    try {
        convert_hf({d.path.string(), d.file("o.gguf"), parse_quant_target("F32"), 1, {}});
        FAIL() << "expected an error";
    } catch (const eh::Error& e) {
        EXPECT_NE(std::string(e.what()).find("down_proj_blocks"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("down_proj_scales"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(d.file("o.gguf")));
}

// vocab_size pads the vocabulary, so it must be the embedding's row count: a
// larger one is refused by name before anything is allocated for it.
TEST(Convert, VocabSizeMustBeTheEmbeddingsRowCount) {
    TempDir d;
    eh::tools::test::write_edited_config(d.path, llama3_dir_without_config(d), "\"vocab_size\": 256",
                                         "\"vocab_size\": 4000000000");
    if (auto e = eh::tools::test::convert_refusal(d.path, d.file("o.gguf"))) {
        EXPECT_NE(std::string(e->what()).find("vocab_size 4000000000 is not the row count 256 of 'model.embed_tokens.weight'"),
                  std::string::npos)
            << e->what();
    }
    EXPECT_FALSE(fs::exists(d.file("o.gguf")));
}

// A Qwen3-MoE config over dense weights (found by fuzz_convert_config: the
// dense "ffn_up.weight" once read as an expert with no number) is refused,
// naming the first missing expert tensor.
TEST(Convert, AQwen3MoeConfigOverDenseWeightsIsRefused) {
    TempDir d;
    llama3_dir_without_config(d);
    fs::copy_file(fs::path(EH_SOURCE_DIR) / "tests/tools/fuzz_convert_seeds/qwen3moe.json", d.path / "config.json");
    if (auto e = eh::tools::test::convert_refusal(d.path, d.file("o.gguf"))) {
        EXPECT_NE(std::string(e->what()).find("qwen3moe: layer 0 has no 'blk.0.ffn_gate_exps.weight'"), std::string::npos)
            << e->what();
    }
}
