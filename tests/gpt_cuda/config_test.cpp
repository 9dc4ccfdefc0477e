// gpt-cuda's configuration reader (host code, no GPU): what it takes from a
// qwen3moe file and what it refuses, beside gpt-oss's, on metadata-only GGUF
// images written here.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include <eh/model/gguf_writer.hpp>
#include <eh/model/model_file.hpp>
#include <ehcuda/moe.hpp>

#include "config.hpp"

namespace {

using eh::model::GgufValue;
using eh::model::GgufWriter;

// The metadata of a tiny MoE of `arch` (Qwen3-30B-A3B's keys at toy size).
GgufWriter moe_keys(const std::string& arch, uint32_t used = 2) {
    GgufWriter w;
    w.set("general.architecture", GgufValue::string(arch));
    const std::string a = arch + ".";
    w.set(a + "embedding_length", GgufValue::u32(256));
    w.set(a + "block_count", GgufValue::u32(2));
    w.set(a + "attention.head_count", GgufValue::u32(4));
    w.set(a + "attention.head_count_kv", GgufValue::u32(2));
    w.set(a + "attention.key_length", GgufValue::u32(128));
    w.set(a + "attention.value_length", GgufValue::u32(128));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(1e-6f));
    w.set(a + "rope.freq_base", GgufValue::f32(1000000.0f));
    w.set(a + "expert_count", GgufValue::u32(8));
    w.set(a + "expert_used_count", GgufValue::u32(used));
    w.set(a + "expert_feed_forward_length", GgufValue::u32(256));
    return w;
}

gpt_cuda::Config read(const GgufWriter& w) {
    const auto bytes = w.to_bytes();
    auto file = eh::model::ModelFile::open_gguf_buffer(bytes.data(), bytes.size());
    return gpt_cuda::read_config(ehp::ModelView(&file->view()));
}

// The status and message read_config throws with.
std::pair<eh_status, std::string> refusal(const GgufWriter& w) {
    try {
        read(w);
    } catch (const ehp::Error& e) {
        return {e.status(), e.what()};
    }
    ADD_FAILURE() << "read_config accepted it";
    return {EH_OK, ""};
}

TEST(GptCudaConfig, Qwen3MoeTakesQkNormAndThePlainSwiGlu) {
    const gpt_cuda::Config c = read(moe_keys("qwen3moe"));
    EXPECT_EQ(c.arch, gpt_cuda::Arch::Qwen3Moe);
    EXPECT_TRUE(c.moe());
    EXPECT_TRUE(c.qk_norm);
    EXPECT_EQ(c.swiglu_alpha, ehcuda::kPlainSwiGlu);
    EXPECT_EQ(c.sliding_window, 0);
    EXPECT_EQ(c.layer_window(0), 0);
    EXPECT_EQ(c.n_expert, 8);
    EXPECT_EQ(c.n_expert_used, 2);
    EXPECT_EQ(c.n_ff_exp, 256);
    EXPECT_EQ(c.q_dim(), 512);  // head dim 128 on a 256 hidden
    EXPECT_EQ(c.n_rot, 128);
    ASSERT_EQ(c.inv_freq.size(), 64u);
    EXPECT_FLOAT_EQ(c.inv_freq[1], float(std::pow(1e6, -2.0 / 128)));
    EXPECT_FLOAT_EQ(c.attn_factor, 1.0f);
}

TEST(GptCudaConfig, GptOssKeepsItsClampedSwiGluAndWindow) {
    GgufWriter w = moe_keys("gpt-oss");
    w.set("gpt-oss.attention.sliding_window", GgufValue::u32(128));
    const gpt_cuda::Config c = read(w);
    EXPECT_EQ(c.arch, gpt_cuda::Arch::GptOss);
    EXPECT_FALSE(c.qk_norm);
    EXPECT_FLOAT_EQ(c.swiglu_alpha, 1.702f);
    EXPECT_EQ(c.layer_window(0), 128);
    EXPECT_EQ(c.layer_window(1), 0);
}

TEST(GptCudaConfig, RefusesWhatItWouldComputeWrong) {
    GgufWriter window = moe_keys("qwen3moe");
    window.set("qwen3moe.attention.sliding_window", GgufValue::u32(4096));
    auto [s1, m1] = refusal(window);
    EXPECT_EQ(s1, EH_UNSUPPORTED);
    EXPECT_NE(m1.find("qwen3moe.attention.sliding_window is not supported for qwen3moe"), std::string::npos) << m1;

    GgufWriter zero = moe_keys("qwen3moe");  // a window of 0 is no window
    zero.set("qwen3moe.attention.sliding_window", GgufValue::u32(0));
    EXPECT_EQ(read(zero).sliding_window, 0);

    auto [s2, m2] = refusal(moe_keys("llama"));
    EXPECT_EQ(s2, EH_UNSUPPORTED);
    EXPECT_NE(m2.find("gpt-cuda does not serve architecture 'llama' (gpt2, gpt-oss, qwen3moe)"), std::string::npos) << m2;

    auto [s3, m3] = refusal(moe_keys("qwen3moe", 9));  // more experts a token than there are
    EXPECT_EQ(s3, EH_MODEL_LOAD_FAILED);
    EXPECT_NE(m3.find("expert_used_count"), std::string::npos) << m3;
}

// The host names an HF directory's experts per expert (or fused gate_up):
// without this refusal the load failed on "missing tensor
// 'blk.0.ffn_gate_inp.weight'", which says nothing of the cause.
TEST(GptCudaConfig, RefusesAQwen3MoeHuggingFaceCheckpointByName) {
    GgufWriter hf = moe_keys("qwen3moe");
    hf.set("general.source_format", GgufValue::string("safetensors"));
    auto [s, m] = refusal(hf);
    EXPECT_EQ(s, EH_UNSUPPORTED);
    EXPECT_NE(m.find("qwen3moe from a Hugging Face directory is not supported by gpt-cuda"), std::string::npos) << m;

    GgufWriter oss = moe_keys("gpt-oss");  // gpt-oss's HF experts are named by the host
    oss.set("general.source_format", GgufValue::string("safetensors"));
    EXPECT_EQ(read(oss).arch, gpt_cuda::Arch::GptOss);
}

}  // namespace
