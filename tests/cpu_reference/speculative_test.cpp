// ABI 1.6's speculative verification (EH_STEP_VERIFY) on the CPU reference:
// greedy output is token for token what plain steps give, whatever the
// drafts, and rejected drafts leave no trace in the sequence; sampled output
// keeps the target's distribution (chi-square over seeded draws, with a
// threshold that a wrong acceptance rule fails); the flag's rules are
// enforced.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "eh/model/model_file.hpp"

#include "../../plugins/cpu-reference/src/sampler.hpp"
#include "batched_model.hpp"
#include "plugin_handle.hpp"
#include "synthetic_model.hpp"

namespace {

using namespace cpuref_test;

const std::string kStories = std::string(EH_TESTDATA_DIR) + "/models/stories260K.gguf";

eh_step_entry verify_entry(eh_seq* s, const std::vector<int32_t>& t) {
    return entry(s, t.data(), uint32_t(t.size()), EH_STEP_SAMPLE | EH_STEP_VERIFY);
}

std::vector<int32_t> prompt(uint32_t n, uint32_t vocab) {
    std::vector<int32_t> p(n);
    for (uint32_t i = 0; i < n; ++i) p[i] = int32_t((i * 7 + 3) % vocab);
    return p;
}

// Greedy, with whatever penalties a test sets (they read each position's history).
eh_sampling_params g_params = greedy_params();

eh_seq* sequence(BatchedModel& m) {
    eh_seq* s = m.create(false);
    EXPECT_EQ(plugin().seq_set_sampling(s, &g_params), EH_OK) << m.error();
    return s;
}

// n tokens after `p`, one plain step each.
std::vector<int32_t> plain(BatchedModel& m, const std::vector<int32_t>& p, uint32_t n) {
    eh_seq* s = sequence(m);
    eh_step_entry e = entry(s, p.data(), uint32_t(p.size()), EH_STEP_SAMPLE);
    EXPECT_EQ(plugin().step(m.model, &e, 1), EH_OK) << m.error();
    std::vector<int32_t> out{e.token};
    while (out.size() < n) {
        e = entry(s, &out.back(), 1, EH_STEP_SAMPLE);
        EXPECT_EQ(plugin().step(m.model, &e, 1), EH_OK) << m.error();
        out.push_back(e.token);
    }
    m.release(s);
    return out;
}

// The same n tokens through verify steps whose drafts are the true
// continuation with every `wrong`-th draft token replaced; checks each
// step's accepted count and the sequence's length as it goes.
std::vector<int32_t> speculated(BatchedModel& m, const std::vector<int32_t>& p, const std::vector<int32_t>& truth,
                                uint32_t k, uint32_t wrong, uint32_t vocab) {
    eh_seq* s = sequence(m);
    eh_step_entry e = entry(s, p.data(), uint32_t(p.size()), EH_STEP_SAMPLE);
    EXPECT_EQ(plugin().step(m.model, &e, 1), EH_OK) << m.error();
    std::vector<int32_t> out{e.token};
    uint32_t drafted = 0;
    while (out.size() < truth.size()) {
        std::vector<int32_t> t{out.back()};
        uint32_t first_wrong = k;
        for (uint32_t j = 0; j < k && out.size() + j < truth.size(); ++j) {
            int32_t d = truth[out.size() + j];
            if (wrong && ++drafted % wrong == 0) {
                d = (d + 1) % int32_t(vocab);
                first_wrong = std::min(first_wrong, j);
            }
            t.push_back(d);
        }
        const uint32_t len = plugin().seq_length(s);
        e = verify_entry(s, t);
        EXPECT_EQ(plugin().step(m.model, &e, 1), EH_OK) << m.error();
        const uint32_t want = std::min<uint32_t>(first_wrong, uint32_t(t.size() - 1));
        EXPECT_EQ(e.n_accepted, want);
        EXPECT_EQ(plugin().seq_length(s), len + 1 + e.n_accepted);  // the rejected left
        out.insert(out.end(), t.begin() + 1, t.begin() + 1 + e.n_accepted);
        out.push_back(e.token);
    }
    m.release(s);
    out.resize(truth.size());
    return out;
}

void greedy_matches(const eh_model_view* view, uint32_t vocab) {
    BatchedModel m(view);
    ASSERT_GE(m.kv.max_draft_tokens, 4u);
    const std::vector<int32_t> p = prompt(6, vocab);
    const std::vector<int32_t> truth = plain(m, p, 40);
    for (uint32_t k : {1u, 3u, 4u})
        for (uint32_t wrong : {0u, 2u, 3u, 5u})
            EXPECT_EQ(speculated(m, p, truth, k, wrong, vocab), truth) << "k " << k << ", every " << wrong << "th wrong";
}

TEST(Speculative, GreedyIsPlainDecodingWhateverTheDrafts) {
    TinySpec sp;
    sp.n_embd = 128;
    sp.n_ff = 128;
    auto view = make_tiny(sp);
    greedy_matches(view->view(), sp.n_vocab);
}

// Penalties read each position's own history: the repetition penalty over
// the tokens up to that draft, presence and frequency over the output up to
// it (a verify that read the whole entry's history would differ here).
TEST(Speculative, GreedyWithPenaltiesIsPlainDecodingToo) {
    TinySpec sp;
    sp.n_embd = 128;
    sp.n_ff = 128;
    auto view = make_tiny(sp);
    g_params.repetition_penalty = 1.8f;
    g_params.repetition_window = 6;
    g_params.presence_penalty = 0.7f;
    g_params.frequency_penalty = 0.4f;
    {
        BatchedModel m(view->view());
        const std::vector<int32_t> p = prompt(6, sp.n_vocab);
        const std::vector<int32_t> truth = plain(m, p, 40);
        g_params = greedy_params();
        EXPECT_NE(plain(m, p, 40), truth) << "the penalties change nothing here: the test would prove nothing";
        g_params.repetition_penalty = 1.8f;
        g_params.repetition_window = 6;
        g_params.presence_penalty = 0.7f;
        g_params.frequency_penalty = 0.4f;
        for (uint32_t k : {2u, 4u})
            for (uint32_t wrong : {0u, 3u})
                EXPECT_EQ(speculated(m, p, truth, k, wrong, sp.n_vocab), truth) << "k " << k << ", every " << wrong << "th wrong";
    }
    g_params = greedy_params();
}

TEST(Stories260KSpeculative, GreedyIsPlainDecodingWhateverTheDrafts) {
    if (!std::filesystem::exists(kStories)) GTEST_SKIP() << "missing " << kStories;
    auto file = eh::model::ModelFile::open(kStories);
    greedy_matches(&file->view(), 512);
}

TEST(Speculative, ItsRulesAreEnforced) {
    TinySpec sp;
    sp.n_embd = 128;
    sp.n_ff = 128;
    auto view = make_tiny(sp);
    BatchedModel m(view->view());
    eh_seq* s = m.create();
    const std::vector<int32_t> p = prompt(4, sp.n_vocab);
    eh_step_entry e = entry(s, p.data(), 4, EH_STEP_SAMPLE);
    ASSERT_EQ(plugin().step(m.model, &e, 1), EH_OK);
    const uint32_t len = plugin().seq_length(s);
    auto refused = [&](std::vector<int32_t> t, uint32_t flags, const char* why) {
        eh_step_entry v = entry(s, t.data(), uint32_t(t.size()), flags);
        EXPECT_EQ(plugin().step(m.model, &v, 1), EH_INVALID_ARGUMENT) << why;
        EXPECT_EQ(plugin().seq_length(s), len) << why;
    };
    refused({1}, EH_STEP_SAMPLE | EH_STEP_VERIFY, "no draft");
    refused({1, 2}, EH_STEP_VERIFY, "not sampled");
    refused({1, 2}, EH_STEP_SAMPLE | EH_STEP_LOGITS | EH_STEP_VERIFY, "with logits");
    refused(std::vector<int32_t>(m.kv.max_draft_tokens + 2, 1), EH_STEP_SAMPLE | EH_STEP_VERIFY, "too many drafts");
    // Together a step's verify entries carry at most max_step_entries drafts.
    eh_seq* s2 = m.create();
    e = entry(s2, p.data(), 4, EH_STEP_SAMPLE);
    ASSERT_EQ(plugin().step(m.model, &e, 1), EH_OK);
    const uint32_t half = m.kv.max_step_entries / 2 + 1;
    const std::vector<int32_t> many(half + 1, 1);
    eh_step_entry both[2] = {verify_entry(s, many), verify_entry(s2, many)};
    EXPECT_EQ(plugin().step(m.model, both, 2), EH_INVALID_ARGUMENT) << "drafts over max_step_entries";
    EXPECT_NE(m.error().find("more than max_step_entries"), std::string::npos) << m.error();
    EXPECT_EQ(plugin().seq_length(s), len);
    std::vector<int32_t> t{1, 2};
    eh_step_entry v = verify_entry(s, t);
    EXPECT_EQ(plugin().step_begin(m.model, &v, 1), EH_INVALID_ARGUMENT) << "step_begin";
    EXPECT_NE(m.error().find("step() only"), std::string::npos) << m.error();
    EXPECT_EQ(plugin().seq_length(s), len);
}

// ---- the distribution ------------------------------------------------------

// Pearson's chi-square of counts against probabilities, bins with an
// expected count below 5 merged into one; true when it stays under the
// 0.001 critical value (Wilson-Hilferty).
bool fits(const std::vector<uint32_t>& counts, const std::vector<double>& probs, uint32_t n, double* stat_out) {
    double stat = 0, rest_e = 0, rest_o = 0;
    int bins = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
        const double e = probs[i] * n;
        if (e < 5) {
            rest_e += e;
            rest_o += counts[i];
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        ++bins;
    }
    if (rest_e > 0) {
        stat += (rest_o - rest_e) * (rest_o - rest_e) / std::max(rest_e, 1e-9);
        ++bins;
    }
    const double df = bins - 1, z = 3.0902;
    const double crit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
    *stat_out = stat;
    std::printf("chi-square %.1f over %d bins, 0.001 critical value %.1f\n", stat, bins, crit);
    return stat < crit;
}

std::vector<double> softmax(const std::vector<float>& l, float temperature) {
    double m = -INFINITY, sum = 0;
    for (float v : l) m = std::max<double>(m, v / temperature);
    std::vector<double> p(l.size());
    for (size_t i = 0; i < l.size(); ++i) sum += p[i] = std::exp(l[i] / temperature - m);
    for (double& v : p) v /= sum;
    return p;
}

int32_t argmax(const std::vector<double>& p) { return int32_t(std::max_element(p.begin(), p.end()) - p.begin()); }

struct Sampled : ::testing::Test {
    static constexpr float kTemperature = 0.4f;
    static constexpr uint32_t kDraws = 6000;
    TinySpec sp;
    std::unique_ptr<OwnedView> view;
    std::unique_ptr<BatchedModel> m;
    eh_seq* base = nullptr;
    std::vector<int32_t> p;
    void SetUp() override {
        sp.n_embd = 128;
        sp.n_ff = 128;
        sp.n_vocab = 24;  // few bins: every one is well filled
        view = make_tiny(sp);
        m = std::make_unique<BatchedModel>(view->view());
        p = prompt(5, sp.n_vocab);
        base = m->create(false);
        eh_step_entry e = entry(base, p.data(), uint32_t(p.size()) - 1, 0);
        ASSERT_EQ(plugin().step(m->model, &e, 1), EH_OK) << m->error();
    }
    eh_sampling_params params(uint64_t seed) const {
        eh_sampling_params q = greedy_params();
        q.temperature = kTemperature;
        q.seed = seed;
        return q;
    }
    // The target's distribution after the base, then `more`.
    std::vector<double> target(const std::vector<int32_t>& more) {
        eh_seq* s = nullptr;
        EXPECT_EQ(plugin().seq_fork(base, plugin().seq_length(base), &s), EH_OK);
        eh_step_entry e = entry(s, more.data(), uint32_t(more.size()), EH_STEP_LOGITS);
        EXPECT_EQ(plugin().step(m->model, &e, 1), EH_OK) << m->error();
        const float* l = nullptr;
        uint32_t n = 0;
        EXPECT_EQ(plugin().seq_logits(s, &l, &n), EH_OK);
        std::vector<double> out = softmax(std::vector<float>(l, l + n), kTemperature);
        plugin().seq_release(s);
        return out;
    }
    // One seeded verify of [t, drafts...] on a fork of the base: the tokens
    // it emits (accepted drafts, then its token).
    std::vector<int32_t> verify(const std::vector<int32_t>& t, uint64_t seed) {
        eh_seq* s = nullptr;
        EXPECT_EQ(plugin().seq_fork(base, plugin().seq_length(base), &s), EH_OK);
        const eh_sampling_params q = params(seed);
        EXPECT_EQ(plugin().seq_set_sampling(s, &q), EH_OK);
        eh_step_entry e = verify_entry(s, t);
        EXPECT_EQ(plugin().step(m->model, &e, 1), EH_OK) << m->error();
        std::vector<int32_t> out(t.begin() + 1, t.begin() + 1 + e.n_accepted);
        out.push_back(e.token);
        plugin().seq_release(s);
        return out;
    }
};

// The first token emitted after a draft of the most likely one (accepted
// about that often) is distributed as p_1, and the token after an accepted
// first draft as p_2 given it: both the rejection branch and the next
// position's draw are exercised.
TEST_F(Sampled, VerifiedTokensKeepTheTargetDistribution) {
    const int32_t t = p.back();
    const std::vector<double> p1 = target({t});
    const int32_t x1 = argmax(p1);
    const std::vector<double> p2 = target({t, x1});
    // The second draft is a likely-but-not-top token, so it is often rejected.
    std::vector<double> sorted2 = p2;
    std::sort(sorted2.begin(), sorted2.end(), std::greater<>());
    const int32_t x2 = int32_t(std::find(p2.begin(), p2.end(), sorted2[1]) - p2.begin());
    std::printf("p1(x1) = %.3f, p2(x2 | x1) = %.3f\n", p1[size_t(x1)], p2[size_t(x2)]);
    ASSERT_GT(p1[size_t(x1)], 0.1);
    ASSERT_LT(p1[size_t(x1)], 0.9);  // both branches happen
    std::vector<uint32_t> first(sp.n_vocab), second(sp.n_vocab);
    uint32_t n_second = 0;
    for (uint32_t i = 0; i < kDraws; ++i) {
        const std::vector<int32_t> out = verify({t, x1, x2}, 1000 + i);
        ++first[size_t(out[0])];
        if (out[0] == x1) {
            ++second[size_t(out[1])];
            ++n_second;
        }
    }
    double stat = 0;
    EXPECT_TRUE(fits(first, p1, kDraws, &stat)) << "first token, chi-square " << stat;
    EXPECT_TRUE(fits(second, p2, n_second, &stat)) << "second token, chi-square " << stat;
}

// The same test's threshold has the power to see a wrong rule: one that
// draws the replacement from p itself (the rejected draft not removed),
// built from the sampler's own pieces, fails it.
TEST_F(Sampled, AWrongRuleFailsTheSameTest) {
    const int32_t t = p.back();
    const std::vector<double> p1 = target({t});
    const int32_t x1 = argmax(p1);
    // Position 1's logits, as the plugin's sampler sees them.
    eh_seq* s = nullptr;
    ASSERT_EQ(plugin().seq_fork(base, plugin().seq_length(base), &s), EH_OK);
    eh_step_entry e = entry(s, &t, 1, EH_STEP_LOGITS);
    ASSERT_EQ(plugin().step(m->model, &e, 1), EH_OK);
    const float* l = nullptr;
    uint32_t n = 0;
    ASSERT_EQ(plugin().seq_logits(s, &l, &n), EH_OK);
    const std::vector<float> logits(l, l + n);
    plugin().seq_release(s);
    std::vector<uint32_t> wrong(sp.n_vocab), right(sp.n_vocab);
    for (uint32_t i = 0; i < kDraws; ++i) {
        cpuref::Sampler a, b;
        a.set(params(1000 + i));
        b.set(params(1000 + i));
        const cpuref::Distribution d = a.distribution(logits.data(), n, nullptr, 0, SIZE_MAX, {});
        ++wrong[size_t(a.accept(d, x1) ? x1 : a.draw(d))];
        ++right[size_t(b.accept(d, x1) ? x1 : b.draw_without(d, x1))];
    }
    double stat = 0;
    EXPECT_FALSE(fits(wrong, p1, kDraws, &stat)) << "the wrong rule passed, chi-square " << stat;
    EXPECT_TRUE(fits(right, p1, kDraws, &stat)) << "the right rule failed, chi-square " << stat;
}

}  // namespace
