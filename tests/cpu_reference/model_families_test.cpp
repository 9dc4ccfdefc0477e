// Architecture details of the Llama-family variants people serve: Qwen3's
// QK-norm, Llama 3.x RoPE scaling (GGUF rope_freqs tensor or HF "llama3"
// parameters) and the refusals that guard them. Correctness against
// transformers is hf_reference_test.cpp's job (llama3, mistral, qwen3).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <engine_host/rope_scaling.hpp>

#include "plugin_handle.hpp"
#include "synthetic_model.hpp"

using namespace cpuref_test;

namespace {

const std::vector<int32_t> kTokens = {1, 7, 3, 12, 40, 5, 9, 33, 2, 17, 21, 60};

std::string load_error(const eh_model_view* view) {
    eh_load_params lp = load_params(view);
    eh_model* m = nullptr;
    if (plugin().model_load(&lp, &m) == EH_OK) {
        plugin().model_release(m);
        return "";
    }
    return plugin().plugin_last_error();
}

// Llama 3.1's parameters, with an original context small enough that a
// head dim of 64 at theta 10000 has pairs in all three bands.
ehp::Llama3Rope small_llama3() {
    ehp::Llama3Rope r;
    r.factor = 8.0;
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.original_context = 64.0;
    return r;
}

}  // namespace

TEST(Llama3Rope, FactorsFollowTheThreeBands) {
    const std::vector<float> f = ehp::llama3_rope_factors(64, 10000.0, small_llama3());
    ASSERT_EQ(f.size(), 32u);
    EXPECT_FLOAT_EQ(f.front(), 1.0f);  // short wavelengths kept
    EXPECT_FLOAT_EQ(f.back(), 8.0f);   // long ones divided by the factor
    bool between = false;
    for (size_t i = 1; i < f.size(); ++i) {
        EXPECT_GE(f[i], f[i - 1]);
        between = between || (f[i] > 1.0f && f[i] < 8.0f);
    }
    EXPECT_TRUE(between);  // and a smooth band between
}

// The same weights as a GGUF with the converter's rope_freqs tensor and as
// an HF checkpoint with rope_type llama3 parameters give the same logits;
// without the scaling they differ.
TEST(Llama3Rope, HfParametersEqualRopeFreqsTensor) {
    TinySpec sp;
    auto gguf = make_tiny(sp);
    gguf->tensor("rope_freqs.weight", EH_TYPE_F32, {32}, ehp::llama3_rope_factors(64, 10000.0, small_llama3()));
    sp.safetensors = true;
    auto hf = make_tiny(sp);
    hf->str("llama.rope.scaling.type", "llama3");
    hf->f32("llama.rope.scaling.factor", 8.0);
    hf->u32("llama.rope.scaling.original_context_length", 64);
    hf->f32("hf.rope_parameters.low_freq_factor", 1.0);
    hf->f32("hf.rope_parameters.high_freq_factor", 4.0);
    sp.safetensors = false;
    auto plain = make_tiny(sp);

    Loaded a(gguf->view(), 32), b(hf->view(), 32), c(plain->view(), 32);
    std::vector<float> la, lb, lc;
    for (int32_t t : kTokens) {
        la = a.prefill({t});
        lb = b.prefill({t});
        lc = c.prefill({t});
    }
    EXPECT_LT(max_abs_diff(la, lb), 1e-4f * max_abs(la));
    EXPECT_GT(max_abs_diff(la, lc), 1e-3f * max_abs(la));
}

TEST(Llama3Rope, MalformedRopeFreqsAreRefused) {
    TinySpec sp;
    auto v = make_tiny(sp);
    v->tensor("rope_freqs.weight", EH_TYPE_F32, {31}, std::vector<float>(31, 1.0f));
    EXPECT_NE(load_error(v->view()).find("rope_freqs.weight"), std::string::npos);
    v->remove("rope_freqs.weight");
    std::vector<float> bad(32, 1.0f);
    bad[3] = 0.0f;
    v->tensor("rope_freqs.weight", EH_TYPE_F32, {32}, bad);
    EXPECT_NE(load_error(v->view()).find("not a positive number"), std::string::npos);
}

TEST(Qwen3, QkNormIsRequiredAndApplied) {
    TinySpec sp;
    sp.arch = "qwen3";
    auto with = make_tiny(sp);
    EXPECT_EQ(load_error(with->view()), "");
    // The norms matter: scaling a head's norm weights changes the logits.
    auto scaled = make_tiny(sp);
    eh_tensor* t = scaled->find("blk.0.attn_q_norm.weight");
    ASSERT_NE(t, nullptr);
    std::vector<float> w(64, 3.0f);
    scaled->remove("blk.0.attn_q_norm.weight");
    scaled->tensor("blk.0.attn_q_norm.weight", EH_TYPE_F32, {64}, w);
    Loaded a(with->view(), 16), b(scaled->view(), 16);
    const std::vector<float> la = a.prefill(kTokens), lb = b.prefill(kTokens);
    EXPECT_GT(max_abs_diff(la, lb), 1e-3f * max_abs(la));

    auto without = make_tiny(sp);
    without->remove("blk.1.attn_k_norm.weight");
    EXPECT_NE(load_error(without->view()).find("missing tensor 'blk.1.attn_k_norm.weight'"), std::string::npos);
}

TEST(RopeScaling, UnknownTypeIsRefusedByName) {
    TinySpec sp;
    auto v = make_tiny(sp);
    v->str("llama.rope.scaling.type", "dynamic");
    EXPECT_NE(load_error(v->view()).find("'dynamic' is not supported"), std::string::npos);
}
