// describe(), inspect_text() and inspect_json() on real and written GGUF files.
#include <gtest/gtest.h>

#include <simdjson.h>

#include <engine_host/tensor_types.h>

#include "eh/model/descriptor.hpp"
#include "eh/model/inspect.hpp"
#include "eh/model/model_file.hpp"
#include "gguf_test_files.hpp"

using namespace eh::model;

namespace {

std::string data(const char* rel) { return std::string(EH_TESTDATA_DIR) + "/" + rel; }

std::unique_ptr<ModelFile> open_writer(const GgufWriter& w) {
    auto b = w.to_bytes();
    return ModelFile::open_gguf_buffer(b.data(), b.size(), "written.gguf");
}

TEST(Describe, Stories260K) {
    auto f = ModelFile::open(data("models/stories260K.gguf"));
    ModelDescriptor d = describe(*f);
    EXPECT_EQ(d.format, "gguf");
    EXPECT_EQ(d.architecture, "llama");
    EXPECT_TRUE(d.known_architecture);
    EXPECT_EQ(d.context_length, 2048u);
    EXPECT_EQ(d.embedding_length, 64u);
    EXPECT_EQ(d.block_count, 5u);
    EXPECT_EQ(d.feed_forward_length, 172u);
    EXPECT_EQ(d.head_count, 8u);
    EXPECT_EQ(d.head_count_kv, 4u);
    EXPECT_EQ(d.head_dim, 8u);
    EXPECT_EQ(d.rope_dimension_count, 8u);
    EXPECT_TRUE(d.norm_is_rms);
    EXPECT_NEAR(d.norm_eps, 1e-5, 1e-9);
    EXPECT_FALSE(d.tied_embeddings);
    EXPECT_EQ(d.vocab_size, 512u);
    EXPECT_FALSE(d.file_type.has_value());
    EXPECT_EQ(d.quant_kind, "F32");
    EXPECT_EQ(d.n_tensors, 48u);
    ASSERT_EQ(d.tensor_types.size(), 1u);
    EXPECT_EQ(d.tensor_types[0].count, 48u);
    EXPECT_EQ(d.tensor_bytes, d.parameter_count * 4);
    EXPECT_FALSE(d.rope_scaling.has_value());
    auto r = d.requirements();
    EXPECT_EQ(r.format, "gguf");
    EXPECT_EQ(r.architecture, "llama");
    EXPECT_EQ(r.tensor_types, std::vector<std::string>{"F32"});
}

TEST(Describe, LlamaTinyRandomFileType) {
    auto f = ModelFile::open(data("models/llama-2-tiny-random.gguf"));
    ModelDescriptor d = describe(*f);
    EXPECT_EQ(d.file_type, std::optional<uint32_t>(1));
    EXPECT_EQ(d.quant_kind, "F16");
    EXPECT_EQ(d.tensor_type_names(), (std::vector<std::string>{"F16", "F32"}));
    EXPECT_EQ(d.vocab_size, 32000u);
    EXPECT_EQ(d.head_dim, 4u);
}

TEST(Describe, Gpt2VocabUsesLayerNorm) {
    auto f = ModelFile::open(data("vocab/ggml-vocab-gpt-2.gguf"));
    ModelDescriptor d = describe(*f);
    EXPECT_EQ(d.architecture, "gpt2");
    EXPECT_FALSE(d.norm_is_rms);
    EXPECT_EQ(d.vocab_size, 50257u);
    EXPECT_EQ(d.n_tensors, 0u);
    EXPECT_EQ(d.block_count, 12u);
}

TEST(Describe, FileTypeNames) {
    EXPECT_EQ(file_type_name(0), "F32");
    EXPECT_EQ(file_type_name(2), "Q4_0");
    EXPECT_EQ(file_type_name(7), "Q8_0");
    EXPECT_EQ(file_type_name(8), "Q5_0");
    EXPECT_EQ(file_type_name(15), "Q4_K_M");
    EXPECT_EQ(file_type_name(17), "Q5_K_M");
    EXPECT_EQ(file_type_name(18), "Q6_K");
    EXPECT_EQ(file_type_name(32), "BF16");
    EXPECT_EQ(file_type_name(38), "MXFP4_MOE");
    EXPECT_EQ(file_type_name(1024 | 15), "Q4_K_M");
    EXPECT_EQ(file_type_name(5), "");
}

GgufWriter quantized(bool with_file_type) {
    static std::vector<uint8_t> zeros(1 << 16);
    GgufWriter w;
    w.set("general.architecture", GgufValue::string("qwen2"));
    if (with_file_type) w.set("general.file_type", GgufValue::u32(15));
    w.set("qwen2.embedding_length", GgufValue::u32(256));
    w.set("qwen2.attention.head_count", GgufValue::u32(4));
    w.set("qwen2.rope.scaling.type", GgufValue::string("yarn"));
    w.set("qwen2.rope.scaling.factor", GgufValue::f32(4.0f));
    w.set("qwen2.rope.scaling.original_context_length", GgufValue::u32(32768));
    w.set("qwen2.attention.sliding_window", GgufValue::u32(4096));
    w.add_tensor("token_embd.weight", EH_TYPE_Q4_K, {256, 8}, zeros.data());
    w.add_tensor("blk.0.attn_q.weight", EH_TYPE_Q4_K, {256, 256}, zeros.data());
    w.add_tensor("blk.0.ffn_down.weight", EH_TYPE_Q6_K, {256, 16}, zeros.data());
    w.add_tensor("blk.0.attn_norm.weight", EH_TYPE_F32, {256}, zeros.data());
    return w;
}

TEST(Describe, QuantKindFromFileTypeOrDominantType) {
    auto f = open_writer(quantized(true));
    ModelDescriptor d = describe(*f);
    EXPECT_EQ(d.quant_kind, "Q4_K_M");
    EXPECT_EQ(d.tensor_type_names(), (std::vector<std::string>{"F32", "Q4_K", "Q6_K"}));
    EXPECT_TRUE(d.tied_embeddings);
    EXPECT_EQ(d.vocab_size, 8u);  // embedding rows, no token list
    EXPECT_EQ(d.head_dim, 64u);
    ASSERT_TRUE(d.rope_scaling);
    EXPECT_EQ(d.rope_scaling->type, "yarn");
    EXPECT_EQ(d.rope_scaling->factor, 4.0);
    EXPECT_EQ(d.rope_scaling->original_context_length, 32768u);
    EXPECT_FALSE(d.rope_scaling->yarn_beta_fast);
    EXPECT_EQ(d.sliding_window, 4096u);
    EXPECT_EQ(d.parameter_count, 256u * 8 + 256 * 256 + 256 * 16 + 256);
    auto g = open_writer(quantized(false));
    EXPECT_EQ(describe(*g).quant_kind, "Q4_K");
}

TEST(Inspect, TextHasTheFacts) {
    auto f = ModelFile::open(data("models/stories260K.gguf"));
    InspectOptions o;
    o.list_tensors = true;
    o.extra_sections.push_back({"Tokenizer", {{"kind", "SPM"}, {"vocab", "512"}}, ""});
    std::string t = inspect_text(*f, o);
    for (const char* needle : {"GGUF v3", "llama", "F32", "context length", "2048", "head dim 8",
                               "tokenizer.ggml.tokens = [string x 512]", "blk.0.attn_q.weight",
                               "Tokenizer:", "SPM"})
        EXPECT_NE(t.find(needle), std::string::npos) << needle << "\n" << t;
}

TEST(Inspect, JsonIsValidAndComplete) {
    auto f = ModelFile::open(data("vocab/ggml-vocab-phi-3.gguf"));
    InspectOptions o;
    o.list_tensors = true;
    o.extra_sections.push_back({"tokenizer", {}, R"({"model":"llama","n_vocab":32064})"});
    o.extra_sections.push_back({"notes", {{"a", "b\"c"}}, ""});
    std::string j = inspect_json(*f, o);
    simdjson::dom::parser p;
    simdjson::padded_string ps(j);
    simdjson::dom::element root;
    ASSERT_EQ(p.parse(ps).get(root), simdjson::SUCCESS) << j.substr(0, 2000);
    EXPECT_EQ(std::string_view(root["format"]), "gguf");
    EXPECT_EQ(std::string_view(root["model"]["architecture"]), "phi3");
    EXPECT_EQ(int64_t(root["model"]["vocab_size"]), 32064);
    EXPECT_EQ(int64_t(root["model"]["block_count"]), 32);
    EXPECT_EQ(std::string_view(root["requirements"]["architecture"]), "phi3");
    EXPECT_EQ(int64_t(root["extra"]["tokenizer"]["n_vocab"]), 32064);
    EXPECT_EQ(std::string_view(root["extra"]["notes"]["a"]), "b\"c");
    bool found = false;
    for (auto kv : root["metadata"].get_array()) {
        if (std::string_view(kv["key"]) == "tokenizer.ggml.tokens") {
            found = true;
            EXPECT_EQ(int64_t(kv["count"]), 32064);
            EXPECT_EQ(kv["value"].get_array().size(), 8u);
        }
    }
    EXPECT_TRUE(found);
}

TEST(Inspect, JsonEscapesBytesThatAreNotUtf8) {
    GgufWriter w;
    w.set("general.architecture", GgufValue::string("llama"));
    w.set("weird", GgufValue::string(std::string("a\xff\x01\"\\b\xe2\x82\xac", 9)));
    w.set("tokenizer.ggml.tokens", GgufValue::string_array({"\xc3", "ok"}));
    auto f = open_writer(w);
    std::string j = inspect_json(*f);
    simdjson::dom::parser p;
    simdjson::padded_string ps(j);
    simdjson::dom::element root;
    ASSERT_EQ(p.parse(ps).get(root), simdjson::SUCCESS) << j;
    EXPECT_NE(j.find("a\\u00ff\\u0001\\\"\\\\b\xe2\x82\xac"), std::string::npos) << j;
}

TEST(LargeVocab, TwoHundredThousandTokens) {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    for (int i = 0; i < 200000; ++i) {
        tokens.push_back("tok" + std::to_string(i));
        scores.push_back(static_cast<float>(i));
    }
    GgufWriter w;
    w.set("general.architecture", GgufValue::string("gpt-oss"));
    w.set("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
    w.set("tokenizer.ggml.scores", GgufValue::array(std::span<const float>(scores)));
    auto f = open_writer(w);
    auto t = f->get_string_array("tokenizer.ggml.tokens");
    ASSERT_EQ(t.size(), 200000u);
    EXPECT_EQ(to_sv(t[199999]), "tok199999");
    EXPECT_EQ(f->get_f32_array("tokenizer.ggml.scores")[123456], 123456.0f);
    EXPECT_EQ(describe(*f).vocab_size, 200000u);
}

}  // namespace
