// The reader against real GGUF files from ../shared/testdata (facts from
// testdata/SOURCES.md).
#include <gtest/gtest.h>

#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "eh/model/model_file.hpp"

using eh::model::ModelFile;
using eh::model::to_sv;

namespace {

std::string data(const char* rel) { return std::string(EH_TESTDATA_DIR) + "/" + rel; }

TEST(GgufReal, Stories260K) {
    auto f = ModelFile::open(data("models/stories260K.gguf"));
    EXPECT_EQ(f->format_name(), "gguf");
    EXPECT_EQ(f->gguf_version(), 3u);
    EXPECT_EQ(f->architecture(), "llama");
    EXPECT_EQ(f->alignment(), 32u);
    EXPECT_EQ(f->view().n_tensors, 48u);
    EXPECT_EQ(f->view().struct_size, sizeof(eh_model_view));
    EXPECT_EQ(f->view().format, uint32_t(EH_FORMAT_GGUF));
    EXPECT_EQ(to_sv(f->view().architecture), "llama");
    EXPECT_EQ(f->require_uint("llama.block_count"), 5u);
    EXPECT_EQ(f->require_uint("llama.embedding_length"), 64u);
    EXPECT_EQ(f->require_uint("llama.attention.head_count"), 8u);
    EXPECT_EQ(f->require_uint("llama.attention.head_count_kv"), 4u);
    EXPECT_EQ(f->require_uint("llama.feed_forward_length"), 172u);
    EXPECT_EQ(f->require_uint("llama.rope.dimension_count"), 8u);
    EXPECT_EQ(f->require_uint("llama.context_length"), 2048u);
    EXPECT_NEAR(f->require_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
    EXPECT_FALSE(f->has("general.file_type"));
    EXPECT_EQ(f->require_string("tokenizer.ggml.model"), "llama");
    auto tokens = f->get_string_array("tokenizer.ggml.tokens");
    EXPECT_EQ(tokens.size(), 512u);
    EXPECT_EQ(f->get_f32_array("tokenizer.ggml.scores").size(), 512u);
    EXPECT_EQ(f->get_i32_array("tokenizer.ggml.token_type").size(), 512u);
    EXPECT_EQ(f->require_uint("tokenizer.ggml.bos_token_id"), 1u);
    EXPECT_EQ(f->require_uint("tokenizer.ggml.eos_token_id"), 2u);
    EXPECT_EQ(f->require_uint("tokenizer.ggml.unknown_token_id"), 0u);
    for (const eh_tensor& t : f->tensors()) {
        EXPECT_EQ(t.type, uint32_t(EH_TYPE_F32)) << to_sv(t.name);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u);
    }
    const eh_tensor* out = f->find_tensor("output.weight");
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(out->n_dims, 2u);
    EXPECT_EQ(out->dims[0], 64u);
    EXPECT_EQ(out->dims[1], 512u);
    EXPECT_EQ(out->nbytes, 64u * 512u * 4u);
    ASSERT_NE(f->find_tensor("token_embd.weight"), nullptr);
    ASSERT_NE(f->find_tensor("blk.4.ffn_down.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("blk.5.ffn_down.weight"), nullptr);
}

TEST(GgufReal, LlamaTinyRandom) {
    auto f = ModelFile::open(data("models/llama-2-tiny-random.gguf"));
    EXPECT_EQ(f->gguf_version(), 3u);
    EXPECT_EQ(f->architecture(), "llama");
    EXPECT_EQ(f->view().n_tensors, 12u);
    int f16 = 0, f32 = 0;
    for (const eh_tensor& t : f->tensors()) {
        if (t.type == EH_TYPE_F16) ++f16;
        if (t.type == EH_TYPE_F32) ++f32;
    }
    EXPECT_EQ(f16, 9);
    EXPECT_EQ(f32, 3);
    EXPECT_EQ(f->require_uint("general.file_type"), 1u);
    EXPECT_EQ(f->require_uint("llama.block_count"), 1u);
    EXPECT_EQ(f->require_uint("llama.embedding_length"), 8u);
    EXPECT_EQ(f->require_uint("llama.attention.head_count"), 2u);
    EXPECT_EQ(f->require_uint("llama.attention.head_count_kv"), 2u);
    EXPECT_EQ(f->require_uint("llama.feed_forward_length"), 32u);
    EXPECT_EQ(f->require_uint("llama.context_length"), 4096u);
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 32000u);
}

TEST(GgufReal, VocabGpt2) {
    auto f = ModelFile::open(data("vocab/ggml-vocab-gpt-2.gguf"));
    EXPECT_EQ(f->architecture(), "gpt2");
    EXPECT_EQ(f->view().n_tensors, 0u);
    EXPECT_EQ(f->require_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f->require_string("tokenizer.ggml.pre"), "gpt-2");
    auto tokens = f->get_string_array("tokenizer.ggml.tokens");
    ASSERT_EQ(tokens.size(), 50257u);
    EXPECT_EQ(to_sv(tokens[50256]), "<|endoftext|>");
    EXPECT_EQ(tokens[50256].data[tokens[50256].size], '\0');
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.merges").size(), 50000u);
    EXPECT_EQ(f->require_uint("tokenizer.ggml.bos_token_id"), 50256u);
    EXPECT_EQ(f->require_uint("tokenizer.ggml.eos_token_id"), 50256u);
    EXPECT_EQ(f->require_uint("gpt2.block_count"), 12u);
    EXPECT_EQ(f->require_uint("gpt2.embedding_length"), 768u);
    EXPECT_EQ(f->require_uint("gpt2.context_length"), 1024u);
}

TEST(GgufReal, VocabLlamaSpm) {
    auto f = ModelFile::open(data("vocab/ggml-vocab-llama-spm.gguf"));
    EXPECT_EQ(f->architecture(), "llama");
    EXPECT_EQ(f->view().n_tensors, 0u);
    EXPECT_EQ(f->require_string("tokenizer.ggml.model"), "llama");
    EXPECT_EQ(f->require_string("tokenizer.ggml.pre"), "default");
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 32000u);
    EXPECT_EQ(f->get_f32_array("tokenizer.ggml.scores").size(), 32000u);
    EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), std::optional<bool>(true));
}

TEST(GgufReal, VocabPhi3) {
    auto f = ModelFile::open(data("vocab/ggml-vocab-phi-3.gguf"));
    EXPECT_EQ(f->architecture(), "phi3");
    auto tokens = f->get_string_array("tokenizer.ggml.tokens");
    ASSERT_EQ(tokens.size(), 32064u);
    EXPECT_EQ(to_sv(tokens[32000]), "<|endoftext|>");
    EXPECT_EQ(to_sv(tokens[32007]), "<|end|>");
    EXPECT_EQ(f->require_uint("tokenizer.ggml.eos_token_id"), 32000u);
    EXPECT_TRUE(f->get_string("tokenizer.chat_template").has_value());
    EXPECT_EQ(f->require_uint("phi3.block_count"), 32u);
    EXPECT_EQ(f->require_uint("phi3.embedding_length"), 3072u);
    EXPECT_EQ(f->require_uint("phi3.feed_forward_length"), 8192u);
    EXPECT_EQ(f->require_uint("phi3.rope.dimension_count"), 96u);
    EXPECT_EQ(f->require_uint("phi3.context_length"), 4096u);
}

TEST(GgufReal, TypedGettersRejectWrongTypes) {
    auto f = ModelFile::open(data("models/stories260K.gguf"));
    EXPECT_THROW(f->get_uint("general.architecture"), eh::Error);
    EXPECT_THROW(f->get_string("llama.block_count"), eh::Error);
    EXPECT_THROW(f->get_f32_array("tokenizer.ggml.tokens"), eh::Error);
    EXPECT_THROW(f->require_uint("no.such.key"), eh::Error);
    EXPECT_FALSE(f->get_uint("no.such.key").has_value());
    EXPECT_TRUE(f->get_string_array("no.such.key").empty());
}

TEST(GgufReal, MissingPath) {
    try {
        ModelFile::open("/nonexistent/model.gguf");
        FAIL();
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), eh::Code::ModelLoadFailed);
        EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
    }
}

}  // namespace
