// Masks over real vocabularies (SPM with byte fallback, byte-level BPE):
// the trie walk gives exactly the tokens whose bytes keep the output a valid
// prefix (checked token by token through a separate byte-level matcher),
// at least one token is always allowed, and end tokens only where the
// output is complete.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "constrain_test_util.hpp"
#include "vocab_util.hpp"

namespace eh::constrain {
namespace {

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},
  "kind":{"enum":["cat","dog"]},"score":{"type":["number","null"]}},
  "required":["name","age","tags","kind","score"],"additionalProperties":false})";

bool allowed(const Mask& m, int32_t id) { return (m[uint32_t(id) / 32] >> (uint32_t(id) % 32)) & 1u; }

// The mask of `prefix`'s state, computed the slow way: each token's bytes
// fed to a byte-level matcher that has consumed `prefix`.
Mask brute_force(const std::shared_ptr<const Grammar>& g, const TokenVocab& v, const std::string& prefix) {
    auto bytes = std::make_shared<Automaton>(g, test::byte_vocab());
    Matcher base(bytes);
    EXPECT_TRUE(base.accept_bytes(prefix));
    Mask m((v.size() + 31) / 32, 0);
    for (size_t i = 0; i < v.size(); ++i) {
        const auto id = int32_t(i);
        bool ok;
        if (v.is_eog(id)) {
            ok = base.accepting();
        } else if (v.bytes(id).empty()) {
            ok = false;
        } else {
            Matcher copy = base;
            ok = copy.accept_bytes(v.bytes(id));
        }
        if (ok) m[i / 32] |= 1u << (i % 32);
    }
    return m;
}

class MaskOnVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(MaskOnVocab, RandomWalksMatchBruteForceAndNeverDeadEnd) {
    auto tok = test::load(GetParam());
    auto vocab = test::vocab_of(*tok);
    auto g = json_schema_grammar(kSchema);
    auto automaton = std::make_shared<Automaton>(g, vocab);
    std::mt19937 rng(1234);
    size_t checked = 0;
    for (int walk = 0; walk < 4; ++walk) {
        Matcher m(automaton);
        std::string out;
        for (int step = 0; step < 40; ++step) {
            auto mask = m.mask();
            std::vector<int32_t> ids;
            for (size_t i = 0; i < vocab->size(); ++i)
                if (allowed(*mask, int32_t(i))) ids.push_back(int32_t(i));
            ASSERT_FALSE(ids.empty()) << "dead end after: " << out;
            if (step % 8 == 0) {
                EXPECT_EQ(*mask, brute_force(g, *vocab, out)) << "after: " << out;
                ++checked;
            }
            for (int32_t e : vocab->eog()) EXPECT_EQ(allowed(*mask, e), m.accepting());
            // Prefer tokens that close things, so walks also reach the end.
            int32_t pick = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
            for (int32_t id : ids)
                if (rng() % 4 == 0 && !vocab->is_eog(id) && vocab->bytes(id).find_first_of("\"]}") != std::string::npos) {
                    pick = id;
                    break;
                }
            if (vocab->is_eog(pick)) break;
            ASSERT_TRUE(m.accept(pick));
            out += vocab->bytes(pick);
            if (m.complete()) {
                EXPECT_TRUE(nlohmann::json::accept(out)) << out;
                break;
            }
        }
    }
    EXPECT_GE(checked, 4u);
    // Disallowed tokens are refused by accept() and change nothing.
    Matcher m(automaton);
    auto mask = m.mask();
    for (size_t i = 0; i < vocab->size(); ++i)
        if (!allowed(*mask, int32_t(i))) {
            EXPECT_FALSE(m.accept(int32_t(i)));
            break;
        }
    EXPECT_EQ(*m.mask(), *mask);
}

// Issue 51's keywords (formats, a pattern, bounds, lengths, a tuple) over
// real vocabularies: masks equal the byte-level matcher's, never a dead
// end, and each mask stays within the work budget (a throw fails here).
TEST_P(MaskOnVocab, KeywordSchemaMasksMatchBruteForce) {
    auto tok = test::load(GetParam());
    auto vocab = test::vocab_of(*tok);
    auto g = json_schema_grammar(R"({"type":"object","properties":{
      "at":{"type":"string","format":"date-time"},"mail":{"type":"string","format":"email"},
      "id":{"type":"string","format":"uuid"},"code":{"type":"string","pattern":"^[A-Z]{2}-\\d{3,5}$"},
      "n":{"type":"integer","minimum":-40,"maximum":1500},"x":{"type":"number","exclusiveMinimum":0,"maximum":1},
      "s":{"type":"string","minLength":2,"maxLength":1200},"t":{"prefixItems":[{"type":"boolean"},{"format":"ipv4"}]}},
      "required":["at","mail","id","code","n","x","s","t"]})");
    auto automaton = std::make_shared<Automaton>(g, vocab);
    std::mt19937 rng(51);
    size_t checked = 0;
    for (int walk = 0; walk < 3; ++walk) {
        Matcher m(automaton);
        std::string out;
        for (int step = 0; step < 120; ++step) {
            auto mask = m.mask();
            std::vector<int32_t> ids;
            for (size_t i = 0; i < vocab->size(); ++i)
                if (allowed(*mask, int32_t(i))) ids.push_back(int32_t(i));
            ASSERT_FALSE(ids.empty()) << "dead end after: " << out;
            if (step % 10 == 0) {
                EXPECT_EQ(*mask, brute_force(g, *vocab, out)) << "after: " << out;
                ++checked;
            }
            int32_t pick = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
            for (int32_t id : ids)
                if (rng() % 3 == 0 && !vocab->is_eog(id) && vocab->bytes(id).find_first_of("\"]}") != std::string::npos) {
                    pick = id;
                    break;
                }
            if (vocab->is_eog(pick)) break;
            ASSERT_TRUE(m.accept(pick));
            out += vocab->bytes(pick);
            if (m.complete()) break;
        }
    }
    EXPECT_GE(checked, 6u);
}

TEST_P(MaskOnVocab, ControlTokensNeverAndEndOnlyWhenComplete) {
    auto tok = test::load(GetParam());
    auto vocab = test::vocab_of(*tok);
    Matcher m(std::make_shared<Automaton>(json_schema_grammar(R"({"type":"object","properties":{"a":{"type":"boolean"}},
        "required":["a"],"additionalProperties":false})"), vocab));
    for (size_t i = 0; i < vocab->size(); ++i)
        if (tok->is_special(int32_t(i))) {
            EXPECT_FALSE(allowed(*m.mask(), int32_t(i))) << i;
        }
    ASSERT_TRUE(m.accept_bytes(R"({"a":true)"));
    for (int32_t e : vocab->eog()) EXPECT_FALSE(allowed(*m.mask(), e));
    ASSERT_TRUE(m.accept_bytes("}"));
    EXPECT_TRUE(m.complete());
    const auto mask = m.mask();
    size_t n = 0;
    for (size_t i = 0; i < vocab->size(); ++i) n += allowed(*mask, int32_t(i));
    EXPECT_EQ(n, vocab->eog().size());
}

// A grammar that is not JSON (recursion, multi-byte classes, a free quoted
// part): the cut-state walk must agree with brute force here too.
TEST_P(MaskOnVocab, GrammarMasksMatchBruteForce) {
    auto tok = test::load(GetParam());
    auto vocab = test::vocab_of(*tok);
    auto g = gbnf_grammar(R"g(root ::= "(" item ("," " "? item)* ")"
item ::= [a-z\u00e9\u20ac]+ | root | "'" [^'\n]* "'"
)g");
    auto automaton = std::make_shared<Automaton>(g, vocab);
    std::mt19937 rng(99);
    for (int walk = 0; walk < 3; ++walk) {
        Matcher m(automaton);
        std::string out;
        for (int step = 0; step < 30; ++step) {
            auto mask = m.mask();
            if (step % 6 == 0) {
                EXPECT_EQ(*mask, brute_force(g, *vocab, out)) << "after: " << out;
            }
            std::vector<int32_t> ids;
            for (size_t i = 0; i < vocab->size(); ++i)
                if (allowed(*mask, int32_t(i)) && !vocab->is_eog(int32_t(i))) ids.push_back(int32_t(i));
            if (ids.empty()) break;
            const int32_t pick = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
            ASSERT_TRUE(m.accept(pick));
            out += vocab->bytes(pick);
            if (m.complete()) break;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, MaskOnVocab, ::testing::Values("llama-spm", "gpt-2", "qwen2.5"),
                         [](const auto& info) {
                             std::string s = info.param;
                             for (char& c : s)
                                 if (c == '-' || c == '.') c = '_';
                             return s;
                         });

TEST(Vocab, TrieHoldsEveryTokenWithBytesOnce) {
    auto tok = test::load("llama-spm");
    auto vocab = test::vocab_of(*tok);
    std::vector<int> seen(vocab->size(), 0);
    std::vector<std::string> path;
    for (const auto& n : vocab->nodes()) {
        path.resize(n.depth - 1);
        path.push_back(std::string(1, char(n.byte)));
        std::string s;
        for (auto& p : path) s += p;
        for (uint32_t k = n.tok_begin; k < n.tok_end; ++k) {
            const int32_t id = vocab->tokens()[k];
            ++seen[size_t(id)];
            EXPECT_EQ(vocab->bytes(id), s);
        }
    }
    for (size_t i = 0; i < vocab->size(); ++i)
        EXPECT_EQ(seen[i], vocab->bytes(int32_t(i)).empty() || vocab->is_eog(int32_t(i)) ? 0 : 1) << i;
    // SPM: "▁" is a space and <0xXX> its byte.
    EXPECT_EQ(vocab->bytes(*tok->token_id("<0x41>")), "A");
    EXPECT_EQ(vocab->bytes(*tok->token_id("\xE2\x96\x81the")), " the");
}

}  // namespace
}  // namespace eh::constrain

namespace eh::constrain {
namespace {

// The fuzzer's slow grammars over Qwen2.5's 151,665 tokens
// (docs/robustness.md): counted repeats cost a few vocabulary walks, not one
// per token, and the one that stays ambiguous enough to need more than
// kMaxMaskWork for a mask fails with the documented error instead.
TEST(SlowMasks, CountedRepeatsOverARealVocabulary) {
    auto tok = test::load("qwen2.5");
    auto vocab = test::vocab_of(*tok);
    const auto ids = tok->encode("the quick brown fox jumps over the lazy dog and then it runs far away", false, false);
    for (const std::string& g : {"root ::= [a-z ]{1000}\n", "root ::= ( [a-z ] | ){1000}\n",
                                 "root ::= ( [a-z ] | [a-z ] [a-z ] ){1000}\n", "root ::= ( [a-z ]? [0-9]? ){300}\n",
                                 "root ::= ( \"\\u00e9\" | [\\x01-\\u03c9] . | ){266} \"3341\"\n"}) {
        auto a = std::make_shared<Automaton>(gbnf_grammar(g), vocab);
        Matcher m(a);
        for (int32_t id : ids) {
            ASSERT_TRUE(allowed(*m.mask(), id)) << g;
            ASSERT_TRUE(m.accept(id)) << g;
        }
        const auto s = a->stats();
        EXPECT_LE(s.mask_walks, 4u) << g;
        EXPECT_LE(s.max_mask_work, 1000000u) << g;
    }
    Matcher slow(std::make_shared<Automaton>(gbnf_grammar("root ::= ( [\\x01-\\u03c9] | [\\x01-\\u03c9] . ){266} \"3341\"\n"),
                                             vocab));
    try {
        (void)slow.mask();
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::InvalidRequest);
        EXPECT_NE(std::string(e.what()).find("more than 3000000 steps"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace eh::constrain
