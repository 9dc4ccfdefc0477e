// The chat-like workload of `engine-host loadgen --workload chat`: the same
// seed gives the same requests, lengths stay in their ranges, about the asked
// fraction begins with the preamble, and a word is one token on real
// vocabularies (what lets the flags speak of words for tokens).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <sstream>

#include "eh/tokenizer/tokenizer.hpp"
#include "eh/tools/chat_workload.hpp"
#include "tools_test_util.hpp"

using namespace eh::tools;

namespace {

size_t words_in(const std::string& s) {
    std::istringstream in(s);
    size_t n = 0;
    for (std::string w; in >> w;) ++n;
    return n;
}

ChatWorkload small() {
    ChatWorkload w;
    w.prompt_words_min = 10;
    w.prompt_words_max = 400;
    w.preamble_words = 50;
    w.answer_tokens_min = 3;
    w.answer_tokens_max = 9;
    return w;
}

}  // namespace

TEST(ChatWorkload, TheSameSeedGivesTheSameRequestsAndAnotherSeedOthers) {
    const ChatWorkload w = small();
    ChatWorkload other = w;
    other.seed = 2;
    const std::string pre = chat_preamble(w), pre2 = chat_preamble(other);
    EXPECT_EQ(pre, chat_preamble(w));
    EXPECT_NE(pre, pre2);
    EXPECT_EQ(words_in(pre), 50u);
    std::set<std::string> prompts;
    for (uint32_t level = 0; level < 3; ++level)
        for (uint32_t i = 0; i < 40; ++i) {
            const ChatRequest a = chat_request(w, pre, level, i), b = chat_request(w, pre, level, i);
            EXPECT_EQ(a.prompt, b.prompt);
            EXPECT_EQ(a.max_tokens, b.max_tokens);
            EXPECT_NE(a.prompt, chat_request(other, pre2, level, i).prompt);
            prompts.insert(a.prompt);
        }
    EXPECT_EQ(prompts.size(), 120u) << "every level and request sends a prompt of its own";
}

TEST(ChatWorkload, LengthsStayInTheirRangesAndTheSharedOnesBeginWithThePreamble) {
    ChatWorkload w = small();
    w.shared_prefix = 0.3;
    const std::string pre = chat_preamble(w);
    uint32_t shared = 0, below_mean = 0, lo_answer = 99, hi_answer = 0;
    const uint32_t n = 2000;
    for (uint32_t i = 0; i < n; ++i) {
        const ChatRequest q = chat_request(w, pre, 0, i);
        ASSERT_GE(q.own_words, w.prompt_words_min);
        ASSERT_LE(q.own_words, w.prompt_words_max);
        ASSERT_GE(q.max_tokens, w.answer_tokens_min);
        ASSERT_LE(q.max_tokens, w.answer_tokens_max);
        lo_answer = std::min(lo_answer, q.max_tokens);
        hi_answer = std::max(hi_answer, q.max_tokens);
        if (q.shared) {
            ++shared;
            ASSERT_EQ(q.prompt.rfind(pre + "\n\n", 0), 0u);
            EXPECT_EQ(words_in(q.prompt), 50u + q.own_words);
        } else {
            EXPECT_NE(q.prompt.rfind(pre.substr(0, 40), 0), 0u);
            EXPECT_EQ(words_in(q.prompt), q.own_words);
        }
        below_mean += q.own_words < 63 ? 1 : 0;  // sqrt(10 * 400): log-uniform's median
    }
    EXPECT_NEAR(double(shared) / n, 0.3, 0.04);
    EXPECT_NEAR(double(below_mean) / n, 0.5, 0.05);
    EXPECT_EQ(lo_answer, 3u);
    EXPECT_EQ(hi_answer, 9u);
    // No preamble: nothing is shared, whatever the fraction.
    w.preamble_words = 0;
    w.shared_prefix = 1;
    for (uint32_t i = 0; i < 50; ++i) EXPECT_FALSE(chat_request(w, "", 0, i).shared);
}

TEST(ChatWorkload, CheckNamesTheFlagOfABadSetting) {
    EXPECT_EQ(check(ChatWorkload{}), "");
    ChatWorkload w;
    w.prompt_words_min = 0;
    EXPECT_NE(check(w).find("--prompt-words"), std::string::npos);
    w = {};
    w.prompt_words_min = 500;
    w.prompt_words_max = 400;
    EXPECT_NE(check(w).find("--prompt-words"), std::string::npos);
    w = {};
    w.preamble_words = kChatMaxWords + 1;
    EXPECT_NE(check(w).find("--preamble-words"), std::string::npos);
    w = {};
    w.shared_prefix = 1.5;
    EXPECT_NE(check(w).find("--shared-prefix"), std::string::npos);
    w.shared_prefix = std::numeric_limits<double>::quiet_NaN();
    EXPECT_NE(check(w).find("--shared-prefix"), std::string::npos);
    w = {};
    w.answer_tokens_max = kChatMaxAnswerTokens + 1;
    EXPECT_NE(check(w).find("--answer-tokens"), std::string::npos);
}

// Each generated word is one token after a space in Qwen2.5's and gpt-oss's
// vocabularies, so a request of W words is about W tokens on them.
TEST(ChatWorkload, AWordIsOneTokenOnRealVocabularies) {
    ChatWorkload w;
    w.prompt_words_min = w.prompt_words_max = 3000;
    w.shared_prefix = 0;
    const std::string text = " " + chat_request(w, chat_preamble(w), 0, 0).prompt;
    for (const char* name : {"qwen2.5", "gpt-oss-20b"}) {
        auto tok = eh::tokenizer::Tokenizer::from_hf_json(test::testdata(std::string("tokenizers/") + name +
                                                                          "/tokenizer.json"));
        EXPECT_EQ(tok->encode(text, false, false).size(), words_in(text)) << name;
    }
}
