// Each stage of the sampling pipeline, and seeded repeatability.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <engine_host/plugin_abi.hpp>

#include "sampler.hpp"

using namespace cpuref;

namespace {

eh_sampling_params params(float temp, uint64_t seed = 42) {
    eh_sampling_params p{};
    p.struct_size = sizeof(p);
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.repetition_window = -1;
    p.seed = seed;
    return p;
}

std::vector<int32_t> ids(const std::vector<Candidate>& c) {
    std::vector<int32_t> out;
    for (auto& x : c) out.push_back(x.id);
    return out;
}

}  // namespace

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
    std::vector<float> l = {2.0f, -2.0f, 1.0f, 4.0f};
    apply_repetition_penalty(l, {0, 1, 1}, 2.0f, -1);
    EXPECT_FLOAT_EQ(l[0], 1.0f);
    EXPECT_FLOAT_EQ(l[1], -4.0f);  // penalized once although it repeats
    EXPECT_FLOAT_EQ(l[2], 1.0f);
    EXPECT_FLOAT_EQ(l[3], 4.0f);
    std::vector<float> w = {2.0f, 2.0f, 2.0f};
    apply_repetition_penalty(w, {0, 1, 2}, 2.0f, 1);  // only the last token
    EXPECT_FLOAT_EQ(w[0], 2.0f);
    EXPECT_FLOAT_EQ(w[2], 1.0f);
}

TEST(Sampler, TemperatureScalesLogits) {
    auto c = sorted_candidates({1.0f, 3.0f});
    apply_temperature(c, 0.5f);
    EXPECT_EQ(c[0].id, 1);
    EXPECT_FLOAT_EQ(c[0].logit, 6.0f);
    EXPECT_FLOAT_EQ(c[1].logit, 2.0f);
}

TEST(Sampler, TopKKeepsTheKLargest) {
    auto c = sorted_candidates({0.1f, 0.5f, 0.3f, 0.9f});
    apply_top_k(c, 2);
    EXPECT_EQ(ids(c), (std::vector<int32_t>{3, 1}));
    auto all = sorted_candidates({0.1f, 0.5f});
    apply_top_k(all, 0);  // off
    EXPECT_EQ(all.size(), 2u);
}

TEST(Sampler, TopPKeepsShortestPrefixReachingP) {
    // probabilities 0.5, 0.3, 0.2
    auto c = sorted_candidates({std::log(0.5f), std::log(0.3f), std::log(0.2f)});
    apply_top_p(c, 0.7f);
    EXPECT_EQ(ids(c), (std::vector<int32_t>{0, 1}));
    c = sorted_candidates({std::log(0.5f), std::log(0.3f), std::log(0.2f)});
    apply_top_p(c, 0.5f);
    EXPECT_EQ(ids(c), (std::vector<int32_t>{0}));
}

TEST(Sampler, MinPRelativeToMostLikely) {
    // probabilities 0.6, 0.3, 0.1: min_p 0.4 keeps p >= 0.24
    auto c = sorted_candidates({std::log(0.6f), std::log(0.3f), std::log(0.1f)});
    apply_min_p(c, 0.4f);
    EXPECT_EQ(ids(c), (std::vector<int32_t>{0, 1}));
}

TEST(Sampler, GreedyTiesToLowestIdAndSeesPenalty) {
    EXPECT_EQ(greedy({1.0f, 5.0f, 5.0f}), 1);
    Sampler s;
    auto p = params(0.0f);
    p.repetition_penalty = 10.0f;
    s.set(p);
    const float logits[3] = {4.0f, 5.0f, 1.0f};
    EXPECT_EQ(s.sample(logits, 3, {}), 1);
    EXPECT_EQ(s.sample(logits, 3, {1}), 0);  // 5/10 < 4
}

TEST(Sampler, SeededDrawsRepeatAndFollowTheDistribution) {
    std::vector<float> logits(50);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
    Sampler a, b, c;
    a.set(params(1.0f, 7));
    b.set(params(1.0f, 7));
    c.set(params(1.0f, 8));
    std::vector<int32_t> ra, rb, rc;
    for (int i = 0; i < 64; ++i) {
        ra.push_back(a.sample(logits.data(), 50, {}));
        rb.push_back(b.sample(logits.data(), 50, {}));
        rc.push_back(c.sample(logits.data(), 50, {}));
    }
    EXPECT_EQ(ra, rb);
    EXPECT_NE(ra, rc);
    // reseeding restarts the sequence
    a.set(params(1.0f, 7));
    EXPECT_EQ(a.sample(logits.data(), 50, {}), ra[0]);

    // two tokens with probabilities 0.75 / 0.25
    const float two[2] = {std::log(3.0f), 0.0f};
    Sampler d;
    d.set(params(1.0f, 99));
    int zeros = 0;
    for (int i = 0; i < 4000; ++i) zeros += d.sample(two, 2, {}) == 0;
    EXPECT_GT(zeros, 2800);
    EXPECT_LT(zeros, 3200);
}

TEST(Sampler, PipelineStagesApplyInOrder) {
    // top_k 2 leaves {0, 2} (p = 0.525, 0.475); min_p 0.95 then leaves only 0
    Sampler s;
    auto p = params(1.0f);
    p.top_k = 2;
    p.min_p = 0.95f;
    s.set(p);
    const float logits[3] = {3.0f, 2.0f, 2.9f};
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits, 3, {}), 0);
    p.top_k = 0;
    p.min_p = 0.0f;
    p.top_p = 0.5f;  // 0 alone has less than half the mass: 2 joins
    s.set(p);
    bool saw2 = false;
    for (int i = 0; i < 50; ++i) {
        int32_t t = s.sample(logits, 3, {});
        EXPECT_NE(t, 1);
        saw2 |= t == 2;
    }
    EXPECT_TRUE(saw2);
}

TEST(Sampler, PresenceAndFrequencyFollowOpenAIsFormula) {
    std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
    const std::vector<int32_t> generated = {2, 2, 2, 1};
    apply_presence_frequency(logits, generated.data(), generated.size(), 0.5f, 0.25f);
    EXPECT_FLOAT_EQ(logits[0], 1.0f);                 // never generated
    EXPECT_FLOAT_EQ(logits[1], 1.0f - 0.5f - 0.25f);  // once
    EXPECT_FLOAT_EQ(logits[2], 1.0f - 0.5f - 0.75f);  // three times
    // Only the sequence's own output counts: the prompt part of the history
    // (before gen_start) is left alone.
    Sampler s;
    eh_sampling_params p{};
    p.struct_size = sizeof(p);
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.presence_penalty = 2.0f;
    s.set(p);
    const std::vector<float> flat = {1.0f, 1.1f, 1.0f};
    EXPECT_EQ(s.sample(flat.data(), 3, {1, 1, 0}, 3), 1);  // token 1 only in the prompt
    EXPECT_EQ(s.sample(flat.data(), 3, {1, 1, 0}, 1), 2);  // 1 and 0 generated: 1.1 - 2 and 1 - 2 < 1
}

TEST(Sampler, RejectsBadParameters) {
    auto expect_bad = [](eh_sampling_params p) {
        try {
            ehp::check_sampling(p);
            ADD_FAILURE() << "accepted";
        } catch (const ehp::Error& e) {
            EXPECT_EQ(e.status(), EH_INVALID_ARGUMENT);
        }
    };
    auto p = params(-1.0f);
    expect_bad(p);
    p = params(NAN);
    expect_bad(p);
    p = params(1.0f);
    p.top_p = 0.0f;
    expect_bad(p);
    p = params(1.0f);
    p.min_p = 1.5f;
    expect_bad(p);
    p = params(1.0f);
    p.repetition_penalty = 0.0f;
    expect_bad(p);
    p = params(1.0f);
    p.top_k = -1;
    expect_bad(p);
    Sampler s;
    const float l[1] = {0};
    EXPECT_THROW(s.sample(l, 1, {}), ehp::Error);  // not set yet
}
