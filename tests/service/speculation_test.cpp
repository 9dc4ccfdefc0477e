// Speculative decoding's host pieces (speculation.hpp): prompt lookup, the
// draft length's adaptation, and the flags' limits.
#include <gtest/gtest.h>

#include <vector>

#include "eh/service/speculation.hpp"

using namespace eh;
using namespace eh::service;

TEST(NgramDraft, TheLatestEarlierOccurrenceOfTheLongestSuffixWins) {
    //                               0  1  2  3  4  5  6  7  8  9
    const std::vector<int32_t> t = {1, 2, 3, 9, 1, 2, 4, 5, 3, 1, 2};
    // suffix {1,2} (n = 2) occurs at 0 and 4: the later one's continuation
    EXPECT_EQ(ngram_draft(t, 1, 2, 3), (std::vector<int32_t>{4, 5, 3}));
    // {3,1,2} (n = 3) occurs nowhere earlier; n = 2 takes over
    EXPECT_EQ(ngram_draft(t, 1, 3, 2), (std::vector<int32_t>{4, 5}));
    // n = 3 only: nothing
    EXPECT_TRUE(ngram_draft(t, 3, 3, 4).empty());
    // the continuation stops at the end of the tokens
    const std::vector<int32_t> u = {7, 8, 7};
    EXPECT_EQ(ngram_draft(u, 1, 1, 5), (std::vector<int32_t>{8, 7}));
    EXPECT_TRUE(ngram_draft(std::vector<int32_t>{5}, 1, 3, 4).empty());
    EXPECT_TRUE(ngram_draft(std::vector<int32_t>{}, 1, 3, 4).empty());
    EXPECT_TRUE(ngram_draft(u, 1, 1, 0).empty());
}

TEST(DraftLength, GrowsAfterFullAcceptanceAndFallsToWhatWasAccepted) {
    EXPECT_EQ(adapt_draft_length(4, 4, 8), 5u);
    EXPECT_EQ(adapt_draft_length(8, 8, 8), 8u);   // capped
    EXPECT_EQ(adapt_draft_length(6, 2, 8), 3u);
    EXPECT_EQ(adapt_draft_length(6, 0, 8), 1u);   // never below one
}

TEST(DraftPause, ARequestWhoseDraftsKeepFailingPausesLongerEachTime) {
    SpecState st;
    // One failure from a perfect record: its acceptance is still 75 %.
    adapt_pause(st, 4, 0);
    EXPECT_EQ(st.pause, 0u);
    adapt_pause(st, 4, 0);
    adapt_pause(st, 4, 0);
    adapt_pause(st, 4, 0);  // 1.0 * 0.75^4 = 0.32
    EXPECT_EQ(st.pause, 0u);
    adapt_pause(st, 4, 0);  // 0.24: below 30 %
    EXPECT_EQ(st.pause, 2u);
    adapt_pause(st, 2, 0);
    EXPECT_EQ(st.pause, 4u);
    for (int i = 0; i < 10; ++i) adapt_pause(st, 1, 0);
    EXPECT_EQ(st.pause, kSpecMaxPause);
    // An accepted draft ends the backoff; the next failure starts it again small.
    adapt_pause(st, 4, 1);
    EXPECT_EQ(st.backoff, 0u);
    adapt_pause(st, 4, 0);
    EXPECT_EQ(st.pause, 2u);
    // A verify of no drafts changes nothing.
    const double rate = st.rate;
    adapt_pause(st, 0, 0);
    EXPECT_EQ(st.rate, rate);
}

// A paused request drafts nothing for that many steps, then drafts again.
TEST(DraftPause, APausedRequestSkipsItsDrafts) {
    SpecOptions o;
    o.source = SpecSource::Ngram;
    o.draft_max = 4;
    Speculator sp(o, 8);
    const std::vector<int32_t> t = {1, 2, 3, 1, 2, 3, 1, 2};
    SpecState st;
    st.pause = 2;
    Speculator::Ask a{&st, t, 8};
    sp.draft(std::span<Speculator::Ask>(&a, 1));
    EXPECT_EQ(st.step.size(), 1u);
    a.cap = 8;
    sp.draft(std::span<Speculator::Ask>(&a, 1));
    EXPECT_EQ(st.step.size(), 1u);
    a.cap = 8;
    sp.draft(std::span<Speculator::Ask>(&a, 1));
    EXPECT_EQ(st.step, (std::vector<int32_t>{2, 3, 1, 2}));  // the last token, then what followed 3 1 2 before
}

TEST(SpecOptionsCheck, EveryLimitIsRefusedByName) {
    auto msg = [](SpecOptions o) {
        try {
            check_spec_options(o);
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), Code::InvalidRequest);
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_EQ(msg({}), "");
    SpecOptions o;
    o.draft_max = 0;
    EXPECT_NE(msg(o).find("--spec-draft-max must be between 1 and 16"), std::string::npos);
    o.draft_max = kSpecMaxDraftTokens + 1;
    EXPECT_NE(msg(o).find("--spec-draft-max"), std::string::npos);
    o = {};
    o.ngram_max = 17;
    EXPECT_NE(msg(o).find("--spec-ngram-max must be between 1 and 16"), std::string::npos);
    o = {};
    o.ngram_min = 4;
    o.ngram_max = 3;
    EXPECT_NE(msg(o).find("--spec-ngram-min"), std::string::npos);
    o = {};
    o.max_batch = 0;
    EXPECT_NE(msg(o).find("--spec-max-batch"), std::string::npos);
}
