// Syntax tree -> Grammar: groups, alternations inside sequences, repeats and
// multi-byte character classes become rules of their own; then the checks
// that keep the matcher total: every rule reachable from the root can end
// (so any valid prefix has a completion) and none is left-recursive (so
// expanding a rule terminates).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <map>
#include <tuple>
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

// The least fixpoint "a rule is marked when one of its alternatives has
// only marked rule references, and (terminals_block) no byte set": rules
// that can match nothing (terminals block) or can end (they do not), from
// the marks given. A worklist over the references, linear in the grammar's
// size (a sweep over all rules until nothing changes takes one pass per
// link of the longest chain, quadratic on large schema grammars).
void least_fixpoint(const std::vector<std::vector<Seq>>& rules, bool terminals_block, std::vector<char>& mark) {
    const size_t n = rules.size();
    std::vector<uint32_t> waiting;  // per alternative: unmarked references left
    std::vector<uint32_t> owner;    // per alternative: its rule
    // Per rule, the alternatives naming it (once per naming), in one array:
    // users of rule q are user[first[q] .. first[q + 1]).
    std::vector<uint32_t> first(n + 1, 0), user;
    std::vector<uint32_t> todo;
    for (size_t r = 0; r < n; ++r)
        for (const auto& alt : rules[r]) {
            bool blocked = false;
            for (const auto& it : alt) blocked = blocked || (!it.ref && terminals_block);
            if (blocked) continue;
            for (const auto& it : alt)
                if (it.ref) ++first[it.arg + 1];
        }
    for (size_t q = 0; q < n; ++q) first[q + 1] += first[q];
    user.resize(first[n]);
    std::vector<uint32_t> fill(first.begin(), first.end() - 1);
    for (size_t r = 0; r < n; ++r) {
        if (mark[r]) todo.push_back(uint32_t(r));
        for (const auto& alt : rules[r]) {
            bool blocked = false;
            uint32_t refs = 0;
            for (const auto& it : alt) {
                if (!it.ref) blocked = blocked || terminals_block;
                else ++refs;
            }
            if (blocked) continue;
            const uint32_t a = uint32_t(waiting.size());
            waiting.push_back(refs);
            owner.push_back(uint32_t(r));
            for (const auto& it : alt)
                if (it.ref) user[fill[it.arg]++] = a;
            if (refs == 0 && !mark[r]) mark[r] = 1, todo.push_back(uint32_t(r));
        }
    }
    while (!todo.empty()) {
        const uint32_t q = todo.back();
        todo.pop_back();
        for (uint32_t k = first[q]; k < first[q + 1]; ++k) {
            const uint32_t a = user[k];
            if (--waiting[a] == 0 && !mark[owner[a]]) mark[owner[a]] = 1, todo.push_back(owner[a]);
        }
    }
}

// Rule name -> index, open addressing over views of the definitions'
// names: a schema grammar looks up some 100,000 references among 25,000
// rules, where a node-based map's pointer chasing shows in compile time.
class NameIndex {
public:
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < 2 * n) cap <<= 1;
        slots_.assign(cap, {});
    }
    // Adds name -> value; false if the name is already there.
    bool add(std::string_view name, uint32_t value) {
        if (2 * (count_ + 1) > slots_.size()) grow();
        Slot& s = slots_[place(name)];
        if (s.used) return false;
        s = {name, value, true};
        ++count_;
        return true;
    }
    const uint32_t* find(std::string_view name) const {
        if (slots_.empty()) return nullptr;
        const Slot& s = slots_[place(name)];
        return s.used ? &s.value : nullptr;
    }

private:
    struct Slot {
        std::string_view name;
        uint32_t value = 0;
        bool used = false;
    };
    // The name's slot, or the free one where it would go (never full: at
    // most half the slots are used).
    size_t place(std::string_view name) const {
        const size_t mask = slots_.size() - 1;
        for (size_t i = std::hash<std::string_view>{}(name) & mask;; i = (i + 1) & mask)
            if (!slots_[i].used || slots_[i].name == name) return i;
    }
    void grow() {
        std::vector<Slot> old = std::move(slots_);
        reserve(std::max<size_t>(old.size(), 8));
        count_ = 0;
        for (const Slot& s : old)
            if (s.used) add(s.name, s.value);
    }
    std::vector<Slot> slots_;
    size_t count_ = 0;
};

class Lowering {
public:
    Lowering(const std::vector<RuleDef>& defs, const GrammarLimits& limits) : defs_(defs), limits_(limits) {
        index_.reserve(defs.size());
        rules_.reserve(defs.size() * 2);
        names_.reserve(defs.size() * 2);
        nullable_.reserve(defs.size() * 2);
        counted_.reserve(defs.size() * 2);
        for (const auto& d : defs) {
            if (!index_.add(d.name, uint32_t(rules_.size())))
                throw GrammarError("grammar", fmt::format("grammar: rule '{}' is defined twice (line {})", d.name, d.line));
            new_rule(d.name);
        }
    }

    std::shared_ptr<const Grammar> run(std::string_view root) {
        const uint32_t* root_rule = index_.find(root);
        if (!root_rule) throw GrammarError("grammar", fmt::format("grammar: there is no rule named '{}'", root));
        // (rule i is defs_[i]: the constructor numbered them in order)
        for (size_t i = 0; i < defs_.size(); ++i) rules_[i] = alternatives_of(defs_[i].body);
        // Repeats last: how one is lowered depends on whether its body can
        // match nothing, which needs every rule.
        find_nullable();
        for (size_t i = 0; i < repeats_.size(); ++i) {
            Seq seq = repeat_seq(repeats_[i]);  // (may add rules)
            rules_[repeats_[i].rule] = {std::move(seq)};
        }
        check(*root_rule);
        return flatten(*root_rule);
    }

private:
    uint32_t new_rule(std::string name) {
        if (rules_.size() >= limits_.rules)
            throw GrammarError("grammar", fmt::format("the grammar needs more than {} rules (the limit; a counted "
                                                      "repeat {{m,n}} takes n-m+2 of them)", limits_.rules));
        rules_.emplace_back();
        names_.push_back(std::move(name));
        nullable_.push_back(0);
        counted_.emplace_back();
        return uint32_t(rules_.size() - 1);
    }
    uint32_t helper_rule(std::vector<Seq> alts) {
        const uint32_t r = new_rule({});  // (unnamed: display() calls it a group or repeat)
        rules_[r] = std::move(alts);
        return r;
    }
    void count(size_t n) {
        elements_ += n;
        if (elements_ > limits_.elements)
            throw GrammarError("grammar", fmt::format("the grammar has more than {} items", limits_.elements));
    }

    uint32_t set_index(const Grammar::ByteSet& s) {
        auto [it, fresh] = set_ids_.emplace(s, uint32_t(sets_.size()));
        if (fresh) sets_.push_back(s);
        return it->second;
    }
    // The set of one byte (most of a schema grammar's literals), cached.
    uint32_t byte_set(uint8_t c) {
        if (byte_sets_[c] == UINT32_MAX) byte_sets_[c] = set_index(range_set(c, c));
        return byte_sets_[c];
    }
    static Grammar::ByteSet range_set(uint8_t lo, uint8_t hi) {
        Grammar::ByteSet s{};
        for (unsigned b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t(1) << (b & 63);
        return s;
    }

    std::vector<Seq> alternatives_of(const Node& n) {
        std::vector<Seq> out;
        if (n.type == Node::Type::Alt) {
            out.reserve(n.kids.size());
            for (const auto& k : n.kids) {
                out.emplace_back().reserve(items_of(k));
                append(k, out.back());
            }
        } else if (n.type == Node::Type::Class) {
            out = class_alternatives(n);
        } else {
            out.emplace_back().reserve(items_of(n));
            append(n, out.back());
        }
        return out;
    }

    // How many items append() makes of `n` at most where it adds no rule
    // of its own (a literal's bytes, the rest one each): the sequence's
    // size, reserved once instead of grown byte by byte.
    static size_t items_of(const Node& n) {
        if (n.type == Node::Type::Literal) return n.text.size();
        if (n.type != Node::Type::Seq) return 1;
        size_t k = 0;
        for (const auto& kid : n.kids) k += kid.type == Node::Type::Literal ? kid.text.size() : 1;
        return k;
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
        std::vector<ByteRangeSeq> multi;
        Grammar::ByteSet ascii{};
        bool any_ascii = false;
        for (auto& s : seqs) {
            if (s.size() == 1) {
                auto add = range_set(s[0].first, s[0].second);
                for (int w = 0; w < 4; ++w) ascii[size_t(w)] |= add[size_t(w)];
                any_ascii = true;
            } else {
                multi.push_back(std::move(s));
            }
        }
        std::vector<Seq> out = factored(multi, 0);
        if (any_ascii) out.insert(out.begin(), Seq{{false, set_index(ascii)}});
        return out;
    }

    // The byte-range sequences from position `at` on, with the ones that
    // share their byte range there merged into one alternative whose rest
    // is a helper rule: a large class (a Unicode property, hundreds of
    // ranges) then has one alternative per byte, not hundreds, and the
    // matcher one parse stack for it. Sequences that share a range there
    // have the same length (a UTF-8 lead byte fixes it).
    std::vector<Seq> factored(const std::vector<ByteRangeSeq>& seqs, size_t at) {
        std::vector<std::vector<ByteRangeSeq>> groups;
        std::map<std::pair<uint8_t, uint8_t>, size_t> index;
        for (const auto& q : seqs) {
            auto [it, fresh] = index.emplace(q[at], groups.size());
            if (fresh) groups.emplace_back();
            groups[it->second].push_back(q);
        }
        std::vector<Seq> out;
        for (auto& group : groups) {
            const ByteRangeSeq& first = group[0];
            Seq seq{{false, set_index(range_set(first[at].first, first[at].second))}};
            if (at + 1 < first.size()) {
                if (group.size() == 1) {
                    for (size_t k = at + 1; k < first.size(); ++k)
                        seq.push_back({false, set_index(range_set(first[k].first, first[k].second))});
                } else {
                    seq.push_back({true, helper_rule(factored(group, at + 1))});
                }
            }
            count(seq.size());
            out.push_back(std::move(seq));
        }
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
            for (unsigned char c : n.text) seq.push_back({false, byte_set(c)});
            return;
        case Node::Type::Ref: {
            const uint32_t* rule = index_.find(n.text);
            if (!rule) throw GrammarError("grammar", fmt::format("grammar: rule '{}' is used but not defined", n.text));
            count(1);
            seq.push_back({true, *rule});
            return;
        }
        case Node::Type::Class: {
            // A class met again (a pattern's \p{L} in every property it
            // checks) is the same rule.
            std::string key(n.negated ? "^" : "");
            for (auto [lo, hi] : n.ranges) key += fmt::format("{:x}-{:x},", lo, hi);
            count(1);
            if (auto it = class_rules_.find(key); it != class_rules_.end()) {
                seq.push_back(it->second);
                return;
            }
            auto alts = class_alternatives(n);
            const Item item = alts.size() == 1 && alts[0].size() == 1 ? alts[0][0] : Item{true, helper_rule(std::move(alts))};
            class_rules_.emplace(std::move(key), item);
            seq.push_back(item);
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

    // A repeat becomes a rule of its own, filled in by repeat_seq() once
    // every rule is known; until then it holds stand-in alternatives that
    // are nullable and productive exactly when the repeat is.
    void repeat(const Node& n, Seq& seq) {
        const Node& body = n.kids[0];
        if (n.max == 0) return;
        const Item x = single(body);
        count(n.min + 2);
        if (n.min > kMaxRepeat) throw GrammarError("grammar", fmt::format("a repeat count is larger than {}", kMaxRepeat));
        std::vector<Seq> stand_in{Seq{x}};
        if (n.min == 0) stand_in.push_back(Seq{});
        const uint32_t r = helper_rule(std::move(stand_in));
        repeats_.push_back({r, x, n.min, n.max});
        repeat_of_[r] = repeats_.size() - 1;
        seq.push_back({true, r});
    }

    struct Repeat {
        uint32_t rule;
        Item x;
        uint32_t min, max;
    };

    // x{min,max}. A body that can match nothing is replaced by its non-empty
    // form x' (x{m,n} == x'{0,n}): otherwise every count below the current
    // one is reachable through empty matches at every byte, and the matcher
    // would carry a parse stack for each (docs/robustness.md, slow masks).
    Seq repeat_seq(const Repeat& rp) {
        Item x = rp.x;
        uint32_t min = rp.min;
        if (nullable_item(x)) {
            const auto ne = nonempty(x);
            if (ne.kind == NonEmpty::Kind::OnlyEmpty) return {};
            if (ne.kind != NonEmpty::Kind::Ok) return counted(x, min, rp.max, false);  // (stays ambiguous)
            x = ne.item, min = 0;
        }
        return counted(x, min, rp.max);
    }

    // min copies of x, then up to max-min more, as chains of rules:
    //   need_k ::= x need_(k-1)   (k = min .. 1)   need_0 ::= rest
    //   opt_k  ::= x opt_(k-1) | ()  (k = max-min .. 1)   opt_0 ::= ()
    // (rest: opt_(max-min), or star ::= x star | () when unbounded: right
    // recursion in tail position keeps the matcher's stack flat). A few
    // mandatory copies stay inline. Every reference to the rest of a chain
    // is its link's last item, and is marked (Grammar::chains) so the
    // matcher can merge stacks that differ only in their count. x must not
    // match the empty string where a chain is built (repeat_seq).
    Seq counted(Item x, uint32_t min, uint32_t max, bool chains = true) {
        // The same repeat met again (a bounded number's `[0-9]{0,k}` in each
        // property that has those bounds) shares its rules: they depend on
        // nothing else, and a schema grammar holds thousands of them.
        const auto key = std::make_tuple(x.ref, x.arg, min, max, chains);
        if (auto it = counted_of_.find(key); it != counted_of_.end()) return it->second;
        Seq seq = counted_rules(x, min, max, chains);
        counted_of_.emplace(key, seq);
        return seq;
    }
    Seq counted_rules(Item x, uint32_t min, uint32_t max, bool chains) {
        constexpr uint32_t kInline = 4;
        Seq rest;
        if (max == kUnbounded) {
            const uint32_t star = helper_rule({});
            rules_[star] = {Seq{x, Item{true, star}}, Seq{}};
            nullable_[star] = 1;
            rest.push_back({true, star});
        } else if (max > min) {
            if (!chains) {
                for (uint32_t k = min; k < max; ++k) {
                    Seq more{x};
                    if (!rest.empty()) more.push_back(rest[0]);
                    count(more.size());
                    const uint32_t r = helper_rule({std::move(more), Seq{}});
                    nullable_[r] = 1;
                    rest = {Item{true, r}};
                }
            } else {
                rest = {Item{true, chain(x, max - min, false, {})}};
            }
        }
        if (min <= kInline || !chains) {
            Seq seq(min, x);
            seq.insert(seq.end(), rest.begin(), rest.end());
            return seq;
        }
        return {Item{true, chain(x, min, true, std::move(rest))}};
    }

    // The chain's head: n links, each "x, then the link below", the last
    // link's "below" `end` (exact) or the empty match ("up to", where every
    // link may also match nothing).
    uint32_t chain(Item x, uint32_t n, bool exact, Seq end) {
        const uint32_t c = ++chains_;
        bool end_nullable = true;
        for (const Item& it : end) end_nullable = end_nullable && nullable_item(it);
        uint32_t prev = helper_rule({std::move(end)});
        nullable_[prev] = end_nullable;
        counted_[prev] = {c, 0};
        for (uint32_t k = 1; k <= n; ++k) {
            count(2);
            std::vector<Seq> link{Seq{x, Item{true, prev}}};
            if (!exact) link.push_back(Seq{});
            prev = helper_rule(std::move(link));
            nullable_[prev] = !exact;
            counted_[prev] = {c, k};
        }
        exact_chain_.push_back(exact);
        return prev;
    }

    // The non-empty form of an item that can match nothing: what it matches
    // but the empty string, as an item; OnlyEmpty when that is nothing;
    // TooLarge when writing it out would multiply alternatives past
    // kMaxNullableItems per alternative (the repeat then keeps its body).
    struct NonEmpty {
        enum class Kind { Ok, OnlyEmpty, TooLarge } kind = Kind::Ok;
        Item item{};
    };
    static constexpr size_t kMaxNullableItems = 6;

    bool nullable_item(const Item& it) const { return it.ref && nullable_[it.arg]; }

    NonEmpty nonempty(const Item& it) {
        if (!nullable_item(it)) return {NonEmpty::Kind::Ok, it};
        const uint32_t r = it.arg;
        if (auto m = nonempty_of_.find(r); m != nonempty_of_.end()) return m->second;
        const uint32_t out = helper_rule({});
        nonempty_of_[r] = {NonEmpty::Kind::Ok, Item{true, out}};  // (a recursive use refers to it)
        std::vector<Seq> alts;
        NonEmpty::Kind fail = NonEmpty::Kind::Ok;
        if (auto rp = repeat_of_.find(r); rp != repeat_of_.end()) {
            // x{0,n} without the empty match: x'{1,n}.
            const Repeat spec = repeats_[rp->second];
            Item x = spec.x;
            if (nullable_item(x)) {
                const auto ne = nonempty(x);
                if (ne.kind != NonEmpty::Kind::Ok) fail = ne.kind;
                x = ne.item;
            }
            if (fail == NonEmpty::Kind::Ok) alts.push_back(counted(x, 1, spec.max));
        } else {
            const std::vector<Seq> src = rules_[r];  // (helper_rule may reallocate rules_)
            for (const Seq& alt : src) {
                std::vector<size_t> opt;  // its items that can match nothing
                for (size_t i = 0; i < alt.size(); ++i)
                    if (nullable_item(alt[i])) opt.push_back(i);
                if (opt.size() > kMaxNullableItems) {
                    fail = NonEmpty::Kind::TooLarge;
                    break;
                }
                // Each subset of them present (in non-empty form), the rest left out.
                for (uint32_t keep = 0; keep < (1u << opt.size()) && fail == NonEmpty::Kind::Ok; ++keep) {
                    Seq v;
                    bool possible = true;
                    for (size_t i = 0, o = 0; i < alt.size(); ++i) {
                        if (o < opt.size() && opt[o] == i) {
                            if ((keep >> o++) & 1u) {
                                const auto ne = nonempty(alt[i]);
                                if (ne.kind == NonEmpty::Kind::TooLarge) fail = ne.kind;
                                if (ne.kind != NonEmpty::Kind::Ok) possible = false;
                                else v.push_back(ne.item);
                            }
                        } else {
                            v.push_back(alt[i]);
                        }
                    }
                    if (possible && !v.empty()) {
                        count(v.size());
                        alts.push_back(std::move(v));
                    }
                }
                if (fail != NonEmpty::Kind::Ok) break;
            }
        }
        if (fail == NonEmpty::Kind::Ok && alts.empty()) fail = NonEmpty::Kind::OnlyEmpty;
        if (fail != NonEmpty::Kind::Ok) {
            // (A rule that already refers to `out` is part of a cycle through
            // empty matches: left recursion, which check() refuses.)
            nonempty_of_[r] = {fail, {}};
            return nonempty_of_[r];
        }
        rules_[out] = std::move(alts);
        return nonempty_of_[r];
    }

    // Which rules can match nothing, by fixpoint (repeats by their stand-ins).
    void find_nullable() { least_fixpoint(rules_, true, nullable_); }

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
        // Productive (can end), by fixpoint. Nullable (can match nothing):
        // nullable_, the fixpoint find_nullable() took over the stand-ins,
        // which are nullable exactly when their repeats are, kept for every
        // rule made since (each is made knowing whether it is); a debug
        // build takes the fixpoint again and compares.
        std::vector<char> prod(n, 0);
        least_fixpoint(rules_, false, prod);
        const std::vector<char>& nullable = nullable_;
#ifndef NDEBUG
        std::vector<char> again(n, 0);
        least_fixpoint(rules_, true, again);
        for (size_t r = 0; r < n; ++r) assert(bool(again[r]) == bool(nullable[r]));
#endif
        for (size_t r = 0; r < n; ++r)
            if (reach[r] && !prod[r])
                throw GrammarError("grammar", fmt::format("grammar: rule '{}' can never end (every alternative "
                                                          "recurses or matches no character)", display(uint32_t(r))));
        // Left recursion: a rule reachable from itself through first items.
        // Each rule's "first" edges (the references it may start with) in
        // one array, first_of[r] .. first_of[r + 1]: no allocation per rule.
        std::vector<uint32_t> first_of(n + 1, 0), firsts;
        for (size_t r = 0; r < n; ++r) {
            first_of[r] = uint32_t(firsts.size());
            for (const auto& alt : rules_[r])
                for (const auto& it : alt) {
                    if (!it.ref) break;
                    firsts.push_back(it.arg);
                    if (!nullable[it.arg]) break;
                }
        }
        first_of[n] = uint32_t(firsts.size());
        // Iterative DFS over them, each rule's edges taken last to first;
        // a frame is the rule and how many of its edges are left.
        std::vector<uint8_t> color(n, 0);
        std::vector<std::pair<uint32_t, uint32_t>> st;
        for (size_t start = 0; start < n; ++start) {
            if (!reach[start] || color[start]) continue;
            st.emplace_back(uint32_t(start), first_of[start + 1] - first_of[start]);
            color[start] = 1;
            while (!st.empty()) {
                auto& [r, left] = st.back();
                if (left == 0) {
                    color[r] = 2;
                    st.pop_back();
                    continue;
                }
                const uint32_t nxt = firsts[first_of[r] + --left];
                if (color[nxt] == 1)
                    throw GrammarError("grammar", fmt::format("grammar: rule '{}' is left-recursive (it can reach "
                                                              "itself before matching a character)", display(nxt)));
                if (color[nxt] == 0) {
                    color[nxt] = 1;
                    st.emplace_back(nxt, first_of[nxt + 1] - first_of[nxt]);
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
        // A reference to a link of a counted repeat's chain, as the last item
        // of its alternative (the only place chain() puts one; the head may
        // also be referred to elsewhere, unmarked: never on a parse stack).
        if (chains_) {
            g->counted.resize(g->elems.size());
            g->chains.resize(chains_);
            for (uint32_t c = 0; c < chains_; ++c) g->chains[c].exact = exact_chain_[c];
            for (size_t p = 0; p + 1 < g->elems.size(); ++p) {
                const auto& e = g->elems[p];
                const auto k = e.kind == Grammar::Kind::Ref ? counted_[e.arg] : Grammar::Counted{};
                if (!k.chain || g->elems[p + 1].kind != Grammar::Kind::End) continue;
                auto& at = g->chains[k.chain - 1].at;
                if (at.size() <= k.left) at.resize(k.left + 1, UINT32_MAX);
                if (at[k.left] != UINT32_MAX) continue;  // (one element per count is enough)
                at[k.left] = uint32_t(p);
                g->counted[p] = k;
            }
            // Each link's x (the item before its reference to the rest).
            for (size_t r = 0; r < rules_.size(); ++r) {
                const auto k = counted_[r];
                if (!k.chain || k.left == 0) continue;
                const uint32_t p = g->alts[r][0];
                if (g->chains[k.chain - 1].at.size() > k.left - 1 && g->chains[k.chain - 1].at[k.left - 1] == p + 1)
                    g->counted[p] = {k.chain, k.left - 1, true};
            }
        }
        return g;
    }

    const std::vector<RuleDef>& defs_;
    const GrammarLimits limits_;
    NameIndex index_;  // (views of defs_' names)
    std::vector<std::vector<Seq>> rules_;
    std::map<std::string, Item> class_rules_;  // a class's ranges -> what stands for it
    std::vector<std::string> names_;
    std::vector<Grammar::ByteSet> sets_;
    std::map<Grammar::ByteSet, uint32_t> set_ids_;
    std::array<uint32_t, 256> byte_sets_ = filled_byte_sets();
    static std::array<uint32_t, 256> filled_byte_sets() {
        std::array<uint32_t, 256> a;
        a.fill(UINT32_MAX);
        return a;
    }
    size_t elements_ = 0;
    std::vector<char> nullable_;                     // per rule (find_nullable, then as made)
    std::vector<Grammar::Counted> counted_;          // per rule: its place in a repeat's chain
    std::vector<Repeat> repeats_;                    // in creation order (inner before outer)
    std::unordered_map<uint32_t, size_t> repeat_of_; // repeat rule -> repeats_ index
    std::unordered_map<uint32_t, NonEmpty> nonempty_of_;
    std::map<std::tuple<bool, uint32_t, uint32_t, uint32_t, bool>, Seq> counted_of_;
    uint32_t chains_ = 0;
    std::vector<char> exact_chain_;  // per chain (1-based id - 1)
};

}  // namespace

std::shared_ptr<const Grammar> lower(const std::vector<RuleDef>& rules, std::string_view root, const GrammarLimits& limits) {
    return Lowering(rules, limits).run(root);
}

}  // namespace eh::constrain::detail

namespace eh::constrain {

std::shared_ptr<const Grammar> gbnf_grammar(std::string_view text) {
    return detail::lower(detail::parse_gbnf(text), "root");
}

}  // namespace eh::constrain
