// The batched ABI (1.2) of the CPU reference: on every architecture it
// serves, a sequence's logits are bit-identical whether it runs alone, in a
// batch, in prefill chunks, or through the 1.0 session calls. What the ABI
// asks of every plugin (forks, KV_FULL, invalid steps, masks and biases, the
// step halves, load progress) is eh-plugin-check's, run on this plugin by
// the ctest plugin_check.cpu_reference (tests/plugin_check).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "batched_model.hpp"
#include "plugin_handle.hpp"
#include "synthetic_model.hpp"

namespace {

using namespace cpuref_test;

using Batched = BatchedModel;

std::vector<int32_t> prompt(uint32_t n, uint32_t salt, uint32_t vocab) {
    std::vector<int32_t> p(n);
    for (uint32_t i = 0; i < n; ++i) p[i] = int32_t((i * 7 + salt * 13 + 1) % vocab);
    return p;
}

// Per position: the sampled token and the logits it came from.
struct Trace {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
};

constexpr int kDecode = 6;

// Each prompt alone: whole prompt, then kDecode single-token steps.
Trace run_alone(const eh_model_view* view, const std::vector<int32_t>& p) {
    Batched b(view);
    eh_seq* s = b.create();
    Trace t;
    eh_step_entry e = entry(s, p.data(), uint32_t(p.size()));
    EXPECT_EQ(plugin().step(b.model, &e, 1), EH_OK) << b.error();
    for (int i = 0; i <= kDecode; ++i) {
        t.tokens.push_back(e.token);
        t.logits.push_back(b.logits(s));
        if (i == kDecode) break;
        int32_t tok = e.token;
        e = entry(s, &tok, 1);
        EXPECT_EQ(plugin().step(b.model, &e, 1), EH_OK) << b.error();
    }
    return t;
}

// All prompts together; prefill in chunks of `chunk` tokens (0 = whole),
// mixed with the decodes of sequences already past their prompt.
std::vector<Trace> run_batched(const eh_model_view* view, const std::vector<std::vector<int32_t>>& prompts,
                               uint32_t chunk) {
    Batched b(view);
    const size_t n = prompts.size();
    std::vector<eh_seq*> s(n);
    std::vector<size_t> fed(n, 0);
    std::vector<int32_t> next(n, -1);
    std::vector<Trace> out(n);
    for (size_t i = 0; i < n; ++i) s[i] = b.create();
    for (int guard = 0; guard < 1000; ++guard) {
        std::vector<eh_step_entry> es;
        std::vector<size_t> who;
        for (size_t i = 0; i < n; ++i) {
            if (out[i].tokens.size() > size_t(kDecode)) continue;
            if (fed[i] < prompts[i].size()) {
                const size_t left = prompts[i].size() - fed[i];
                const uint32_t k = uint32_t(chunk ? std::min<size_t>(chunk, left) : left);
                const bool last = fed[i] + k == prompts[i].size();
                es.push_back(entry(s[i], prompts[i].data() + fed[i], k, last ? EH_STEP_SAMPLE | EH_STEP_LOGITS : 0));
                fed[i] += k;
            } else {
                es.push_back(entry(s[i], &next[i], 1));
            }
            who.push_back(i);
        }
        if (es.empty()) break;
        EXPECT_EQ(plugin().step(b.model, es.data(), uint32_t(es.size())), EH_OK) << b.error();
        for (size_t j = 0; j < es.size(); ++j) {
            const size_t i = who[j];
            if (!(es[j].flags & EH_STEP_SAMPLE)) {
                EXPECT_EQ(es[j].token, -1);
                continue;
            }
            out[i].tokens.push_back(es[j].token);
            out[i].logits.push_back(b.logits(s[i]));
            next[i] = es[j].token;
        }
    }
    return out;
}

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, AloneBatchedChunkedAndSessionGiveEqualBits) {
    TinySpec sp;
    sp.arch = GetParam();
    sp.n_embd = 128;
    sp.n_ff = 128;
    if (sp.arch == "phi3" || sp.arch == "gpt-oss") sp.window = 8;
    auto view = make_tiny(sp);
    const std::vector<std::vector<int32_t>> prompts = {prompt(13, 1, sp.n_vocab), prompt(29, 2, sp.n_vocab),
                                                       prompt(5, 3, sp.n_vocab), prompt(17, 4, sp.n_vocab)};
    std::vector<Trace> alone;
    for (const auto& p : prompts) alone.push_back(run_alone(view->view(), p));
    for (uint32_t chunk : {0u, 4u, 16u}) {
        SCOPED_TRACE("prefill chunk " + std::to_string(chunk));
        auto batched = run_batched(view->view(), prompts, chunk);
        for (size_t i = 0; i < prompts.size(); ++i) {
            ASSERT_EQ(batched[i].tokens, alone[i].tokens) << "sequence " << i;
            for (size_t k = 0; k < alone[i].logits.size(); ++k)
                EXPECT_TRUE(same_bits(batched[i].logits[k], alone[i].logits[k])) << "sequence " << i << " position " << k;
        }
    }
    // The 1.0 session calls run the same forward pass.
    for (size_t i = 0; i < prompts.size(); ++i) {
        Loaded l(view->view(), 64);
        std::vector<float> lg = l.prefill(prompts[i]);
        EXPECT_TRUE(same_bits(lg, alone[i].logits[0])) << "sequence " << i;
        int32_t tok = -1;
        ASSERT_EQ(plugin().session_sample(l.session, &tok), EH_OK);
        EXPECT_EQ(tok, alone[i].tokens[0]);
        ASSERT_EQ(plugin().session_decode(l.session, tok, &tok), EH_OK);
        EXPECT_EQ(tok, alone[i].tokens[1]);
        EXPECT_TRUE(same_bits(l.logits(), alone[i].logits[1]));
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, BatchInvariance, ::testing::Values("llama", "qwen2", "phi3", "gpt2", "gpt-oss"),
                         [](const auto& info) {
                             std::string n = info.param;
                             for (char& c : n)
                                 if (c == '-') c = '_';
                             return n;
                         });

}  // namespace
