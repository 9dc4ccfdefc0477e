// Gemma 3 on llama-cuda's batched step against the CPU reference plugin
// (checked against transformers) and against itself: every position's
// logits, teacher-forced, for sequences longer than the sliding window,
// alone and mixed with other sequences' prefill chunks and decodes. The
// forged files' windows (16, 32) are far shorter than the 100-token
// prompts, so a window that is not applied, or applied off by one, on any
// attention path shows: the tensor-core prefill (chunks of 64 tokens and
// more, head dim 64), the paged CUDA-core one (short chunks, and every
// chunk at head dim 256, which the 1B to 12B use), and the fused decode.
// Sliding and global layers take different RoPE bases (and the global
// ones linear scaling x8), so a swapped base shows too. Gemma's own kernels
// (gemma_ops.hpp) are checked alone against a host computation.
//
// KV precision: the batched pool is FP16, the CPU reference's cache FP32;
// the tolerances allow for that, and the printed lines say how far the
// logits and the top-1 token moved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/gemma_ops.hpp>

#include "forged_profile.hpp"
#include "logit_compare.hpp"
#include "plugin_pair.hpp"
#include "pool_shape.hpp"
#include "step_feed.hpp"
#include "step_seq.hpp"

namespace {

const eh_plugin_api* gpu_api() { return ehtest::llama_cuda_api(); }
const eh_plugin_api* cpu_api() { return ehtest::cpu_reference_api(); }

#define REQUIRE_BATCHED() REQUIRE_PLUGIN_PAIR(gpu_api(), "llama-cuda plugin not loadable")

// A forged profile (synthetic vocabulary), made once per process.
const eh_model_view* view_of(const std::string& profile) {
    return &ehtest::forged_file("gemma_cuda_test", profile, 7).view();
}

using ehtest::rel_err;
using ehtest::tokens_of;

uint32_t vocab_of(const std::string& profile) {
    ehtest::StepSeq cpu(cpu_api(), view_of(profile), ehtest::one_seq(8));
    return ehtest::vocab_size(cpu);
}

// The CPU reference's logits after each token (one token a step).
std::vector<std::vector<float>> reference_logits(const std::string& profile, const std::vector<int32_t>& toks) {
    ehtest::StepSeq cpu(cpu_api(), view_of(profile), ehtest::one_seq(uint32_t(toks.size())));
    EXPECT_TRUE(cpu.ok()) << cpu.failure;
    std::vector<std::vector<float>> out;
    for (int32_t t : toks) {
        EXPECT_EQ(cpu.decode(t), EH_OK) << cpu.error();
        out.push_back(cpu.logits());
    }
    return out;
}

// llama-cuda with kv_init done: 8 sequences of up to 256 tokens.
struct Batched : ehtest::StepModel {
    explicit Batched(const std::string& profile) : StepModel(gpu_api(), view_of(profile), shape(), nullptr, profile.c_str()) {
        EXPECT_TRUE(ok()) << failure;
    }
    static ehtest::KvShape shape() { return ehtest::pool_shape(8, 256); }
};

// Sequences fed teacher-forced, alone or in mixed steps (step_feed.hpp).
using ehtest::feed;
using ehtest::SeqLogits;

struct Case {
    std::string profile;
    int window;  // the profile's, for the count of positions past it
};

class GemmaBatchedStep : public ::testing::TestWithParam<Case> {};

// Each sequence alone (its 100-token prompt in one step), then all four
// together in mixes of prefill chunks (1, 7, 16 or 64 tokens: chunk
// boundaries on both sides of the window's, the 64s on the tensor cores
// at head dim 64) and decodes: every position against the CPU reference,
// and against the sequence's own logits alone.
TEST_P(GemmaBatchedStep, TeacherForcedLogitsMatchTheReferenceAloneAndInEveryMix) {
    REQUIRE_BATCHED();
    const Case& c = GetParam();
    const uint32_t vocab = vocab_of(c.profile);
    const std::vector<size_t> lens = {150, 40, 5, 136};
    constexpr size_t kPrompt = 100;
    ASSERT_LT(size_t(c.window), kPrompt);
    std::vector<std::vector<int32_t>> toks;
    std::vector<std::vector<std::vector<float>>> ref;
    for (size_t i = 0; i < lens.size(); ++i) {
        toks.push_back(tokens_of(lens[i], uint32_t(i), vocab));
        ref.push_back(reference_logits(c.profile, toks.back()));
    }
    SeqLogits alone(toks.size());
    {
        Batched b(c.profile);
        ASSERT_TRUE(b.model);
        for (size_t i = 0; i < toks.size(); ++i) alone[i] = feed(b, toks, kPrompt, 0, int(i))[i];
    }
    constexpr double kTol = 1e-2;  // of the largest |logit| (an FP16 KV pool against FP32)
    ehtest::MixTally t;
    t.tol = kTol;
    t.past_from = size_t(2 * c.window);
    t.against_reference(alone, ref);
    for (uint32_t chunk : {1u, 7u, 16u, 64u}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk));
        Batched b(c.profile);
        ASSERT_TRUE(b.model);
        const SeqLogits mixed = feed(b, toks, kPrompt, chunk);
        t.against_reference(mixed, ref);
        t.against_alone(mixed, alone);
    }
    ASSERT_FALSE(t.errs.empty());
    t.report("gemma-batch", c.profile, "2 x window");
    EXPECT_GT(t.n_ref, 300u);
    EXPECT_GT(t.past, 200u);
    t.expect_agreement();
}

INSTANTIATE_TEST_SUITE_P(Profiles, GemmaBatchedStep,
                         ::testing::Values(Case{"tiny-gemma-3-q4_k_m", 16}, Case{"tiny-gemma-3-hd256-q4_k_m", 32}),
                         [](const auto& info) {
                             std::string s = info.param.profile;
                             for (auto& ch : s)
                                 if (ch == '-' || ch == '.') ch = '_';
                             return s;
                         });

// The whole 100-token prompt in one step, then a decode: the same logits
// as the CPU reference's at both (the single-sequence path a chat takes).
TEST(GemmaStep, OnePromptStepThenDecodesMatchTheReference) {
    REQUIRE_BATCHED();
    const std::string profile = "tiny-gemma-3-q4_k_m";
    const auto toks = tokens_of(120, 9, vocab_of(profile));
    const auto ref = reference_logits(profile, toks);
    ehtest::StepSeq gpu(gpu_api(), view_of(profile), ehtest::one_seq(256));
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    ASSERT_EQ(gpu.prefill(toks.data(), 100), EH_OK) << gpu.error();
    EXPECT_LT(rel_err(gpu.logits(), ref[99]), 1e-2);
    for (size_t p = 100; p < toks.size(); ++p) {
        ASSERT_EQ(gpu.decode(toks[p]), EH_OK) << gpu.error();
        EXPECT_LT(rel_err(gpu.logits(), ref[p]), 1e-2) << "position " << p;
    }
}

// Gemma's kernels alone, against the host.
TEST(GemmaOps, KernelsMatchTheHost) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) GTEST_SKIP() << "no CUDA device";
    std::mt19937 rng{5};
    std::normal_distribution<float> nd(0.0f, 2.0f);
    const int n = 300, ntok = 3, n_ff = 200;
    auto up = [](const std::vector<float>& v) {
        ehcuda::DeviceBuffer b(v.size() * 4);
        cudaMemcpy(b.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice);
        return b;
    };
    auto down = [](const ehcuda::DeviceBuffer& b, size_t count) {
        std::vector<float> v(count);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        cudaMemcpy(v.data(), b.get(), count * 4, cudaMemcpyDeviceToHost);
        return v;
    };
    std::vector<float> h(static_cast<size_t>(n * ntok)), d(h.size()), w(static_cast<size_t>(n)),
        gu(static_cast<size_t>(2 * n_ff * ntok));
    for (auto* v : {&h, &d, &w, &gu})
        for (float& x : *v) x = nd(rng);
    // rmsnorm_add: h += d / rms(d) * w, for rows of float4s (a quad a
    // thread; two, past 4,096 features: Gemma 3 27B's 5,376) and of others
    for (const int nf : {n, 301, 5376}) {
        std::vector<float> hf(static_cast<size_t>(nf * ntok)), df(hf.size()), wf(static_cast<size_t>(nf));
        for (auto* v : {&hf, &df, &wf})
            for (float& x : *v) x = nd(rng);
        auto dh = up(hf), dd = up(df), dw = up(wf);
        ehcuda::rmsnorm_add(dh.as<float>(), dd.as<float>(), dw.as<float>(), nf, ntok, 1e-6f, nullptr);
        const auto got = down(dh, hf.size());
        for (int t = 0; t < ntok; ++t) {
            double ss = 0;
            for (int i = 0; i < nf; ++i) ss += double(df[size_t(t * nf + i)]) * df[size_t(t * nf + i)];
            const double sc = 1.0 / std::sqrt(ss / nf + 1e-6);
            for (int i = 0; i < nf; ++i) {
                const size_t k = size_t(t * nf + i);
                ASSERT_NEAR(got[k], hf[k] + df[k] * sc * wf[size_t(i)], 1e-4) << nf << ": " << t << "," << i;
            }
        }
    }
    {  // geglu_tanh: gate half = gelu_tanh(gate) * up
        auto dg = up(gu);
        ehcuda::geglu_tanh(dg.as<float>(), 2 * n_ff, n_ff, ntok, nullptr);
        const auto got = down(dg, gu.size());
        for (int t = 0; t < ntok; ++t)
            for (int k = 0; k < 2 * n_ff; ++k) {
                const size_t i = size_t(t * 2 * n_ff + k);
                double want = gu[i];  // the up half is left as it was
                if (k < n_ff) {
                    const double g = gu[i], u = gu[i + size_t(n_ff)];
                    want = 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
                }
                EXPECT_NEAR(got[i], want, 1e-4 * (1.0 + std::fabs(want))) << t << "," << k;
            }
    }
    {  // scale_floats and softcap_floats
        auto dh = up(h);
        ehcuda::scale_floats(dh.as<float>(), h.size(), 16.0f, nullptr);
        ehcuda::softcap_floats(dh.as<float>(), h.size(), 30.0f, nullptr);
        const auto got = down(dh, h.size());
        for (size_t i = 0; i < h.size(); ++i) EXPECT_NEAR(got[i], 30.0 * std::tanh(16.0 * h[i] / 30.0), 1e-4) << i;
    }
}

}  // namespace
