// Counted repeats (docs/robustness.md, "slow masks"): what they match, that
// the matcher's masks over them agree with feeding each token's bytes, and
// that their cost stays bounded — asserted on the automaton's work counters
// (states, trie walks, work units), never on time. And the per-token mask
// work budget: past it a mask fails with the documented error, at once on
// every later try.
#include <gtest/gtest.h>

#include <random>

#include "constrain_test_util.hpp"

namespace eh::constrain {
namespace {

using test::expect_language;
using test::matches;
using test::prefix_ok;

// Every byte; every string of 2 and 3 letters from "abcz " (so tokens are
// up to 3 bytes: the longest-token bound the mask relies on is 3); "é";
// an end token.
std::shared_ptr<const TokenVocab> short_words() {
    static const auto v = [] {
        std::vector<std::string> bytes;
        for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
        const std::string letters = "abcz ";
        for (char x : letters)
            for (char y : letters) {
                bytes.push_back(std::string{x, y});
                for (char z : letters) bytes.push_back(std::string{x, y, z});
            }
        bytes.emplace_back("\xC3\xA9");
        bytes.emplace_back();  // end
        const auto end = int32_t(bytes.size() - 1);
        return std::make_shared<const TokenVocab>(std::move(bytes), std::vector<int32_t>{end});
    }();
    return v;
}

bool allowed(const Mask& m, int32_t id) { return (m[uint32_t(id) / 32] >> (uint32_t(id) % 32)) & 1u; }

// Follows `text` token by token (the longest token that fits, as a
// tokenizer would), checking at each step that the mask holds exactly the
// tokens the matcher accepts and the end token exactly where it accepts.
void follow(const std::shared_ptr<Automaton>& a, std::string_view text) {
    const auto& v = a->vocab();
    Matcher m(a);
    size_t at = 0;
    while (at < text.size()) {
        const auto mask = m.mask();
        for (size_t id = 0; id < v.size(); ++id) {
            const auto t = int32_t(id);
            Matcher copy = m;
            const bool ok = v.is_eog(t) ? copy.accepting() : copy.accept(t);
            ASSERT_EQ(allowed(*mask, t), ok) << "token '" << v.bytes(t) << "' after '" << text.substr(0, at) << "'";
        }
        size_t len = std::min<size_t>(3, text.size() - at);
        int32_t pick = -1;
        for (; len > 0 && pick < 0; --len)
            for (size_t id = 0; id < v.size(); ++id)
                if (!v.is_eog(int32_t(id)) && v.bytes(int32_t(id)) == text.substr(at, len)) {
                    pick = int32_t(id);
                    break;
                }
        ASSERT_GE(pick, 0);
        ASSERT_TRUE(m.accept(pick)) << text.substr(0, at) << " + '" << v.bytes(pick) << "'";
        at += v.bytes(pick).size();
    }
}

TEST(Repeat, BodiesThatMatchNothingRepeatTheirNonEmptyForm) {
    auto g = gbnf_grammar("root ::= ( [a-z ] | ){5}\n");
    expect_language(g, {.match = {"", "abcde"}, .no_prefix = {"abcdef"}});
    g = gbnf_grammar("root ::= ( [a-z]? [0-9]? ){3} \"x\"\n");
    expect_language(g, {.match = {"x", "1x", "a1b2c3x", "ab1x"}, .no_prefix = {"a1b2c3d", "abcd"}});
    // The minimum of a body that can match nothing is no minimum.
    g = gbnf_grammar("root ::= ( \"ab\" | ){3,4} \"!\"\n");
    expect_language(g, {.match = {"!", "abababab!"}, .no_prefix = {"ababababab"}});
    // Only the empty string: the repeat is nothing.
    EXPECT_TRUE(matches(gbnf_grammar("root ::= ( \"\" ){7} \"x\"\n"), "x"));
    // Unbounded: no longer left recursion once the body cannot be empty.
    g = gbnf_grammar("root ::= ( [a-z] | )* \".\"\n");
    EXPECT_TRUE(matches(g, "."));
    EXPECT_TRUE(matches(g, "abc."));
    // Too many optional items to write out the non-empty form (2^7
    // alternatives): the body stays as it is, with the same language.
    g = gbnf_grammar("root ::= ( \"a\"? \"b\"? \"c\"? \"d\"? \"e\"? \"f\"? \"g\"? ){3} \"!\"\n");
    expect_language(g, {.match = {"!", "abcdefg!", "gfe!"}, .no_prefix = {"gfed"}});
    // A rule that can match nothing, defined after its use.
    g = gbnf_grammar("root ::= w{2,3} \";\"\nw ::= \"a\"? \"b\"?\n");
    expect_language(g, {.match = {";", "abab;", "aaa;", "bbab;"}, .no_prefix = {"aaaa"}});
}

TEST(Repeat, ExactAndRangeCountsAsChains) {
    auto g = gbnf_grammar("root ::= \"a\"{6,8} \"b\"\n");
    expect_language(g, {.match = {"aaaaaab", "aaaaaaaab"}, .no_prefix = {"aaaaab", "aaaaaaaaa"}});
    g = gbnf_grammar("root ::= ( \"ab\" | \"c\" ){10}\n");
    expect_language(g, {
        .match = {"ababababababababcc"},
        .no_match = {"abababababababab"},
        .no_prefix = {"cccccccccccc"}
    });
    // Nested counts.
    g = gbnf_grammar("root ::= ( \"x\"{2,3} \",\" ){5}\n");
    expect_language(g, {.match = {"xx,xxx,xx,xx,xxx,"}, .no_prefix = {"xxxx", "xx,xx,xx,xx,xx,x"}});
}

// Random nestings of repeats, optional items, empty alternatives and
// ambiguous alternations over "abc": the grammar must match exactly the
// strings a plain set-of-positions matcher over the same expression does
// (what the chains, the non-empty forms and the merged stacks must not
// change).
struct Expr {
    enum class Kind { Char, Class, Alt, Seq, Opt, Repeat } kind = Kind::Char;
    char c = 'a';
    std::vector<Expr> kids;
    int lo = 0, hi = 0;  // Repeat; hi < 0: unbounded

    std::string gbnf() const {
        switch (kind) {
        case Kind::Char: return std::string("\"") + c + "\"";
        case Kind::Class: return "[ab]";
        case Kind::Alt: return "( " + kids[0].gbnf() + " | " + (kids.size() > 1 ? kids[1].gbnf() : "") + " )";
        case Kind::Seq: return "( " + kids[0].gbnf() + " " + kids[1].gbnf() + " )";
        case Kind::Opt: return kids[0].gbnf() + "?";
        case Kind::Repeat:
            return "( " + kids[0].gbnf() + " ){" + std::to_string(lo) + "," + (hi < 0 ? "" : std::to_string(hi)) + "}";
        }
        return "";
    }
    // The positions of `s` where a match starting at one of `from` can end
    // (bit i: position i; strings are at most 31 bytes).
    uint32_t ends(std::string_view s, uint32_t from) const {
        uint32_t out = 0;
        switch (kind) {
        case Kind::Char:
        case Kind::Class:
            for (size_t i = 0; i < s.size(); ++i)
                if (((from >> i) & 1u) && (s[i] == c || (kind == Kind::Class && (s[i] == 'a' || s[i] == 'b'))))
                    out |= 1u << (i + 1);
            return out;
        case Kind::Alt: return kids[0].ends(s, from) | (kids.size() > 1 ? kids[1].ends(s, from) : from);
        case Kind::Seq: return kids[1].ends(s, kids[0].ends(s, from));
        case Kind::Opt: return from | kids[0].ends(s, from);
        case Kind::Repeat: {
            uint32_t at = from;
            for (int k = 0; k < lo; ++k) at = kids[0].ends(s, at);
            out = at;
            for (int k = lo; hi < 0 || k < hi; ++k) {
                at = kids[0].ends(s, at);
                if ((out | at) == out && hi < 0) break;  // (unbounded: a fixpoint)
                out |= at;
            }
            return out;
        }
        }
        return 0;
    }
};

class RandomRepeat {
public:
    explicit RandomRepeat(uint32_t seed) : rng_(seed) {}
    Expr expr(int depth = 0) {
        Expr e;
        switch (depth > 2 ? pick(2) : pick(6)) {
        case 0: e.c = "abc"[pick(3)]; break;
        case 1: e.kind = Expr::Kind::Class; break;
        case 2:
            e.kind = Expr::Kind::Alt;
            e.kids.push_back(expr(depth + 1));
            if (pick(3) != 0) e.kids.push_back(expr(depth + 1));  // else an empty alternative
            break;
        case 3:
            e.kind = Expr::Kind::Seq;
            e.kids = {expr(depth + 1), expr(depth + 1)};
            break;
        case 4:
            e.kind = Expr::Kind::Opt;
            e.kids = {expr(depth + 1)};
            break;
        default:
            e.kind = Expr::Kind::Repeat;
            e.kids = {expr(depth + 1)};
            e.lo = pick(8);
            e.hi = pick(5) == 0 ? -1 : e.lo + pick(5);
            break;
        }
        return e;
    }
    // A string `e` matches, or (one time in three) one with a byte changed,
    // added or taken away; at most 31 bytes.
    std::string text(const Expr& e) {
        std::string s;
        sample(e, s);
        if (s.size() > 30) s.resize(30);
        const int how = pick(9);
        if (how == 0 && !s.empty()) s[size_t(pick(int(s.size())))] = "abc"[pick(3)];
        if (how == 1) s.insert(s.begin() + pick(int(s.size()) + 1), "abc"[pick(3)]);
        if (how == 2 && !s.empty()) s.erase(s.begin() + pick(int(s.size())));
        return s;
    }

private:
    void sample(const Expr& e, std::string& s) {
        switch (e.kind) {
        case Expr::Kind::Char: s += e.c; return;
        case Expr::Kind::Class: s += "ab"[pick(2)]; return;
        case Expr::Kind::Alt:
            if (const size_t k = size_t(pick(2)); k < e.kids.size()) sample(e.kids[k], s);
            return;
        case Expr::Kind::Seq:
            sample(e.kids[0], s);
            sample(e.kids[1], s);
            return;
        case Expr::Kind::Opt:
            if (pick(2)) sample(e.kids[0], s);
            return;
        case Expr::Kind::Repeat: {
            const int n = e.lo + pick((e.hi < 0 ? 3 : e.hi - e.lo) + 1);
            for (int k = 0; k < n && s.size() < 40; ++k) sample(e.kids[0], s);
            return;
        }
        }
    }
    int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
    std::mt19937 rng_;
};

TEST(Repeat, RandomGrammarsMatchWhatAPositionMatcherMatches) {
    RandomRepeat gen(7);
    size_t checked = 0, matched = 0;
    for (int t = 0; t < 600; ++t) {
        const Expr e = gen.expr();
        auto a = std::make_shared<Automaton>(gbnf_grammar("root ::= " + e.gbnf() + "\n"), test::byte_vocab());
        for (int k = 0; k < 40; ++k) {
            const std::string s = gen.text(e);
            Matcher m(a);
            const bool got = m.accept_bytes(s) && m.accepting();
            const bool want = (e.ends(s, 1u) >> s.size()) & 1u;
            ASSERT_EQ(got, want) << "grammar " << e.gbnf() << ", text '" << s << "'";
            ++checked;
            matched += want;
        }
    }
    EXPECT_EQ(checked, 600u * 40u);
    EXPECT_GT(matched, checked / 2);      // (most texts match,
    EXPECT_LT(matched, checked - 1000u);  // some do not)
}

// The mask of a state deep in a repeat is shared with states whose counts
// differ only above the longest token; it must still be exact near the
// repeat's end, where the counts matter.
TEST(Repeat, MasksEqualTheMatcherNearAndFarFromTheEnd) {
    const auto v = short_words();
    follow(std::make_shared<Automaton>(gbnf_grammar("root ::= [a-z ]{9} \"!\"\n"), v), "abc zab c!");
    follow(std::make_shared<Automaton>(gbnf_grammar("root ::= ( [a-z ] | ){9} \"!\"\n"), v), "abc zab c!");
    follow(std::make_shared<Automaton>(gbnf_grammar("root ::= ( [a-z ] | [a-z ] [a-z ] ){2,6} \"!\"\n"), v),
           "abcabcabcab!");
    follow(std::make_shared<Automaton>(gbnf_grammar("root ::= ( \"ab\" | [a-z] ){3,9} ( \"c\" [a-z ]{0,4} ){2}\n"),
                                       v),
           "abababzzcab cz");
    follow(std::make_shared<Automaton>(gbnf_grammar("root ::= ( \"\\u00e9\" | [a-z\\u00e9] . | ){8} \"z\"\n"), v),
           "\xC3\xA9\xC3\xA9" "ab\xC3\xA9z");
}

struct Cost {
    size_t states, walks, max_work;
};

Cost run(const std::string& grammar, const std::string& text) {
    auto a = std::make_shared<Automaton>(gbnf_grammar(grammar), short_words());
    Matcher m(a);
    for (size_t at = 0; at + 3 <= text.size(); at += 3) {
        (void)m.mask();
        EXPECT_TRUE(m.accept_bytes(text.substr(at, 3))) << grammar << " at " << at;
    }
    const auto s = a->stats();
    return {s.states, s.mask_walks, s.max_mask_work};
}

// The fuzzer's slow grammars (docs/robustness.md). Before the chains, each
// token reached a new state with up to 256 parse stacks and walked the
// vocabulary again: 40 tokens, 40 walks, thousands of states.
TEST(Repeat, LongCountedRepeatsWalkTheVocabularyAFewTimesNotEveryToken) {
    std::string text;
    for (int i = 0; i < 40; ++i) text += "ab ";
    for (const std::string& g : {"root ::= [a-z ]{1000}\n", "root ::= ( [a-z ] | ){1000}\n",
                                 "root ::= ( [a-z ] | [a-z ] [a-z ] ){1000}\n", "root ::= ( [a-z ]? [0-9]? ){300}\n",
                                 "root ::= ( \"\\u00e9\" | [\\x01-\\u03c9] . | ){266} \"3341\"\n"}) {
        const Cost c = run(g, text);
        EXPECT_LE(c.walks, 8u) << g;
        EXPECT_LE(c.states, 400u) << g;
        EXPECT_LE(c.max_work, 50000u) << g;
    }
}

TEST(Repeat, MaskWorkOverTheBudgetFailsTheMaskEveryTime) {
    auto g = gbnf_grammar("root ::= [a-z ]{1000}\n");
    auto a = std::make_shared<Automaton>(g, short_words(), 200);
    Matcher m(a);
    for (int attempt = 0; attempt < 2; ++attempt) {
        try {
            (void)m.mask();
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), Code::InvalidRequest);
            EXPECT_NE(std::string(e.what()).find("more than 200 steps"), std::string::npos) << e.what();
        }
        if (attempt == 0) EXPECT_GT(a->stats().last_mask_work, 200u);
    }
    // A later try fails before doing any work.
    const auto before = a->stats();
    EXPECT_THROW((void)m.mask(), Error);
    EXPECT_EQ(a->stats().states, before.states);
    EXPECT_EQ(a->stats().walk_nodes, before.walk_nodes);
    // The same grammar within the budget (the default, kMaxMaskWork).
    Matcher ok(std::make_shared<Automaton>(g, short_words()));
    EXPECT_NO_THROW((void)ok.mask());
}

TEST(Repeat, CompileLimitsNameTheirNumbers) {
    std::string many = "root ::=";
    for (int i = 0; i < 21; ++i) many += " (\"a\" \"b\"){0,1000}";  // (each group its own rule: 21 chains)
    try {
        gbnf_grammar(many + "\n");
        ADD_FAILURE() << "accepted";
    } catch (const GrammarError& e) {
        EXPECT_NE(std::string(e.what()).find("20000 rules"), std::string::npos) << e.what();
    }
    try {
        gbnf_grammar("root ::= \"a\"{1001}\n");
        ADD_FAILURE() << "accepted";
    } catch (const GrammarError& e) {
        EXPECT_NE(std::string(e.what()).find("1000"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace eh::constrain
