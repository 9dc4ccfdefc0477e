#include "stack_set.hpp"

#include <algorithm>
#include <bit>

namespace eh::constrain::detail {
namespace {

using Stack = std::vector<uint32_t>;
constexpr size_t kMaxCloseSteps = 1000000;

class Closer {
public:
    Closer(const Grammar& g, size_t max_stacks, size_t max_depth) : g_(g), max_stacks_(max_stacks), max_depth_(max_depth) {}

    // Expands `s` until its top is a byte set (or it is empty) and collects
    // every stack that results. The grammar has no left recursion, so this
    // ends; stacks past the depth limit are dropped (nesting too deep).
    void close(Stack& s) {
        // Ambiguous grammars (nullable items nested in repeats) can reach the
        // same stacks along exponentially many paths: bound the work.
        if (++steps_ > kMaxCloseSteps)
            throw GrammarError("grammar", "the grammar is too ambiguous to match (one byte expands to more than "
                                          "1,000,000 parse steps); simplify its optional and repeated parts");
        if (out_.size() >= max_stacks_ * 4) return;
        if (s.empty()) {
            out_.push_back(s);
            return;
        }
        const uint32_t p = s.back();
        if (p == kContext) {
            out_.push_back(s);
            return;
        }
        const auto& e = g_.elems[p];
        if (e.kind == Grammar::Kind::Bytes) {
            out_.push_back(s);
            return;
        }
        // A reference: the caller continues after it (unless it was the last
        // item: tail position, so repeats do not grow the stack).
        s.pop_back();
        const bool ret = g_.elems[p + 1].kind != Grammar::Kind::End;
        if (ret) s.push_back(p + 1);
        for (uint32_t start : g_.alts[e.arg]) {
            if (g_.elems[start].kind == Grammar::Kind::End) {
                close(s);
                continue;
            }
            if (s.size() >= max_depth_) continue;
            s.push_back(start);
            close(s);
            s.pop_back();
        }
        if (ret) s.pop_back();
        s.push_back(p);
    }

    // After matching the byte at the top of `s`.
    void after_byte(Stack& s) {
        const uint32_t p = s.back();
        s.pop_back();
        if (g_.elems[p + 1].kind != Grammar::Kind::End) {
            s.push_back(p + 1);
            close(s);
            s.pop_back();
        } else if (s.empty()) {
            out_.push_back(s);
        } else {
            close(s);
        }
        s.push_back(p);
    }

    size_t steps() const { return steps_; }

    StateKey finish() {
        // Sorting counts too: each position compared about log2(n) times.
        size_t positions = 0;
        for (const auto& s : out_) positions += s.size() + 1;
        steps_ += positions * size_t(std::bit_width(out_.size()));
        std::sort(out_.begin(), out_.end());
        out_.erase(std::unique(out_.begin(), out_.end()), out_.end());
        drop_subsumed();
        if (out_.size() > max_stacks_) out_.resize(max_stacks_);
        StateKey key;
        for (const auto& s : out_) {
            key.push_back(uint32_t(s.size()));
            key.insert(key.end(), s.begin(), s.end());
        }
        return key;
    }

private:
    // Drops each stack that another matches a superset of: equal but at
    // counted-repeat positions (Grammar::counted), where the other allows at
    // least as many further copies at every one. What is left matches the
    // same strings; without this a repeat of an ambiguous body keeps a stack
    // for every count it could be at.
    void drop_subsumed() {
        const auto& counted = g_.counted;
        if (counted.empty() || out_.size() < 2) return;
        auto merges = [&](uint32_t p) { return p < counted.size() && counted[p].chain && !g_.chains[counted[p].chain - 1].exact; };
        struct Entry {
            Stack shape;                // counted positions replaced by their chain
            std::vector<uint32_t> left; // their copies left, bottom first
            size_t index;
        };
        std::vector<Entry> es;
        es.reserve(out_.size());
        bool any = false;
        for (size_t i = 0; i < out_.size(); ++i) {
            Entry e{out_[i], {}, i};
            for (auto& p : e.shape)
                if (merges(p)) {
                    e.left.push_back(counted[p].left);
                    p = kContext - 1 - 2 * counted[p].chain - counted[p].copy;
                }
            any = any || !e.left.empty();
            es.push_back(std::move(e));
        }
        if (!any) return;
        steps_ += es.size() * size_t(std::bit_width(es.size()));  // (the sort; comparisons below count too)
        std::sort(es.begin(), es.end(), [](const Entry& a, const Entry& b) {
            return a.shape != b.shape ? a.shape < b.shape : a.left > b.left;
        });
        std::vector<char> drop(out_.size(), 0);
        for (size_t g = 0; g < es.size();) {
            size_t end = g + 1;
            while (end < es.size() && es[end].shape == es[g].shape) ++end;
            std::vector<size_t> kept;
            for (size_t i = g; i < end; ++i) {
                bool subsumed = false;
                for (size_t k : kept) {
                    steps_ += 1 + es[i].left.size();
                    bool all = true;
                    for (size_t d = 0; d < es[i].left.size() && all; ++d) all = es[k].left[d] >= es[i].left[d];
                    if (all) {
                        subsumed = true;
                        break;
                    }
                }
                if (subsumed) drop[es[i].index] = 1;
                else kept.push_back(i);
            }
            g = end;
        }
        size_t w = 0;
        for (size_t i = 0; i < out_.size(); ++i)
            if (!drop[i]) {
                if (w != i) out_[w] = std::move(out_[i]);
                ++w;
            }
        out_.resize(w);
    }

    const Grammar& g_;
    size_t max_stacks_, max_depth_;
    size_t steps_ = 0;
    std::vector<Stack> out_;
};

}  // namespace

StateKey start_key(const Grammar& g, size_t max_stacks, size_t max_depth) {
    Closer c(g, max_stacks, max_depth);
    for (uint32_t start : g.alts[g.root]) {
        Stack s;
        if (g.elems[start].kind != Grammar::Kind::End) s.push_back(start);
        c.close(s);
    }
    return c.finish();
}

StateKey advance_key(const Grammar& g, const StateKey& key, uint8_t byte, size_t max_stacks, size_t max_depth,
                     size_t* steps) {
    Closer c(g, max_stacks, max_depth);
    struct Count {
        const Closer& c;
        size_t* steps;
        ~Count() {
            if (steps) *steps += c.steps() + 1;
        }
    } count{c, steps};
    Stack s;
    for (size_t i = 0; i < key.size();) {
        const uint32_t n = key[i++];
        i += n;
        if (n == 0 || key[i - 1] == kContext) continue;
        const auto& e = g.elems[key[i - 1]];
        if (e.kind != Grammar::Kind::Bytes || !g.has(e.arg, byte)) continue;  // (most bytes: no copy)
        s.assign(key.begin() + long(i - n), key.begin() + long(i));
        c.after_byte(s);
    }
    return c.finish();
}

StateKey clamp_counts(const Grammar& g, const StateKey& key, uint32_t limit) {
    if (g.counted.empty()) return key;
    std::vector<Stack> stacks;
    bool changed = false;
    for (size_t i = 0; i < key.size();) {
        const uint32_t n = key[i++];
        Stack st(key.begin() + long(i), key.begin() + long(i + n));
        i += n;
        for (auto& p : st) {
            if (p >= g.counted.size() || !g.counted[p].chain || g.counted[p].left <= limit) continue;
            const auto& at = g.chains[g.counted[p].chain - 1].at;
            if (limit < at.size() && at[limit] != UINT32_MAX) {
                p = at[limit] - (g.counted[p].copy ? 1 : 0);
                changed = true;
            }
        }
        stacks.push_back(std::move(st));
    }
    if (!changed) return key;
    std::sort(stacks.begin(), stacks.end());
    stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
    StateKey out;
    for (const auto& st : stacks) {
        out.push_back(uint32_t(st.size()));
        out.insert(out.end(), st.begin(), st.end());
    }
    return out;
}

bool key_accepting(const StateKey& key) {
    for (size_t i = 0; i < key.size(); i += 1 + key[i])
        if (key[i] == 0) return true;
    return false;
}

bool key_complete(const StateKey& key) { return key.size() == 1 && key[0] == 0; }

bool key_has_context(const StateKey& key) {
    for (size_t i = 0; i < key.size(); i += 1 + key[i])
        if (key[i] == 1 && key[i + 1] == kContext) return true;
    return false;
}

StateKey truncate_key(const StateKey& key, size_t& max_len, size_t& stacks) {
    // The bottom positions every stack shares are the context (where the
    // current value sits: which property, which array); cut them, keeping at
    // least the top of every stack.
    std::vector<std::pair<size_t, size_t>> spans;  // (start, length)
    max_len = 0;
    size_t min_len = SIZE_MAX;
    for (size_t i = 0; i < key.size(); i += 1 + key[i]) {
        spans.emplace_back(i + 1, key[i]);
        max_len = std::max<size_t>(max_len, key[i]);
        min_len = std::min<size_t>(min_len, key[i]);
    }
    stacks = spans.size();
    if (spans.empty() || min_len == 0) return key;
    size_t common = min_len - 1;
    for (const auto& [start, len] : spans)
        for (size_t d = 0; d < common; ++d)
            if (key[start + d] != key[spans[0].first + d]) {
                common = d;
                break;
            }
    if (common == 0) return key;
    std::vector<Stack> out;
    for (const auto& [start, len] : spans) {
        Stack s{kContext};
        s.insert(s.end(), key.begin() + long(start + common), key.begin() + long(start + len));
        out.push_back(std::move(s));
    }
    std::sort(out.begin(), out.end());
    StateKey t;
    for (const auto& s : out) {
        t.push_back(uint32_t(s.size()));
        t.insert(t.end(), s.begin(), s.end());
    }
    return t;
}

}  // namespace eh::constrain::detail
