// llama-cuda's final hidden states (ABI 1.5 EH_STEP_HIDDEN: what
// /v1/embeddings and /v1/rerank read) against the CPU reference plugin's on
// forged tiny files of its architectures (Qwen3 first: Qwen3-Embedding and
// Qwen3-Reranker are qwen3): cosine >= 0.9999, issue 49's embedding target,
// for inputs of 1 to 200 tokens in one step that samples nothing, and for
// decode entries that sample too (a step that would otherwise replay a
// captured graph), between decode steps that replay the forward pass's
// captured graph: every step's logits against the reference. A step that does not ask drops the state, and a step
// begun behind another may not ask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>


#include "forged_profile.hpp"
#include "plugin_pair.hpp"
#include "pool_shape.hpp"
#include "step_seq.hpp"

namespace {

const eh_plugin_api* gpu_api() { return ehtest::llama_cuda_api(); }
const eh_plugin_api* cpu_api() { return ehtest::cpu_reference_api(); }

#define REQUIRE_BOTH()                                                \
    REQUIRE_PLUGIN_PAIR(gpu_api(), "llama-cuda plugin not loadable"); \
    ASSERT_NE(gpu_api()->seq_hidden, nullptr) << "llama-cuda exports no seq_hidden"

// A forged profile (synthetic vocabulary), made once per process.
const eh_model_view* view_of(const std::string& profile) {
    return &ehtest::forged_file("hidden_cuda_test", profile, 11).view();
}

uint32_t vocab_of(const eh_plugin_api* api, const std::string& profile) {
    ehtest::StepModel m(api, view_of(profile), ehtest::one_seq(8));
    return ehtest::vocab_size(m);
}

using ehtest::tokens_of;

// seq_hidden's values, or empty (with a failure) when it has none.
std::vector<float> hidden_of(const ehtest::StepModel& m, eh_seq* s) {
    const float* h = nullptr;
    uint32_t n = 0;
    EXPECT_EQ(m.api->seq_hidden(s, &h, &n), EH_OK) << m.error();
    return h ? std::vector<float>(h, h + n) : std::vector<float>();
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size() || a.empty()) return -2;
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d += double(a[i]) * b[i];
        na += double(a[i]) * a[i];
        nb += double(b[i]) * b[i];
    }
    return na > 0 && nb > 0 ? d / std::sqrt(na * nb) : -2;
}
double norm(const std::vector<float>& a) {
    double n = 0;
    for (float x : a) n += double(x) * x;
    return std::sqrt(n);
}

ehtest::KvShape shape() { return ehtest::pool_shape(8, 256, 1024); }

// The CPU reference's hidden state after `prompt` (one step, nothing sampled).
std::vector<float> reference_hidden(const std::string& profile, const std::vector<int32_t>& prompt) {
    ehtest::StepModel cpu(cpu_api(), view_of(profile), shape(), nullptr, profile.c_str());
    EXPECT_TRUE(cpu.ok()) << cpu.failure;
    eh_seq* s = nullptr;
    EXPECT_EQ(cpu.api->seq_create(cpu.model, &s), EH_OK) << cpu.error();
    cpu.seqs.push_back(s);
    eh_step_entry e = ehtest::step_entry(s, prompt.data(), uint32_t(prompt.size()), EH_STEP_HIDDEN);
    EXPECT_EQ(cpu.api->step(cpu.model, &e, 1), EH_OK) << cpu.error();
    return hidden_of(cpu, s);
}

constexpr double kMinCosine = 0.9999;  // issue 49's embedding target

class HiddenState : public ::testing::TestWithParam<std::string> {};

// Five inputs of 1 to 200 tokens in one step, none with a sampler (an
// embeddings request's shape), each against the reference.
TEST_P(HiddenState, ManyInputsInOneStepMatchTheReference) {
    REQUIRE_BOTH();
    const std::string& profile = GetParam();
    const uint32_t vocab = vocab_of(cpu_api(), profile);
    const std::vector<size_t> lens = {1, 7, 64, 130, 200};
    std::vector<std::vector<int32_t>> inputs;
    for (size_t i = 0; i < lens.size(); ++i) inputs.push_back(tokens_of(lens[i], uint32_t(i + 1), vocab));

    ehtest::StepModel gpu(gpu_api(), view_of(profile), shape(), nullptr, profile.c_str());
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    std::vector<eh_seq*> seqs;
    std::vector<eh_step_entry> es;
    for (const auto& in : inputs) {
        eh_seq* s = nullptr;
        ASSERT_EQ(gpu.api->seq_create(gpu.model, &s), EH_OK) << gpu.error();
        gpu.seqs.push_back(s);  // no sampler: EH_STEP_HIDDEN needs none
        seqs.push_back(s);
        es.push_back(ehtest::step_entry(s, in.data(), uint32_t(in.size()), EH_STEP_HIDDEN));
    }
    ASSERT_EQ(gpu.api->step(gpu.model, es.data(), uint32_t(es.size())), EH_OK) << gpu.error();
    double worst = 1;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const std::vector<float> got = hidden_of(gpu, seqs[i]), ref = reference_hidden(profile, inputs[i]);
        ASSERT_EQ(got.size(), ref.size()) << "input " << i;
        const double c = cosine(got, ref);
        worst = std::min(worst, c);
        EXPECT_GE(c, kMinCosine) << "input " << i << " (" << lens[i] << " tokens)";
        EXPECT_NEAR(norm(got) / norm(ref), 1.0, 1e-2) << "input " << i;
        EXPECT_EQ(gpu.api->seq_length(seqs[i]), lens[i]);
    }
    std::printf("[hidden-gpu] %s: %zu inputs in one step, worst cosine vs cpu-reference %.7f\n", profile.c_str(),
                inputs.size(), worst);
    // The same input alone: the state does not depend on the rest of the step.
    eh_seq* alone = nullptr;
    ASSERT_EQ(gpu.api->seq_create(gpu.model, &alone), EH_OK) << gpu.error();
    gpu.seqs.push_back(alone);
    eh_step_entry e = ehtest::step_entry(alone, inputs[3].data(), uint32_t(inputs[3].size()), EH_STEP_HIDDEN);
    ASSERT_EQ(gpu.api->step(gpu.model, &e, 1), EH_OK) << gpu.error();
    EXPECT_GE(cosine(hidden_of(gpu, alone), hidden_of(gpu, seqs[3])), 0.99999);
    // A step that does not ask drops it; seq_truncate too.
    const int32_t next = 5;
    e = ehtest::step_entry(alone, &next, 1, 0u);
    ASSERT_EQ(gpu.api->step(gpu.model, &e, 1), EH_OK) << gpu.error();
    const float* h = nullptr;
    uint32_t n = 0;
    EXPECT_EQ(gpu.api->seq_hidden(alone, &h, &n), EH_INVALID_ARGUMENT);
    ASSERT_EQ(gpu.api->seq_truncate(seqs[0], 0), EH_OK) << gpu.error();
    EXPECT_EQ(gpu.api->seq_hidden(seqs[0], &h, &n), EH_INVALID_ARGUMENT);
}

// Decode entries that sample and ask (SAMPLE | HIDDEN, one token each: a
// step of the captured graphs' shape, which runs eagerly instead) between
// decode steps that do not ask (their bucket's captured graph): the hidden
// states and every step's logits against the reference.
TEST_P(HiddenState, DecodeEntriesAskingBesideSamplingKeepTheGraphsRight) {
    REQUIRE_BOTH();
    const std::string& profile = GetParam();
    const uint32_t vocab = vocab_of(cpu_api(), profile);
    const std::vector<int32_t> a = tokens_of(40, 3, vocab), b = tokens_of(25, 4, vocab);
    constexpr size_t kPrompt = 20;
    ehtest::StepModel gpu(gpu_api(), view_of(profile), shape(), nullptr, profile.c_str());
    ehtest::StepModel cpu(cpu_api(), view_of(profile), shape(), nullptr, profile.c_str());
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    ASSERT_TRUE(cpu.ok()) << cpu.failure;
    eh_seq* g[2] = {gpu.create(), gpu.create()};
    eh_seq* c[2] = {cpu.create(), cpu.create()};
    const std::vector<int32_t>* toks[2] = {&a, &b};
    for (int i = 0; i < 2; ++i) {
        eh_step_entry eg = ehtest::step_entry(g[i], toks[i]->data(), kPrompt, 0u);
        eh_step_entry ec = ehtest::step_entry(c[i], toks[i]->data(), kPrompt, 0u);
        ASSERT_EQ(gpu.api->step(gpu.model, &eg, 1), EH_OK) << gpu.error();
        ASSERT_EQ(cpu.api->step(cpu.model, &ec, 1), EH_OK) << cpu.error();
    }
    double worst_hidden = 1, worst_logits = 0;
    for (size_t p = kPrompt; p < b.size(); ++p) {
        // Odd positions ask for the hidden state beside sampling; even ones are plain.
        const uint32_t flags = EH_STEP_SAMPLE | EH_STEP_LOGITS | ((p % 2) ? EH_STEP_HIDDEN : 0u);
        std::vector<eh_step_entry> eg, ec;
        for (int i = 0; i < 2; ++i) {
            eg.push_back(ehtest::step_entry(g[i], toks[i]->data() + p, 1, flags));
            ec.push_back(ehtest::step_entry(c[i], toks[i]->data() + p, 1, flags));
        }
        ASSERT_EQ(gpu.api->step(gpu.model, eg.data(), 2), EH_OK) << gpu.error();
        ASSERT_EQ(cpu.api->step(cpu.model, ec.data(), 2), EH_OK) << cpu.error();
        for (int i = 0; i < 2; ++i) {
            const std::vector<float> lg = gpu.logits(g[i]), lc = cpu.logits(c[i]);
            double mx = 1e-6, err = 0;
            for (size_t k = 0; k < lc.size() && k < lg.size(); ++k) {
                mx = std::max(mx, double(std::fabs(lc[k])));
                err = std::max(err, double(std::fabs(lg[k] - lc[k])));
            }
            worst_logits = std::max(worst_logits, err / mx);
            EXPECT_LT(err / mx, 3e-2) << "sequence " << i << " position " << p;
            const float* h = nullptr;
            uint32_t n = 0;
            if (p % 2) {
                const double cs = cosine(hidden_of(gpu, g[i]), hidden_of(cpu, c[i]));
                worst_hidden = std::min(worst_hidden, cs);
                EXPECT_GE(cs, kMinCosine) << "sequence " << i << " position " << p;
            } else {
                EXPECT_EQ(gpu.api->seq_hidden(g[i], &h, &n), EH_INVALID_ARGUMENT) << "position " << p;
            }
        }
    }
    std::printf("[hidden-gpu] %s: decode steps asking beside sampling: worst cosine %.7f, worst logits %.2e\n",
                profile.c_str(), worst_hidden, worst_logits);
}

// step_begin: a step begun behind one in flight may not ask (ABI 1.5), and
// is refused with nothing changed; one begun alone may.
TEST_P(HiddenState, NotBehindAStepInFlight) {
    REQUIRE_BOTH();
    const std::string& profile = GetParam();
    const std::vector<int32_t> p = tokens_of(12, 9, vocab_of(cpu_api(), profile));
    ehtest::StepModel gpu(gpu_api(), view_of(profile), shape(), nullptr, profile.c_str());
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    eh_seq* s = gpu.create();
    eh_seq* t = gpu.create();
    eh_step_entry e = ehtest::step_entry(s, p.data(), 12, EH_STEP_SAMPLE | EH_STEP_HIDDEN);
    ASSERT_EQ(gpu.api->step_begin(gpu.model, &e, 1), EH_OK) << gpu.error();
    eh_step_entry behind = ehtest::step_entry(t, p.data(), 4, EH_STEP_HIDDEN);
    EXPECT_EQ(gpu.api->step_begin(gpu.model, &behind, 1), EH_INVALID_ARGUMENT);
    EXPECT_NE(gpu.error().find("EH_STEP_HIDDEN on a step begun while another is in flight"), std::string::npos)
        << gpu.error();
    int32_t out = -1;
    ASSERT_EQ(gpu.api->step_end(gpu.model, &out, 1), EH_OK) << gpu.error();
    EXPECT_GE(out, 0);
    EXPECT_EQ(gpu.api->seq_length(t), 0u);
    EXPECT_GE(cosine(hidden_of(gpu, s), reference_hidden(profile, p)), kMinCosine);
}

INSTANTIATE_TEST_SUITE_P(Profiles, HiddenState,
                         ::testing::Values("tiny-qwen3-q4_k_m", "tiny-llama-3.1-q4_k_m", "tiny-gemma-3-q4_k_m"),
                         [](const auto& i) {
                             std::string n = i.param;
                             for (char& ch : n)
                                 if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                             return n;
                         });

}  // namespace
