// Hugging Face directories: the real configs from ../shared/testdata with tiny
// safetensors files written here, name translation, and malformed inputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <engine_host/model_source.hpp>
#include <engine_host/mrope.hpp>
#include <engine_host/plugin_abi.hpp>
#include <engine_host/tensor_types.h>
#include <simdjson.h>

#include "eh/error.hpp"
#include "eh/model/hf_names.hpp"
#include "eh/model/model_file.hpp"
#include "safetensors_test_files.hpp"

namespace fs = std::filesystem;
using eh::model::ModelFile;
using eh::model::to_sv;
using namespace eh::model::testing;

namespace {

// Each HF tensor name of `arch` (first) translates to its GGUF name (second).
void expect_gguf_names(const std::string& arch, std::initializer_list<std::pair<const char*, const char*>> names) {
    for (const auto& [hf, gguf] : names) EXPECT_EQ(eh::model::hf_tensor_name_to_gguf(arch, hf), gguf) << hf;
}

// Each key's unsigned value in f (require_uint).
void expect_uints(const ModelFile& f, std::initializer_list<std::pair<const char*, uint64_t>> want) {
    for (const auto& [key, value] : want) EXPECT_EQ(f.require_uint(key), value) << key;
}

fs::path config_dir(const char* name) { return fs::path(EH_TESTDATA_DIR) / "configs" / name; }

void expect_error(const fs::path& p, const std::string& needle) {
    try {
        ModelFile::open(p.string());
        ADD_FAILURE() << "opened; expected error containing: " << needle;
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), eh::Code::ModelLoadFailed);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

// A directory with the given config.json, a tokenizer.json and one model.safetensors.
void make_single(const TempDir& d, const fs::path& config, const std::vector<StTensor>& tensors) {
    fs::copy_file(config, d.path / "config.json");
    write_text(d.path / "tokenizer.json", "{}");
    write_st(d.path / "model.safetensors", tensors);
}

const std::vector<StTensor> kLlamaLike = {
    {"model.embed_tokens.weight", "BF16", {16, 8}},
    {"model.layers.0.input_layernorm.weight", "BF16", {8}},
    {"model.layers.0.self_attn.q_proj.weight", "BF16", {8, 8}},
    {"model.layers.0.self_attn.q_proj.bias", "BF16", {8}},
    {"model.layers.0.self_attn.k_proj.weight", "BF16", {4, 8}},
    {"model.layers.0.self_attn.v_proj.weight", "BF16", {4, 8}},
    {"model.layers.0.self_attn.o_proj.weight", "BF16", {8, 8}},
    {"model.layers.0.post_attention_layernorm.weight", "BF16", {8}},
    {"model.layers.0.mlp.gate_proj.weight", "BF16", {12, 8}},
    {"model.layers.0.mlp.up_proj.weight", "BF16", {12, 8}},
    {"model.layers.0.mlp.down_proj.weight", "F32", {8, 12}},
    {"model.norm.weight", "F16", {8}},
    {"model.rotary_emb.inv_freq", "F32", {4}},
};

TEST(HfDirectory, Qwen2) {
    TempDir d("qwen2");
    make_single(d, config_dir("qwen2.5-0.5b-instruct") / "config.json", kLlamaLike);
    auto f = ModelFile::open(d.path.string());
    EXPECT_EQ(f->format_name(), "safetensors");
    EXPECT_EQ(f->view().format, uint32_t(EH_FORMAT_SAFETENSORS));
    EXPECT_EQ(f->architecture(), "qwen2");
    EXPECT_EQ(f->require_string("general.source_format"), "safetensors");
    expect_uints(*f, {
        {"qwen2.block_count", 24}, {"qwen2.context_length", 32768}, {"qwen2.embedding_length", 896},
        {"qwen2.feed_forward_length", 4864}, {"qwen2.attention.head_count", 14},
        {"qwen2.attention.head_count_kv", 2}, {"qwen2.rope.dimension_count", 64}, {"qwen2.vocab_size", 151936}
    });
    EXPECT_NEAR(f->require_float("qwen2.attention.layer_norm_rms_epsilon"), 1e-6, 1e-12);
    EXPECT_EQ(f->require_float("qwen2.rope.freq_base"), 1e6);
    EXPECT_EQ(f->find("qwen2.rope.freq_base")->type, uint32_t(EH_VALUE_F32));
    EXPECT_EQ(f->find("qwen2.block_count")->type, uint32_t(EH_VALUE_U32));
    // use_sliding_window is false: the window is not a GGUF key, only hf.*.
    EXPECT_FALSE(f->has("qwen2.attention.sliding_window"));
    EXPECT_EQ(f->get_int("hf.sliding_window"), 32768);
    EXPECT_EQ(f->get_bool("hf.use_sliding_window"), false);
    EXPECT_EQ(f->get_bool("hf.tie_word_embeddings"), true);
    EXPECT_EQ(f->require_string("hf.torch_dtype"), "float32");
    EXPECT_EQ(f->get_string_array("hf.architectures").size(), 1u);
    EXPECT_FALSE(f->has("hf.rope_scaling"));  // null
    EXPECT_FALSE(f->has("hf.num_hidden_layers"));  // translated keys are not repeated
    EXPECT_EQ(f->require_uint("tokenizer.ggml.bos_token_id"), 151643u);
    EXPECT_EQ(f->require_uint("tokenizer.ggml.eos_token_id"), 151645u);
    EXPECT_EQ(f->require_string("general.name"), "Qwen/Qwen2.5-0.5B-Instruct");

    const eh_tensor* q = f->find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, uint32_t(EH_TYPE_BF16));
    EXPECT_EQ(q->n_dims, 2u);
    const eh_tensor* k = f->find_tensor("blk.0.attn_k.weight");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->dims[0], 8u);  // in
    EXPECT_EQ(k->dims[1], 4u);  // out
    EXPECT_EQ(k->nbytes, 64u);
    EXPECT_NE(f->find_tensor("blk.0.attn_q.bias"), nullptr);
    EXPECT_NE(f->find_tensor("token_embd.weight"), nullptr);
    EXPECT_NE(f->find_tensor("output_norm.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("output_norm.weight")->type, uint32_t(EH_TYPE_F16));
    EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->type, uint32_t(EH_TYPE_F32));
    EXPECT_NE(f->find_tensor("hf.model.rotary_emb.inv_freq"), nullptr);
    EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
    // Data points into the mapping, at the byte the header says.
    const eh_tensor* emb = f->find_tensor("token_embd.weight");
    EXPECT_EQ(static_cast<const uint8_t*>(emb->data)[5], 5);
}

TEST(HfDirectory, Phi3LongRope) {
    TempDir d("phi3");
    std::vector<StTensor> t = {
        {"model.embed_tokens.weight", "BF16", {4, 4}},
        {"model.layers.0.self_attn.qkv_proj.weight", "BF16", {12, 4}},
        {"model.layers.0.mlp.gate_up_proj.weight", "BF16", {16, 4}},
        {"lm_head.weight", "BF16", {4, 4}},
    };
    make_single(d, config_dir("phi-3-mini-128k-instruct") / "config.json", t);
    auto f = ModelFile::open(d.path.string());
    EXPECT_EQ(f->architecture(), "phi3");
    expect_uints(*f, {
        {"phi3.context_length", 131072}, {"phi3.attention.head_count_kv", 32}, {"phi3.rope.dimension_count", 96},
        {"phi3.attention.sliding_window", 262144}
    });
    EXPECT_EQ(f->require_string("phi3.rope.scaling.type"), "longrope");
    EXPECT_EQ(f->require_uint("phi3.rope.scaling.original_context_length"), 4096u);
    auto lf = f->get_array("hf.rope_scaling.long_factor");
    ASSERT_TRUE(lf);
    EXPECT_EQ(lf->elem_type, uint32_t(EH_VALUE_F64));
    EXPECT_EQ(lf->count, 48u);
    EXPECT_NEAR(lf->as<double>()[0], 1.07, 1e-6);
    EXPECT_EQ(f->get_array("hf.rope_scaling.short_factor")->count, 48u);
    EXPECT_EQ(f->require_string("hf.auto_map.AutoConfig"), "configuration_phi3.Phi3Config");
    EXPECT_EQ(f->require_uint("tokenizer.ggml.eos_token_id"), 32000u);
    EXPECT_EQ(f->require_uint("tokenizer.ggml.padding_token_id"), 32000u);
    EXPECT_NE(f->find_tensor("blk.0.attn_qkv.weight"), nullptr);
    EXPECT_NE(f->find_tensor("blk.0.ffn_up.weight"), nullptr);
    EXPECT_NE(f->find_tensor("output.weight"), nullptr);
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The real gpt-oss-20b index with tiny shards holding every tensor it names.
void make_gpt_oss(const TempDir& d, size_t drop_from_shard = SIZE_MAX) {
    fs::path src = config_dir("gpt-oss-20b");
    fs::copy_file(src / "config.json", d.path / "config.json");
    fs::copy_file(src / "model.safetensors.index.json", d.path / "model.safetensors.index.json");
    write_text(d.path / "tokenizer.json", "{}");
    simdjson::dom::parser p;
    simdjson::padded_string json(slurp(src / "model.safetensors.index.json"));
    simdjson::dom::object map = p.parse(json)["weight_map"].get_object().value();
    std::map<std::string, std::vector<StTensor>> shards;
    size_t i = 0;
    for (auto f : map) {
        std::string name(f.key);
        std::string dtype = name.find("_blocks") != std::string::npos || name.find("_scales") != std::string::npos
                                ? "U8" : "BF16";
        if (i++ != drop_from_shard) shards[std::string(f.value.get_string().value())].push_back({name, dtype, {2, 2}});
    }
    for (const auto& [file, tensors] : shards) write_st(d.path / file, tensors);
}

TEST(HfDirectory, GptOssSharded) {
    TempDir d("gptoss");
    make_gpt_oss(d);
    auto f = ModelFile::open(d.path.string());
    EXPECT_EQ(f->architecture(), "gpt-oss");
    EXPECT_EQ(f->tensors().size(), 459u);
    EXPECT_EQ(f->weight_files().size(), 3u);
    for (const eh_tensor& t : f->tensors())
        EXPECT_NE(to_sv(t.name).substr(0, 3), "hf.") << "untranslated: " << to_sv(t.name);
    expect_uints(*f, {
        {"gpt-oss.block_count", 24}, {"gpt-oss.embedding_length", 2880}, {"gpt-oss.attention.head_count", 64},
        {"gpt-oss.attention.head_count_kv", 8}, {"gpt-oss.attention.key_length", 64},
        {"gpt-oss.attention.value_length", 64}, {"gpt-oss.expert_count", 32}, {"gpt-oss.expert_used_count", 4},
        {"gpt-oss.expert_feed_forward_length", 2880}, {"gpt-oss.attention.sliding_window", 128},
        {"gpt-oss.context_length", 131072}
    });
    EXPECT_EQ(f->require_float("gpt-oss.rope.freq_base"), 150000.0);
    EXPECT_EQ(f->require_string("gpt-oss.rope.scaling.type"), "yarn");
    EXPECT_EQ(f->require_float("gpt-oss.rope.scaling.factor"), 32.0);
    EXPECT_EQ(f->require_uint("gpt-oss.rope.scaling.original_context_length"), 4096u);
    EXPECT_EQ(f->require_float("gpt-oss.rope.scaling.yarn_beta_fast"), 32.0);
    EXPECT_EQ(f->require_float("gpt-oss.rope.scaling.yarn_beta_slow"), 1.0);
    EXPECT_EQ(f->get_bool("hf.rope_scaling.truncate"), false);
    EXPECT_EQ(f->get_string_array("hf.layer_types").size(), 24u);
    EXPECT_EQ(f->require_float("hf.swiglu_limit"), 7.0);
    EXPECT_EQ(f->require_string("hf.quantization_config.quant_method"), "mxfp4");
    EXPECT_EQ(f->get_string_array("hf.quantization_config.modules_to_not_convert").size(), 4u);
    EXPECT_FALSE(f->has("hf.experts_per_token"));
    EXPECT_EQ(f->require_uint("tokenizer.ggml.eos_token_id"), 200002u);
    for (const char* name : {"blk.0.attn_sinks.weight", "blk.0.post_attention_norm.weight", "blk.0.attn_norm.weight",
                             "blk.23.ffn_gate_inp.weight", "blk.23.ffn_gate_inp.bias", "blk.0.ffn_gate_up_exps.blocks",
                             "blk.0.ffn_gate_up_exps.scales", "blk.0.ffn_gate_up_exps.bias", "blk.0.ffn_down_exps.blocks",
                             "blk.0.ffn_down_exps.scales", "blk.0.ffn_down_exps.bias", "blk.0.attn_output.bias",
                             "output.weight", "token_embd.weight", "output_norm.weight"})
        EXPECT_NE(f->find_tensor(name), nullptr) << name;
    EXPECT_EQ(f->find_tensor("blk.0.ffn_down_exps.blocks")->type, uint32_t(EH_TYPE_U8));
}

TEST(HfDirectory, IndexNamesATensorNoShardHas) {
    TempDir d("gptoss_missing");
    make_gpt_oss(d, 7);
    expect_error(d.path, "in none of the shards");
}

TEST(HfDirectory, MissingShard) {
    TempDir d("gptoss_shard");
    make_gpt_oss(d);
    fs::remove(d.path / "model-00001-of-00002.safetensors");
    expect_error(d.path, "shard 'model-00001-of-00002.safetensors'");
}

TEST(HfDirectory, BareSafetensorsFileIsRefused) {
    TempDir d("bare");
    write_st(d.path / "model.safetensors", kLlamaLike);
    expect_error(d.path / "model.safetensors", "pass the Hugging Face model directory");
}

TEST(HfDirectory, RequiredFiles) {
    fs::path cfg = config_dir("qwen2.5-0.5b-instruct") / "config.json";
    {
        TempDir d("nocfg");
        write_text(d.path / "tokenizer.json", "{}");
        write_st(d.path / "model.safetensors", kLlamaLike);
        expect_error(d.path, "missing config.json");
    }
    {
        TempDir d("notok");
        fs::copy_file(cfg, d.path / "config.json");
        write_st(d.path / "model.safetensors", kLlamaLike);
        expect_error(d.path, "missing tokenizer.json");
    }
    {
        TempDir d("noweights");
        fs::copy_file(cfg, d.path / "config.json");
        write_text(d.path / "tokenizer.json", "{}");
        expect_error(d.path, "no weights");
    }
    {
        TempDir d("ambiguous");
        make_single(d, cfg, kLlamaLike);
        write_st(d.path / "other.safetensors", kLlamaLike);
        expect_error(d.path, "several .safetensors files");
    }
    {
        TempDir d("badcfg");
        write_text(d.path / "config.json", "{\"hidden_size\": 3");
        write_text(d.path / "tokenizer.json", "{}");
        write_st(d.path / "model.safetensors", kLlamaLike);
        expect_error(d.path, "config.json");
    }
    {
        TempDir d("nomodeltype");
        write_text(d.path / "config.json", "{\"hidden_size\": 3}");
        write_text(d.path / "tokenizer.json", "{}");
        write_st(d.path / "model.safetensors", kLlamaLike);
        expect_error(d.path, "model_type");
    }
}

// A directory around one raw safetensors file.
void expect_st_error(const std::string& header, uint64_t data_bytes, const std::string& needle) {
    TempDir d("st");
    fs::copy_file(config_dir("qwen2.5-0.5b-instruct") / "config.json", d.path / "config.json");
    write_text(d.path / "tokenizer.json", "{}");
    write_st_raw(d.path / "model.safetensors", header, data_bytes);
    expect_error(d.path, needle);
}

TEST(Safetensors, HostileHeaders) {
    expect_st_error("{x", 0, "not valid JSON");
    expect_st_error("[]", 0, "not a JSON object");
    expect_st_error(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2, "unsupported dtype 'F8_E4M3'");
    expect_st_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "outside");
    expect_st_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8, "need 8");
    expect_st_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "outside");
    expect_st_error(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1],"data_offsets":[0,4]}})", 4, "rank 5");
    expect_st_error(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 4, "zero dimension");
    expect_st_error(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "shape entry");
    expect_st_error(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4, "overflows");
    expect_st_error(R"({"a":{"dtype":"F32","shape":[2]}})", 8, "data_offsets");
    expect_st_error(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8, "dtype");
    expect_st_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    8, "overlaps");
    // Two HF names that translate to the same GGUF name.
    expect_st_error(R"({"model.norm.weight":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                    R"("transformer.norm.weight":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                    2, "appears twice");
}

TEST(Safetensors, HostileLengthsAndTruncation) {
    TempDir d("stlen");
    fs::copy_file(config_dir("qwen2.5-0.5b-instruct") / "config.json", d.path / "config.json");
    write_text(d.path / "tokenizer.json", "{}");
    auto p = d.path / "model.safetensors";
    write_text(p, "abc");
    expect_error(d.path, "too short");
    std::string huge(8, '\xff');
    write_text(p, huge + "{}");
    expect_error(d.path, "header length");
    // Every truncation of a valid file fails cleanly.
    write_st(p, kLlamaLike);
    std::string full = slurp(p);
    for (size_t n = 0; n < full.size(); n += 7) {
        write_text(p, full.substr(0, n));
        EXPECT_THROW(ModelFile::open(d.path.string()), eh::Error) << n;
    }
}

TEST(HfNames, Translation) {
    using eh::model::hf_tensor_name_to_gguf;
    expect_gguf_names("llama", {
        {"model.layers.12.self_attn.o_proj.weight", "blk.12.attn_output.weight"},
        {"model.layers.1.mlp.gate_proj.weight", "blk.1.ffn_gate.weight"},
        {"model.layers.x.mlp.gate_proj.weight", "hf.model.layers.x.mlp.gate_proj.weight"}
    });
    EXPECT_EQ(hf_tensor_name_to_gguf("qwen2", "lm_head.weight"), "output.weight");
    EXPECT_EQ(hf_tensor_name_to_gguf("qwen2", "model.layers.0.post_attention_layernorm.weight"), "blk.0.ffn_norm.weight");
    EXPECT_EQ(hf_tensor_name_to_gguf("gpt-oss", "model.layers.0.post_attention_layernorm.weight"),
              "blk.0.post_attention_norm.weight");
    expect_gguf_names("gpt2", {
        {"h.3.attn.c_attn.weight", "blk.3.attn_qkv.weight"},
        {"transformer.h.3.mlp.c_proj.bias", "blk.3.ffn_down.bias"},
        {"wte.weight", "token_embd.weight"},
        {"transformer.wpe.weight", "position_embd.weight"},
        {"ln_f.bias", "output_norm.bias"},
        {"h.0.attn.bias", "hf.h.0.attn.bias"}
    });
    EXPECT_EQ(eh::model::hf_model_type_to_arch("gpt_oss"), "gpt-oss");
    EXPECT_EQ(eh::model::hf_model_type_to_arch("qwen2"), "qwen2");
    // as llama.cpp's converter names them
    EXPECT_EQ(eh::model::hf_model_type_to_arch("mistral"), "llama");
    EXPECT_EQ(eh::model::hf_model_type_to_arch("qwen3"), "qwen3");
    EXPECT_EQ(eh::model::hf_model_type_to_arch("qwen3_moe"), "qwen3moe");
    EXPECT_EQ(hf_tensor_name_to_gguf("qwen3", "model.layers.2.self_attn.q_norm.weight"), "blk.2.attn_q_norm.weight");
    EXPECT_EQ(hf_tensor_name_to_gguf("qwen3", "model.layers.2.self_attn.k_norm.weight"), "blk.2.attn_k_norm.weight");
}

// Qwen3-MoE's router and experts: one tensor per expert (the checkpoints on
// the Hub) under llama.cpp's split-expert names, or the fused 3D tensors.
TEST(HfNames, Qwen3MoeExperts) {
    using eh::model::hf_tensor_name_to_gguf;
    const std::string q = "qwen3moe";
    expect_gguf_names(q, {
        {"model.layers.3.mlp.gate.weight", "blk.3.ffn_gate_inp.weight"},
        {"model.layers.3.mlp.experts.0.gate_proj.weight", "blk.3.ffn_gate.0.weight"},
        {"model.layers.47.mlp.experts.127.up_proj.weight", "blk.47.ffn_up.127.weight"},
        {"model.layers.0.mlp.experts.10.down_proj.weight", "blk.0.ffn_down.10.weight"},
        {"model.layers.1.mlp.experts.gate_up_proj", "blk.1.ffn_gate_up_exps.weight"},
        {"model.layers.1.mlp.experts.down_proj", "blk.1.ffn_down_exps.weight"}
    });
    // the rest of the layer as qwen3
    EXPECT_EQ(hf_tensor_name_to_gguf(q, "model.layers.1.self_attn.q_norm.weight"), "blk.1.attn_q_norm.weight");
    EXPECT_EQ(hf_tensor_name_to_gguf(q, "model.layers.1.post_attention_layernorm.weight"), "blk.1.ffn_norm.weight");
    // not an expert: no GGUF name, so a plugin reports it missing by its HF name
    for (const char* odd : {"model.layers.0.mlp.experts.07.gate_proj.weight", "model.layers.0.mlp.experts..gate_proj.weight",
                            "model.layers.0.mlp.experts.1.gate_proj.bias", "model.layers.0.mlp.experts.1.side_proj.weight",
                            "model.layers.0.mlp.experts.1234567.up_proj.weight", "model.layers.0.mlp.experts.1.up_proj",
                            "model.layers.0.mlp.shared_expert.gate_proj.weight"})
        EXPECT_EQ(hf_tensor_name_to_gguf(q, odd), std::string("hf.") + odd) << odd;
    // only Qwen3-MoE reads mlp.gate as the router
    EXPECT_EQ(hf_tensor_name_to_gguf("qwen3", "model.layers.3.mlp.gate.weight"), "hf.model.layers.3.mlp.gate.weight");
}

// A Qwen3-MoE config: its expert counts under the GGUF keys llama.cpp's
// converter writes; the settings a plugin must check stay hf.*.
TEST(HfDirectory, Qwen3MoeConfig) {
    TempDir d("qwen3moe");
    write_text(d.path / "config.json", R"({"model_type": "qwen3_moe", "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 12,
        "moe_intermediate_size": 6, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 16})");
    write_text(d.path / "tokenizer.json", "{}");
    write_st(d.path / "model.safetensors", {{"model.layers.0.mlp.experts.3.down_proj.weight", "BF16", {8, 6}},
                                            {"model.layers.0.mlp.gate.weight", "BF16", {4, 8}}});
    auto f = ModelFile::open(d.path.string());
    ehp::ModelView v(&f->view());
    EXPECT_EQ(v.architecture(), "qwen3moe");
    EXPECT_EQ(v.get_uint("qwen3moe.expert_count"), 4u);
    EXPECT_EQ(v.get_uint("qwen3moe.expert_used_count"), 2u);
    EXPECT_EQ(v.get_uint("qwen3moe.expert_feed_forward_length"), 6u);
    EXPECT_EQ(v.get_uint("hf.norm_topk_prob"), 1u);
    EXPECT_EQ(v.get_uint("hf.decoder_sparse_step"), 1u);
    EXPECT_EQ(ehp::qwen3moe_unsupported(v), "");
    const eh_tensor* down = v.find_tensor("blk.0.ffn_down.3.weight");
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(down->dims[0], 6u);
    EXPECT_EQ(down->dims[1], 8u);
    EXPECT_NE(v.find_tensor("blk.0.ffn_gate_inp.weight"), nullptr);

    // what the plugins refuse, each with its reason
    const std::pair<const char*, const char*> refused[] = {
        {R"("norm_topk_prob": false)", "norm_topk_prob false"},
        {R"("decoder_sparse_step": 2)", "decoder_sparse_step 2"},
        {R"("mlp_only_layers": [0])", "mlp_only_layers"},
    };
    for (const auto& [setting, why] : refused) {
        write_text(d.path / "config.json", std::string(R"({"model_type": "qwen3_moe", "hidden_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_experts": 4, "num_experts_per_tok": 2, )") +
                                               setting + "}");
        auto g = ModelFile::open(d.path.string());
        ehp::ModelView w(&g->view());
        EXPECT_NE(ehp::qwen3moe_unsupported(w).find(why), std::string::npos) << setting;
    }
}

// transformers 5 writes rope_theta and the scaling parameters into one
// "rope_parameters" object: theta becomes rope.freq_base (plugins that read
// only GGUF keys, like llama-cuda, need it), rope_type "default" is no
// scaling, keys with no GGUF name stay under hf.rope_parameters.*.
TEST(HfDirectory, RopeParametersObject) {
    TempDir d("rope-params");
    const char* llama3 = R"({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 12, "head_dim": 4,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}})";
    write_text(d.path / "config.json", llama3);
    write_text(d.path / "tokenizer.json", "{}");
    write_st(d.path / "model.safetensors", kLlamaLike);
    auto f = ModelFile::open(d.path.string());
    EXPECT_EQ(f->require_float("llama.rope.freq_base"), 500000.0);
    EXPECT_EQ(f->require_string("llama.rope.scaling.type"), "llama3");
    EXPECT_EQ(f->require_float("llama.rope.scaling.factor"), 8.0);
    EXPECT_EQ(f->require_uint("llama.rope.scaling.original_context_length"), 8192u);
    EXPECT_EQ(f->require_float("hf.rope_parameters.low_freq_factor"), 1.0);
    EXPECT_EQ(f->require_float("hf.rope_parameters.high_freq_factor"), 4.0);
    EXPECT_FALSE(f->has("hf.rope_parameters.rope_theta"));
    EXPECT_EQ(f->require_uint("llama.attention.key_length"), 4u);

    TempDir d2("rope-default");
    write_text(d2.path / "config.json", R"({"model_type": "mistral", "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 12, "head_dim": 8,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}})");
    write_text(d2.path / "tokenizer.json", "{}");
    write_st(d2.path / "model.safetensors", kLlamaLike);
    auto g = ModelFile::open(d2.path.string());
    EXPECT_EQ(g->architecture(), "llama");
    EXPECT_EQ(g->require_float("llama.rope.freq_base"), 1e6);
    EXPECT_FALSE(g->has("llama.rope.scaling.type"));
    EXPECT_EQ(g->require_uint("llama.attention.key_length"), 8u);  // Mistral's own head_dim (8 != 8/2)
}

TEST(HfDirectory, Gpt2Config) {
    TempDir d("gpt2");
    write_text(d.path / "config.json",
               R"({"model_type":"gpt2","n_ctx":1024,"n_embd":768,"n_head":12,"n_layer":12,"n_positions":1024,)"
               R"("n_inner":null,"layer_norm_epsilon":1e-05,"vocab_size":50257,"bos_token_id":50256,"eos_token_id":50256,)"
               R"("activation_function":"gelu_new","task_specific_params":{"text-generation":{"do_sample":true,"max_length":50}}})");
    write_text(d.path / "tokenizer.json", "{}");
    write_st(d.path / "model.safetensors", {{"wte.weight", "F32", {4, 2}}, {"h.0.ln_1.weight", "F32", {2}}});
    auto f = ModelFile::open(d.path.string());
    EXPECT_EQ(f->architecture(), "gpt2");
    expect_uints(*f, {
        {"gpt2.context_length", 1024}, {"gpt2.embedding_length", 768}, {"gpt2.feed_forward_length", 3072},
        {"gpt2.attention.head_count", 12}, {"gpt2.block_count", 12}
    });
    EXPECT_NEAR(f->require_float("gpt2.attention.layer_norm_epsilon"), 1e-5, 1e-10);
    EXPECT_EQ(f->require_uint("gpt2.vocab_size"), 50257u);
    EXPECT_EQ(f->get_bool("hf.task_specific_params.text-generation.do_sample"), true);
    EXPECT_FALSE(f->has("hf.n_ctx"));
    EXPECT_NE(f->find_tensor("blk.0.attn_norm.weight"), nullptr);
}

}  // namespace

#include "eh/model/descriptor.hpp"

namespace {

TEST(HfDescribe, GptOss) {
    TempDir d("gptoss_desc");
    make_gpt_oss(d);
    auto f = ModelFile::open(d.path.string());
    auto desc = eh::model::describe(*f);
    EXPECT_EQ(desc.format, "safetensors");
    EXPECT_EQ(desc.architecture, "gpt-oss");
    EXPECT_EQ(desc.expert_count, 32u);
    EXPECT_EQ(desc.expert_used_count, 4u);
    EXPECT_EQ(desc.sliding_window, 128u);
    EXPECT_EQ(desc.head_dim, 64u);
    EXPECT_EQ(desc.head_count_kv, 8u);
    EXPECT_EQ(desc.vocab_size, 201088u);
    EXPECT_EQ(desc.quant_kind, "MXFP4");
    EXPECT_FALSE(desc.tied_embeddings);
    ASSERT_TRUE(desc.rope_scaling);
    EXPECT_EQ(desc.rope_scaling->type, "yarn");
    EXPECT_EQ(desc.rope_scaling->factor, 32.0);
    EXPECT_EQ(desc.rope_scaling->original_context_length, 4096u);
    EXPECT_EQ(desc.rope_scaling->yarn_beta_fast, std::optional<double>(32.0));
    EXPECT_EQ(desc.rope_scaling->yarn_beta_slow, std::optional<double>(1.0));
    EXPECT_NEAR(desc.norm_eps, 1e-5, 1e-10);
    EXPECT_EQ(desc.requirements().tensor_types, (std::vector<std::string>{"BF16", "U8"}));
}

TEST(HfDescribe, Qwen2Tied) {
    TempDir d("qwen2_desc");
    make_single(d, config_dir("qwen2.5-0.5b-instruct") / "config.json", kLlamaLike);
    auto desc = eh::model::describe(*ModelFile::open(d.path.string()));
    EXPECT_TRUE(desc.tied_embeddings);
    EXPECT_EQ(desc.quant_kind, "BF16");
    EXPECT_EQ(desc.head_dim, 64u);
    EXPECT_EQ(desc.sliding_window, 0u);
    EXPECT_EQ(desc.context_length, 32768u);
    EXPECT_EQ(desc.vocab_size, 151936u);
    EXPECT_FALSE(desc.rope_scaling);
}

}  // namespace

// Gemma 3: its four norms a layer, and the decoder of
// Gemma3ForConditionalGeneration under either prefix transformers used.
TEST(HfNames, Gemma3) {
    using eh::model::hf_tensor_name_to_gguf;
    EXPECT_EQ(eh::model::hf_model_type_to_arch("gemma3_text"), "gemma3");
    EXPECT_EQ(eh::model::hf_model_type_to_arch("gemma3"), "gemma3");
    const std::string g = "gemma3";
    EXPECT_EQ(hf_tensor_name_to_gguf(g, "model.layers.4.input_layernorm.weight"), "blk.4.attn_norm.weight");
    EXPECT_EQ(hf_tensor_name_to_gguf(g, "model.layers.4.post_attention_layernorm.weight"),
              "blk.4.post_attention_norm.weight");
    EXPECT_EQ(hf_tensor_name_to_gguf(g, "model.layers.4.pre_feedforward_layernorm.weight"), "blk.4.ffn_norm.weight");
    EXPECT_EQ(hf_tensor_name_to_gguf(g, "model.layers.4.post_feedforward_layernorm.weight"),
              "blk.4.post_ffw_norm.weight");
    expect_gguf_names(g, {
        {"model.layers.4.self_attn.q_norm.weight", "blk.4.attn_q_norm.weight"},
        {"language_model.model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight"},
        {"language_model.model.embed_tokens.weight", "token_embd.weight"},
        {"language_model.lm_head.weight", "output.weight"}
    });
    EXPECT_EQ(hf_tensor_name_to_gguf(g, "model.language_model.layers.1.pre_feedforward_layernorm.weight"),
              "blk.1.ffn_norm.weight");
    EXPECT_EQ(hf_tensor_name_to_gguf(g, "model.language_model.norm.weight"), "output_norm.weight");
    EXPECT_EQ(hf_tensor_name_to_gguf(g, "model.vision_tower.vision_model.post_layernorm.weight"),
              "hf.model.vision_tower.vision_model.post_layernorm.weight");
    // llama's post_attention_layernorm is still its ffn_norm
    EXPECT_EQ(hf_tensor_name_to_gguf("llama", "model.layers.4.post_attention_layernorm.weight"), "blk.4.ffn_norm.weight");
}

// Qwen2.5-VL's decoder (qwen2vl): model.layers.* (transformers 4) or
// model.language_model.layers.* (5); its vision tower keeps hf.* names.
TEST(HfNames, QwenVl) {
    using eh::model::hf_tensor_name_to_gguf;
    for (const char* t : {"qwen2_5_vl", "qwen2_vl", "qwen2_5_vl_text"}) EXPECT_EQ(eh::model::hf_model_type_to_arch(t), "qwen2vl");
    const std::string q = "qwen2vl";
    expect_gguf_names(q, {
        {"model.layers.3.self_attn.q_proj.bias", "blk.3.attn_q.bias"},
        {"model.language_model.layers.3.self_attn.q_proj.bias", "blk.3.attn_q.bias"},
        {"model.language_model.embed_tokens.weight", "token_embd.weight"},
        {"lm_head.weight", "output.weight"},
        {"model.visual.blocks.0.attn.qkv.weight", "hf.model.visual.blocks.0.attn.qkv.weight"},
        {"visual.merger.ln_q.weight", "hf.visual.merger.ln_q.weight"}
    });
}

// Qwen2.5-VL's config, flat (transformers 4: rope_scaling type mrope) and with
// its decoder in text_config (5: rope_parameters): qwen2vl's keys, no rope
// scaling, the sections passed on for the plugins.
TEST(HfDirectory, QwenVlConfigs) {
    const char* flat = R"({"model_type": "qwen2_5_vl", "hidden_size": 2048, "intermediate_size": 11008,
        "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": false, "vocab_size": 151936,
        "max_position_embeddings": 128000, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {"depth": 32, "hidden_size": 1280, "fullatt_block_indexes": [7, 15, 23, 31]}})";
    const char* nested = R"({"model_type": "qwen2_5_vl", "eos_token_id": 151645, "text_config": {
        "model_type": "qwen2_5_vl_text", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
        "num_attention_heads": 16, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 151936,
        "max_position_embeddings": 128000, "use_sliding_window": false, "sliding_window": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}},
        "vision_config": {"depth": 32}})";
    for (const char* cfg : {flat, nested}) {
        TempDir d("qwen2vl");
        write_text(d.path / "config.json", cfg);
        write_text(d.path / "tokenizer.json", "{}");
        write_st(d.path / "model.safetensors", {{"model.norm.weight", "BF16", {2048}}});
        auto f = ModelFile::open(d.path.string());
        ehp::ModelView v(&f->view());
        EXPECT_EQ(v.architecture(), "qwen2vl");
        EXPECT_EQ(v.get_uint("qwen2vl.embedding_length"), 2048u);
        EXPECT_EQ(v.get_uint("qwen2vl.attention.head_count_kv"), 2u);
        EXPECT_EQ(v.get_uint("qwen2vl.rope.dimension_count"), 128u);
        EXPECT_FLOAT_EQ(static_cast<float>(*v.get_float("qwen2vl.rope.freq_base")), 1e6f);
        EXPECT_FALSE(v.find("qwen2vl.rope.scaling.type")) << "mrope is no scaling";
        EXPECT_FALSE(v.find("qwen2vl.attention.sliding_window"));
        const ehp::mrope::Sections s = ehp::mrope::read_sections(v, 128);
        EXPECT_EQ(s.n, (std::array<uint32_t, 3>{16, 24, 24}));
    }
}

// Gemma 3 4B's text_config gives five keys; the rest are Gemma3TextConfig's
// defaults, written under the keys llama.cpp's converter uses. The token ids
// stay at the top of a Gemma3ForConditionalGeneration config.
TEST(HfDirectory, Gemma3TextConfigDefaults) {
    TempDir d("gemma3");
    write_text(d.path / "config.json", R"({"model_type": "gemma3", "eos_token_id": [1, 106], "text_config": {
        "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}})");
    write_text(d.path / "tokenizer.json", "{}");
    write_st(d.path / "model.safetensors", {{"language_model.model.norm.weight", "BF16", {2560}}});
    auto f = ModelFile::open(d.path.string());
    ehp::ModelView v(&f->view());
    EXPECT_EQ(v.architecture(), "gemma3");
    EXPECT_EQ(v.get_uint("gemma3.embedding_length"), 2560u);
    EXPECT_EQ(v.get_uint("gemma3.block_count"), 34u);
    EXPECT_EQ(v.get_uint("gemma3.attention.head_count"), 8u);
    EXPECT_EQ(v.get_uint("gemma3.attention.head_count_kv"), 4u);
    EXPECT_EQ(v.get_uint("gemma3.attention.key_length"), 256u);
    EXPECT_EQ(v.get_uint("gemma3.rope.dimension_count"), 256u);
    EXPECT_EQ(v.get_uint("gemma3.context_length"), 131072u);
    EXPECT_EQ(v.get_uint("gemma3.attention.sliding_window"), 1024u);
    EXPECT_FLOAT_EQ(static_cast<float>(*v.get_float("gemma3.attention.layer_norm_rms_epsilon")), 1e-6f);
    EXPECT_FLOAT_EQ(static_cast<float>(*v.get_float("gemma3.attention.scale")), 1.0f / 16.0f);
    EXPECT_FLOAT_EQ(static_cast<float>(*v.get_float("gemma3.rope.freq_base")), 1e6f);
    EXPECT_EQ(v.get_string("gemma3.rope.scaling.type"), "linear");
    EXPECT_FLOAT_EQ(static_cast<float>(*v.get_float("gemma3.rope.scaling.factor")), 8.0f);
    EXPECT_EQ(v.get_uint("tokenizer.ggml.eos_token_id"), 1u);
    EXPECT_NE(v.find_tensor("output_norm.weight"), nullptr);
}

TEST(HfDirectory, Gemma3RefusesAScaledSlidingRope) {
    TempDir d("gemma3_rope");
    write_text(d.path / "config.json", R"({"model_type": "gemma3_text", "hidden_size": 8, "num_hidden_layers": 1,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                            "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}})");
    write_text(d.path / "tokenizer.json", "{}");
    write_st(d.path / "model.safetensors", kLlamaLike);
    try {
        ModelFile::open(d.path.string());
        ADD_FAILURE() << "opened";
    } catch (const eh::Error& e) {
        EXPECT_NE(std::string(e.what()).find("rope_parameters.sliding_attention.rope_type 'linear'"), std::string::npos)
            << e.what();
    }
}
