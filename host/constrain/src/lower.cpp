// Syntax tree -> Grammar: groups, alternations inside sequences, repeats and
// multi-byte character classes become rules of their own; then the checks
// that keep the matcher total: every rule reachable from the root can end
// (so any valid prefix has a completion) and none is left-recursive (so
// expanding a rule terminates).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "gbnf_ast.hpp"
#include "utf8_ranges.hpp"

namespace eh::constrain::detail {
namespace {

struct Item {
    bool ref = false;
    uint32_t arg = 0;  // set index or rule index
};
using Seq = std::vector<Item>;

class Lowering {
public:
    Lowering(const std::vector<RuleDef>& defs) : defs_(defs) {
        for (const auto& d : defs) {
            if (index_.count(d.name))
                throw GrammarError("grammar", fmt::format("grammar: rule '{}' is defined twice (line {})", d.name, d.line));
            index_[d.name] = new_rule(d.name);
        }
    }

    std::shared_ptr<const Grammar> run(std::string_view root) {
        auto it = index_.find(std::string(root));
        if (it == index_.end()) throw GrammarError("grammar", fmt::format("grammar: there is no rule named '{}'", root));
        for (const auto& d : defs_) rules_[index_[d.name]] = alternatives_of(d.body);
        check(it->second);
        return flatten(it->second);
    }

private:
    uint32_t new_rule(std::string name) {
        if (rules_.size() >= kMaxGrammarRules)
            throw GrammarError("grammar", fmt::format("the grammar needs more than {} rules", kMaxGrammarRules));
        rules_.emplace_back();
        names_.push_back(std::move(name));
        return uint32_t(rules_.size() - 1);
    }
    uint32_t helper_rule(std::vector<Seq> alts) {
        const uint32_t r = new_rule(fmt::format("({})", rules_.size()));
        rules_[r] = std::move(alts);
        return r;
    }
    void count(size_t n) {
        elements_ += n;
        if (elements_ > kMaxGrammarElements)
            throw GrammarError("grammar", fmt::format("the grammar has more than {} items", kMaxGrammarElements));
    }

    uint32_t set_index(const Grammar::ByteSet& s) {
        auto [it, fresh] = set_ids_.emplace(s, uint32_t(sets_.size()));
        if (fresh) sets_.push_back(s);
        return it->second;
    }
    static Grammar::ByteSet range_set(uint8_t lo, uint8_t hi) {
        Grammar::ByteSet s{};
        for (unsigned b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t(1) << (b & 63);
        return s;
    }

    std::vector<Seq> alternatives_of(const Node& n) {
        std::vector<Seq> out;
        if (n.type == Node::Type::Alt) {
            for (const auto& k : n.kids) {
                out.emplace_back();
                append(k, out.back());
            }
        } else if (n.type == Node::Type::Class) {
            out = class_alternatives(n);
        } else {
            out.emplace_back();
            append(n, out.back());
        }
        return out;
    }

    // The class as alternatives: one single-byte set for its ASCII part, one
    // sequence of byte sets for each multi-byte sub-range.
    std::vector<Seq> class_alternatives(const Node& n) {
        std::vector<std::pair<uint32_t, uint32_t>> r = n.ranges;
        std::sort(r.begin(), r.end());
        std::vector<std::pair<uint32_t, uint32_t>> merged;
        for (auto [lo, hi] : r) {
            if (!merged.empty() && lo <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, hi);
            else merged.emplace_back(lo, hi);
        }
        if (n.negated) {
            std::vector<std::pair<uint32_t, uint32_t>> inv;
            uint32_t next = 0;
            for (auto [lo, hi] : merged) {
                if (lo > next) inv.emplace_back(next, lo - 1);
                next = hi + 1;
            }
            if (next <= kMaxCodePoint) inv.emplace_back(next, kMaxCodePoint);
            merged = std::move(inv);
        }
        std::vector<ByteRangeSeq> seqs;
        for (auto [lo, hi] : merged) utf8_sequences(lo, hi, seqs);
        std::vector<Seq> out;
        Grammar::ByteSet ascii{};
        bool any_ascii = false;
        for (const auto& s : seqs) {
            if (s.size() == 1) {
                auto add = range_set(s[0].first, s[0].second);
                for (int w = 0; w < 4; ++w) ascii[size_t(w)] |= add[size_t(w)];
                any_ascii = true;
                continue;
            }
            Seq seq;
            for (auto [lo, hi] : s) seq.push_back({false, set_index(range_set(lo, hi))});
            count(seq.size());
            out.push_back(std::move(seq));
        }
        if (any_ascii) out.insert(out.begin(), Seq{{false, set_index(ascii)}});
        return out;
    }

    // Appends what matches `n` to `seq`, making helper rules as needed.
    void append(const Node& n, Seq& seq) {
        switch (n.type) {
        case Node::Type::Seq:
            for (const auto& k : n.kids) append(k, seq);
            return;
        case Node::Type::Literal:
            count(n.text.size());
            for (unsigned char c : n.text) seq.push_back({false, set_index(range_set(c, c))});
            return;
        case Node::Type::Ref: {
            auto it = index_.find(n.text);
            if (it == index_.end()) throw GrammarError("grammar", fmt::format("grammar: rule '{}' is used but not defined", n.text));
            count(1);
            seq.push_back({true, it->second});
            return;
        }
        case Node::Type::Class: {
            auto alts = class_alternatives(n);
            count(1);
            if (alts.size() == 1 && alts[0].size() == 1) seq.push_back(alts[0][0]);
            else seq.push_back({true, helper_rule(std::move(alts))});
            return;
        }
        case Node::Type::Alt:
            count(1);
            seq.push_back({true, helper_rule(alternatives_of(n))});
            return;
        case Node::Type::Repeat:
            repeat(n, seq);
            return;
        }
    }

    // One item standing for `n` (a rule when `n` needs more than one).
    Item single(const Node& n) {
        Seq s;
        append(n, s);
        if (s.size() == 1) return s[0];
        return {true, helper_rule({std::move(s)})};
    }

    void repeat(const Node& n, Seq& seq) {
        const Node& body = n.kids[0];
        if (n.max == 0) return;
        const Item x = single(body);
        count(n.min + 2);
        if (n.min > kMaxRepeat) throw GrammarError("grammar", "a repeat count is too large");
        for (uint32_t i = 0; i < n.min; ++i) seq.push_back(x);
        if (n.max == kUnbounded) {
            // star ::= x star | ()  -- right recursion in tail position keeps the matcher's stack flat
            const uint32_t star = helper_rule({});
            rules_[star] = {Seq{x, Item{true, star}}, Seq{}};
            seq.push_back({true, star});
            return;
        }
        // opt_k ::= x opt_(k-1) | ()
        uint32_t prev = UINT32_MAX;
        for (uint32_t k = n.min; k < n.max; ++k) {
            Seq more{x};
            if (prev != UINT32_MAX) more.push_back({true, prev});
            count(more.size());
            prev = helper_rule({std::move(more), Seq{}});
        }
        if (prev != UINT32_MAX) seq.push_back({true, prev});
    }

    void check(uint32_t root) {
        const size_t n = rules_.size();
        // Reachable from the root.
        std::vector<char> reach(n, 0);
        std::vector<uint32_t> todo{root};
        reach[root] = 1;
        while (!todo.empty()) {
            const uint32_t r = todo.back();
            todo.pop_back();
            for (const auto& alt : rules_[r])
                for (const auto& it : alt)
                    if (it.ref && !reach[it.arg]) reach[it.arg] = 1, todo.push_back(it.arg);
        }
        // Productive (can end) and nullable (can match nothing), by fixpoint.
        std::vector<char> prod(n, 0), nullable(n, 0);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; ++r) {
                for (const auto& alt : rules_[r]) {
                    bool p = true, e = true;
                    for (const auto& it : alt) {
                        if (it.ref) p = p && prod[it.arg], e = e && nullable[it.arg];
                        else e = false;
                    }
                    if (p && !prod[r]) prod[r] = 1, changed = true;
                    if (e && !nullable[r]) nullable[r] = 1, changed = true;
                }
            }
        }
        for (size_t r = 0; r < n; ++r)
            if (reach[r] && !prod[r])
                throw GrammarError("grammar", fmt::format("grammar: rule '{}' can never end (every alternative "
                                                          "recurses or matches no character)", display(uint32_t(r))));
        // Left recursion: a rule reachable from itself through first items.
        std::vector<uint8_t> color(n, 0);
        for (size_t start = 0; start < n; ++start) {
            if (!reach[start] || color[start]) continue;
            // Iterative DFS over "first" edges.
            auto firsts = [&](uint32_t r) {
                std::vector<uint32_t> f;
                for (const auto& alt : rules_[r])
                    for (const auto& it : alt) {
                        if (!it.ref) break;
                        f.push_back(it.arg);
                        if (!nullable[it.arg]) break;
                    }
                return f;
            };
            std::vector<std::pair<uint32_t, std::vector<uint32_t>>> st;
            st.emplace_back(uint32_t(start), firsts(uint32_t(start)));
            color[start] = 1;
            while (!st.empty()) {
                auto& [r, f] = st.back();
                if (f.empty()) {
                    color[r] = 2;
                    st.pop_back();
                    continue;
                }
                const uint32_t nxt = f.back();
                f.pop_back();
                if (color[nxt] == 1)
                    throw GrammarError("grammar", fmt::format("grammar: rule '{}' is left-recursive (it can reach "
                                                              "itself before matching a character)", display(nxt)));
                if (color[nxt] == 0) {
                    color[nxt] = 1;
                    st.emplace_back(nxt, firsts(nxt));
                }
            }
        }
    }

    std::string display(uint32_t r) const {
        return names_[r].empty() || names_[r][0] == '(' ? "a group or repeat" : names_[r];
    }

    std::shared_ptr<const Grammar> flatten(uint32_t root) {
        auto g = std::make_shared<Grammar>();
        g->sets = std::move(sets_);
        g->names = std::move(names_);
        g->root = root;
        g->alts.resize(rules_.size());
        for (size_t r = 0; r < rules_.size(); ++r) {
            for (const auto& alt : rules_[r]) {
                g->alts[r].push_back(uint32_t(g->elems.size()));
                for (const auto& it : alt)
                    g->elems.push_back({it.ref ? Grammar::Kind::Ref : Grammar::Kind::Bytes, it.arg});
                g->elems.push_back({Grammar::Kind::End, 0});
            }
        }
        return g;
    }

    const std::vector<RuleDef>& defs_;
    std::unordered_map<std::string, uint32_t> index_;
    std::vector<std::vector<Seq>> rules_;
    std::vector<std::string> names_;
    std::vector<Grammar::ByteSet> sets_;
    std::map<Grammar::ByteSet, uint32_t> set_ids_;
    size_t elements_ = 0;
};

}  // namespace

std::shared_ptr<const Grammar> lower(const std::vector<RuleDef>& rules, std::string_view root) {
    return Lowering(rules).run(root);
}

}  // namespace eh::constrain::detail

namespace eh::constrain {

std::shared_ptr<const Grammar> gbnf_grammar(std::string_view text) {
    return detail::lower(detail::parse_gbnf(text), "root");
}

}  // namespace eh::constrain
