// Each profile's per-tensor types must reproduce the census of the real
// file it imitates (docs/forge.md). These run on the specs only: the real
// profiles are far too big to write in CI.
#include <gtest/gtest.h>

#include <engine_host/plugin_abi.h>

#include "eh/tools/profiles.hpp"
#include "eh/tools/recipe.hpp"

using eh::tools::census;
using eh::tools::find_profile;
using Census = std::map<std::string, int>;

namespace {
Census of(const std::string& name) {
    auto p = find_profile(name);
    return census(p.tensors(p.n_vocab));
}
}  // namespace

TEST(Census, Qwen25_05B_Q4_K_M) {
    // llama.cpp's log of the real file: f32 121, q5_0 132, q8_0 13, q4_K 12, q6_K 12
    EXPECT_EQ(of("qwen2.5-0.5b-instruct-q4_k_m"),
              (Census{{"F32", 121}, {"Q5_0", 132}, {"Q8_0", 13}, {"Q4_K", 12}, {"Q6_K", 12}}));
}

TEST(Census, Phi3Mini4k_Q4_K_M) {
    EXPECT_EQ(of("phi-3-mini-4k-instruct-q4_k_m"), (Census{{"F32", 65}, {"Q4_K", 81}, {"Q5_K", 32}, {"Q6_K", 17}}));
}

TEST(Census, GptOss20b_MXFP4) {
    EXPECT_EQ(of("gpt-oss-20b-mxfp4"), (Census{{"F32", 289}, {"Q8_0", 98}, {"MXFP4", 72}}));
}

// Counted from llama.cpp's Q4_K_M rules (attn_v and ffn_down Q6_K on the
// "more bits" layers, the head Q6_K, everything else Q4_K): 32 layers give
// 16 + 16 + 1 Q6_K; F32 are the 65 norms and rope_freqs.
TEST(Census, Llama31_8B_Q4_K_M) {
    EXPECT_EQ(of("llama-3.1-8b-instruct-q4_k_m"), (Census{{"F32", 66}, {"Q4_K", 193}, {"Q6_K", 33}}));
}

// The same rules over 80 layers: 40 + 40 + 1 Q6_K, F32 the 161 norms and
// rope_freqs. (llama.cpp also lifts a 70B's other 40 attn_v to Q5_K; the
// recipe keeps them Q4_K, ~40 MB less.)
TEST(Census, Llama33_70B_Q4_K_M) {
    EXPECT_EQ(of("llama-3.3-70b-instruct-q4_k_m"), (Census{{"F32", 162}, {"Q4_K", 481}, {"Q6_K", 81}}));
}

// 36 layers: 18 + 18 + 1 Q6_K; F32 are 4 norms per layer (attn, ffn, q, k) + output_norm.
TEST(Census, Qwen3_8B_Q4_K_M) {
    EXPECT_EQ(of("qwen3-8b-q4_k_m"), (Census{{"F32", 145}, {"Q4_K", 217}, {"Q6_K", 37}}));
}

// The 20B's rules over 36 layers: 12 F32 per layer + output_norm, 4 Q8_0
// per layer + token_embd + output, 3 MXFP4 expert stacks per layer.
TEST(Census, GptOss120b_MXFP4) {
    EXPECT_EQ(of("gpt-oss-120b-mxfp4"), (Census{{"F32", 433}, {"Q8_0", 146}, {"MXFP4", 108}}));
}

// llama.cpp's Q4_K_M rules over 48 MoE layers: ffn_down_exps and attn_v
// Q6_K on the 24 "more bits" layers each, the head Q6_K; routers and norms
// F32 (5 per layer + output_norm).
TEST(Census, Qwen3_30B_A3B_Q4_K_M) {
    EXPECT_EQ(of("qwen3-30b-a3b-q4_k_m"), (Census{{"F32", 241}, {"Q4_K", 289}, {"Q6_K", 49}}));
}

TEST(Census, Gpt2) {
    EXPECT_EQ(of("gpt2-124m-f16"), (Census{{"F32", 99}, {"F16", 50}}));
    EXPECT_EQ(of("gpt2-124m-q8_0"), (Census{{"F32", 99}, {"Q8_0", 50}}));
}

TEST(Census, TinyProfilesExerciseTheSameRules) {
    EXPECT_EQ(of("tiny-qwen2.5-q4_k_m"), (Census{{"F32", 21}, {"Q5_0", 22}, {"Q8_0", 3}, {"Q4_K", 2}, {"Q6_K", 2}}));
    EXPECT_EQ(of("tiny-qwen2.5-vl-q4_k_m"), of("tiny-qwen2.5-q4_k_m"));  // the same tensors under qwen2vl
    EXPECT_EQ(of("tiny-phi-3-q4_k_m"), (Census{{"F32", 9}, {"Q4_K", 11}, {"Q5_K", 4}, {"Q6_K", 3}}));
    EXPECT_EQ(of("tiny-gpt-oss-mxfp4"), (Census{{"F32", 25}, {"Q8_0", 10}, {"MXFP4", 6}}));
    EXPECT_EQ(of("tiny-llama-3.1-q4_k_m"), (Census{{"F32", 6}, {"Q4_K", 13}, {"Q6_K", 3}}));
    EXPECT_EQ(of("tiny-qwen3-q4_k_m"), (Census{{"F32", 9}, {"Q4_K", 13}, {"Q6_K", 3}}));
    EXPECT_EQ(of("tiny-qwen3-moe-q4_k_m"), (Census{{"F32", 11}, {"Q4_K", 13}, {"Q6_K", 3}}));
    EXPECT_EQ(of("tiny-gpt2-f16"), (Census{{"F32", 19}, {"F16", 10}}));
    EXPECT_EQ(of("tiny-gpt2-q8_0"), (Census{{"F32", 19}, {"Q8_0", 10}}));
}

TEST(Recipe, PerTensorTypesOfQwen) {
    auto p = find_profile("qwen2.5-0.5b-instruct-q4_k_m");
    std::map<std::string, uint32_t> t;
    for (const auto& s : p.tensors(p.n_vocab)) t[s.name] = s.type;
    EXPECT_EQ(t["token_embd.weight"], EH_TYPE_Q8_0);   // tied head, 896 % 256 != 0
    EXPECT_EQ(t["blk.0.attn_v.weight"], EH_TYPE_Q8_0); // Q6_K fallback
    EXPECT_EQ(t["blk.3.attn_v.weight"], EH_TYPE_Q5_0); // Q4_K fallback
    EXPECT_EQ(t["blk.5.ffn_down.weight"], EH_TYPE_Q6_K);
    EXPECT_EQ(t["blk.4.ffn_down.weight"], EH_TYPE_Q4_K);
    EXPECT_EQ(t["blk.0.attn_q.bias"], EH_TYPE_F32);
    EXPECT_EQ(t.count("output.weight"), 0u);
}

TEST(Recipe, UseMoreBitsLayers) {
    std::vector<int> more;
    for (int i = 0; i < 24; ++i) if (eh::tools::use_more_bits(i, 24)) more.push_back(i);
    EXPECT_EQ(more, (std::vector<int>{0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23}));
}

TEST(Recipe, ParseTargets) {
    EXPECT_EQ(eh::tools::parse_quant_target("q4_k_m").recipe, eh::tools::Recipe::Q4_K_M);
    EXPECT_EQ(eh::tools::parse_quant_target("Q8_0").type, uint32_t(EH_TYPE_Q8_0));
    EXPECT_EQ(eh::tools::parse_quant_target("Q4_K_M").file_type(), 15u);
    EXPECT_THROW(eh::tools::parse_quant_target("Q3_K"), std::exception);
}

// Gemma 3 Q4_K_M from the same rules: 13 tensors a layer (6 norms F32, 7
// matrices) + token_embd (the tied head: Q6_K, Q8_0 when its rows do not
// split into 256-value blocks) + output_norm. attn_v and ffn_down Q6_K on
// the "more bits" layers (17 of 34, 24 of 48, 30 of 62).
TEST(Census, Gemma3_Q4_K_M) {
    EXPECT_EQ(of("gemma-3-4b-it-q4_k_m"), (Census{{"F32", 205}, {"Q4_K", 204}, {"Q6_K", 35}}));
    EXPECT_EQ(of("gemma-3-12b-it-q4_k_m"), (Census{{"F32", 289}, {"Q4_K", 288}, {"Q6_K", 49}}));
    EXPECT_EQ(of("gemma-3-27b-it-q4_k_m"), (Census{{"F32", 373}, {"Q4_K", 374}, {"Q6_K", 61}}));
    EXPECT_EQ(of("tiny-gemma-3-q4_k_m"), (Census{{"F32", 37}, {"Q4_K", 38}, {"Q6_K", 5}}));
    EXPECT_EQ(of("tiny-gemma-3-hd256-q4_k_m"), (Census{{"F32", 37}, {"Q4_K", 38}, {"Q6_K", 5}}));
}

// The 1B's hidden size (1152) is not a multiple of 256: the matrices that
// read it fall back (Q4_K -> Q5_0, Q6_K -> Q8_0), attn_output (1024 wide)
// and ffn_down (6912) keep K-quants. 13 of 26 layers get more bits.
TEST(Census, Gemma3_1B_Q4_K_M) {
    EXPECT_EQ(of("gemma-3-1b-it-q4_k_m"),
              (Census{{"F32", 157}, {"Q8_0", 14}, {"Q5_0", 117}, {"Q4_K", 39}, {"Q6_K", 13}}));
}

