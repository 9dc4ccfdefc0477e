// ECMA-262 regular expressions (the subset regex.hpp lists) to grammar
// text over JSON string content. The regex is parsed to a small tree of
// sequences, alternations, code point sets and counted repeats, which maps
// one to one onto the grammar's items; sets become JSON-encoded character
// expressions. Size is bounded by the pattern's length and kMaxRepeat here,
// and by the grammar's own rule and text limits after.
#include "regex.hpp"

#include <fmt/format.h>

#include <unicode/uniset.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <vector>

#include "eh/constrain/grammar.hpp"

namespace eh::constrain::detail {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr uint32_t kInf = UINT32_MAX;

Ranges normalize(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (const auto& [lo, hi] : r) {
        if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
        else out.emplace_back(lo, hi);
    }
    return out;
}

Ranges complement(const Ranges& r0) {
    const Ranges r = normalize(r0);
    Ranges out;
    uint32_t next = 0;
    for (const auto& [lo, hi] : r) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = hi + 1;
    }
    if (next <= kMaxCp) out.emplace_back(next, kMaxCp);
    return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMA-262 WhiteSpace and LineTerminator.
const Ranges kSpace = {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kLineTerminators = {{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}};

// Bol/Eol are ^ and $, Look a positive lookahead (its kid the group); the
// anchoring pass (anchor_start/anchor_end) removes the ones it can express
// and refuses the rest. `any` marks the set that stands for the unanchored
// sides (emitted as the caller's any-character rule).
struct RNode {
    enum class K { Seq, Alt, Set, Rep, Bol, Eol, Look, NotLook } k = K::Seq;
    std::vector<RNode> kids;
    Ranges set;
    uint32_t min = 0, max = 0;
    bool any = false;
};

struct Lengths {
    uint64_t min = 0, max = 0;  // max: kRegexUnbounded
};

uint64_t sat_add(uint64_t a, uint64_t b) { return a > kRegexUnbounded - b ? kRegexUnbounded : a + b; }
uint64_t sat_mul(uint64_t a, uint64_t b) {
    if (a == 0 || b == 0) return 0;
    return a > kRegexUnbounded / b ? kRegexUnbounded : a * b;
}

Lengths lengths(const RNode& n) {
    switch (n.k) {
    case RNode::K::Set: return {1, 1};
    case RNode::K::Bol: case RNode::K::Eol: case RNode::K::Look: case RNode::K::NotLook: return {0, 0};
    case RNode::K::Seq: {
        Lengths l;
        for (const auto& k : n.kids) {
            const Lengths c = lengths(k);
            l.min = sat_add(l.min, c.min);
            l.max = sat_add(l.max, c.max);
        }
        return l;
    }
    case RNode::K::Alt: {
        Lengths l{kRegexUnbounded, 0};
        for (const auto& k : n.kids) {
            const Lengths c = lengths(k);
            l.min = std::min(l.min, c.min);
            l.max = std::max(l.max, c.max);
        }
        return l;
    }
    case RNode::K::Rep: {
        const Lengths c = lengths(n.kids[0]);
        return {sat_mul(c.min, n.min), n.max == kInf ? (c.max ? kRegexUnbounded : 0) : sat_mul(c.max, n.max)};
    }
    }
    return {};
}

class RegexParser {
public:
    explicit RegexParser(std::string_view src) : src_(src) {
        // nlohmann hands the pattern over as valid UTF-8; decode it to code points.
        for (size_t i = 0; i < src.size();) {
            const auto b = uint8_t(src[i]);
            uint32_t cp = b;
            int extra = b < 0x80 ? 0 : b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
            if (b >= 0x80) cp = b & (0x3F >> extra);
            if (i + extra >= src.size() + (extra ? 0 : 1)) fail("is not valid UTF-8");
            for (int k = 1; k <= extra; ++k) cp = (cp << 6) | (uint8_t(src[i + k]) & 0x3F);
            cps_.push_back(cp);
            i += extra + 1;
        }
    }

    // The whole pattern: an alternation, anchored (see anchor_start). With
    // `search` false the pattern must match the whole text: the open
    // sides stay closed (^ and $ change nothing).
    RNode run(bool search = true) {
        search_ = search;
        RNode top = alt(0);
        if (!eof()) fail("has an unmatched ')'");
        top = anchor_end(anchor_start(std::move(top)));
        bounds_.assign(top.kids.size(), std::nullopt);
        for (size_t i = 0; i < top.kids.size(); ++i) top.kids[i] = length_lookahead(std::move(top.kids[i]), i);
        for (auto& a : top.kids) a = negative_lookahead(std::move(a));
        check_anchors(top);
        return top;
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw GrammarError("pattern", fmt::format("'pattern' \"{}\" {}", src_.substr(0, 200), what));
    }
    // Per top-level alternative: the length bounds a lookahead gave it
    // (regex_grammar narrows the alternative to them).
    const std::vector<std::optional<std::pair<uint64_t, uint64_t>>>& bounds() const { return bounds_; }

private:
    // A lookahead right after ^ that, with what follows, says "these
    // characters, this many of them": "^(?=.{3,64}$)arn.*",
    // "^(?=^[a-z0-9-]+$).{3,64}$". The alternative becomes the other side
    // with its characters kept within the counted class and its length
    // bounds recorded (narrowed to them later, as for minLength/maxLength).
    RNode length_lookahead(RNode a, size_t index) {
        if (a.k != RNode::K::Seq || a.kids.empty() || a.kids[0].k != RNode::K::Look) return a;
        const RNode& y = a.kids[0].kids[0];  // the lookahead's alternation
        if (y.kids.size() != 1 || y.kids[0].k != RNode::K::Seq) return a;
        std::vector<RNode> inner = y.kids[0].kids;
        while (!inner.empty() && inner.front().k == RNode::K::Bol) inner.erase(inner.begin());
        if (inner.empty() || inner.back().k != RNode::K::Eol) return a;  // must reach the end
        while (!inner.empty() && inner.back().k == RNode::K::Eol) inner.pop_back();
        std::vector<RNode> rest(a.kids.begin() + 1, a.kids.end());
        auto counted = [](const std::vector<RNode>& v) {
            return v.size() == 1 && v[0].k == RNode::K::Rep && v[0].kids[0].k == RNode::K::Set;
        };
        const RNode* count = nullptr;
        RNode body;
        if (counted(inner)) {  // (?=.{m,n}$) then the pattern
            count = &inner[0];
            body.kids = std::move(rest);
        } else if (counted(rest) && !rest[0].kids[0].any) {  // (?=^p$) then .{m,n} (the $ already taken)
            count = &rest[0];
            body.kids = std::move(inner);
        } else {
            return a;
        }
        if (holds(body, RNode::K::Bol) || holds(body, RNode::K::Eol) || holds(body, RNode::K::Look) ||
            holds(body, RNode::K::NotLook))
            return a;
        keep_within(body, count->kids[0].set);
        bounds_[index] = std::make_pair(uint64_t(count->min), count->max == kInf ? kRegexUnbounded : uint64_t(count->max));
        return body;
    }
    // Every character class in n cut to `allowed`.
    void keep_within(RNode& n, const Ranges& allowed) {
        for (auto& k : n.kids) keep_within(k, allowed);
        if (n.k != RNode::K::Set) return;
        Ranges kept = minus(n.set, complement(allowed));
        if (kept.empty()) fail("has a class with no character its lookahead allows");
        n.set = std::move(kept);
        n.any = false;
    }

    static RNode any_star() {
        RNode a{RNode::K::Set, {}, {{0, kMaxCp}}, 0, 0, true};
        RNode r{RNode::K::Rep, {}, {}, 0, kInf};
        r.kids.push_back(std::move(a));
        return r;
    }
    // A pattern is a search: what is not anchored by ^ may have anything
    // before it. ^ is honoured where it is the first thing matched: at the
    // start of a top-level alternative, or of an alternative of a group that
    // itself starts the pattern (`^a|b`, `(^a|b)c`); elsewhere it is refused.
    // `closed`: a ^ before this node already anchors the start (one inside
    // it then changes nothing: "^(^\d+$|arn:.*)$").
    RNode anchor_start(RNode n, bool closed = false) {
        switch (n.k) {
        case RNode::K::Alt:
            for (auto& k : n.kids) k = anchor_start(std::move(k), closed);
            return n;
        case RNode::K::Seq: {
            if (!n.kids.empty() && n.kids[0].k == RNode::K::Bol) {
                while (!n.kids.empty() && n.kids[0].k == RNode::K::Bol) n.kids.erase(n.kids.begin());
                return anchor_start(std::move(n), true);
            }
            if (!n.kids.empty() && (n.kids[0].k == RNode::K::Alt || n.kids[0].k == RNode::K::Seq)) {
                n.kids[0] = anchor_start(std::move(n.kids[0]), closed);
                return n;
            }
            if (search_ && !closed) n.kids.insert(n.kids.begin(), any_star());
            return n;
        }
        default: {
            RNode s;
            if (search_ && !closed) s.kids.push_back(any_star());
            s.kids.push_back(std::move(n));
            return s;
        }
        }
    }
    // The same at the end for $, and for a positive lookahead (?=y) that is
    // the last thing in the pattern: with the end open, x(?=y) matches what
    // x y does (y then anything, unless y ends in $). `closed`: a $ after
    // this node already anchors the end (a $ inside it then changes
    // nothing). A repeat at the end whose body holds a $ ("(x(,|$))+"): the
    // $ can only hold in the last copy, so the others are written without
    // the alternatives that hold it (exact when those alternatives cannot
    // be followed by more copies; else narrowed).
    RNode anchor_end(RNode n, bool closed = false) {
        switch (n.k) {
        case RNode::K::Alt:
            for (auto& k : n.kids) k = anchor_end(std::move(k), closed);
            return n;
        case RNode::K::Seq: {
            if (!n.kids.empty() && n.kids.back().k == RNode::K::Eol) {
                while (!n.kids.empty() && n.kids.back().k == RNode::K::Eol) n.kids.pop_back();
                return anchor_end(std::move(n), true);
            }
            if (search_ && !closed && !n.kids.empty() && n.kids.back().k == RNode::K::Look) {
                RNode y = std::move(n.kids.back().kids[0]);
                n.kids.back() = anchor_end(std::move(y));
                return n;
            }
            if (!n.kids.empty() && (n.kids.back().k == RNode::K::Alt || n.kids.back().k == RNode::K::Seq)) {
                n.kids.back() = anchor_end(std::move(n.kids.back()), closed);
                return n;
            }
            if (!n.kids.empty() && n.kids.back().k == RNode::K::Rep && holds(n.kids.back(), RNode::K::Eol)) {
                RNode rep = std::move(n.kids.back());
                n.kids.pop_back();
                n.kids.push_back(last_copy(std::move(rep), closed));
                return n;
            }
            if (search_ && !closed) n.kids.push_back(any_star());
            return n;
        }
        case RNode::K::Rep:
            if (holds(n, RNode::K::Eol)) return last_copy(std::move(n), closed);
            [[fallthrough]];
        default: {
            RNode s;
            s.kids.push_back(std::move(n));
            if (search_ && !closed) s.kids.push_back(any_star());
            return s;
        }
        }
    }
    static bool holds(const RNode& n, RNode::K k) {
        if (n.k == k) return true;
        for (const auto& c : n.kids)
            if (holds(c, k)) return true;
        return false;
    }
    // n without the alternatives that hold a $ (nullopt: none is left).
    static std::optional<RNode> without_eol(const RNode& n) {
        if (n.k == RNode::K::Eol) return std::nullopt;
        if (n.k == RNode::K::Alt) {
            RNode out{RNode::K::Alt, {}, {}, 0, 0};
            for (const auto& k : n.kids)
                if (auto w = without_eol(k)) out.kids.push_back(std::move(*w));
            if (out.kids.empty()) return std::nullopt;
            return out;
        }
        RNode out = n;
        out.kids.clear();
        for (const auto& k : n.kids) {
            auto w = without_eol(k);
            if (!w) return std::nullopt;
            out.kids.push_back(std::move(*w));
        }
        return out;
    }
    // x{m,n} at the end with a $ in x: x'{m-1,n-1} then x anchored, where
    // x' is x without its $ alternatives (m = 0 adds the empty case).
    RNode last_copy(RNode rep, bool closed) {
        if (rep.max == 0) fail("has a repeat of at most 0 copies holding '$'");
        RNode last = anchor_end(rep.kids[0], closed);
        RNode seq;
        if (auto body = without_eol(rep.kids[0]); body && rep.max > 1) {
            RNode more{RNode::K::Rep, {}, {}, rep.min ? rep.min - 1 : 0, rep.max == kInf ? kInf : rep.max - 1};
            more.kids.push_back(std::move(*body));
            seq.kids.push_back(std::move(more));
        } else if (rep.min > 1) {
            fail("has '$' in a repeat that needs more copies after it (not supported)");
        }
        seq.kids.push_back(std::move(last));
        if (rep.min > 0) return seq;
        RNode none;  // no copy: what follows is the open end, if any
        if (search_ && !closed) none.kids.push_back(any_star());
        RNode alt{RNode::K::Alt, {}, {}, 0, 0};
        alt.kids.push_back(std::move(seq));
        alt.kids.push_back(std::move(none));
        return alt;
    }
    // A negative lookahead (?!p) right after the ^ that starts an
    // alternative: the rest is written with its first character outside
    // the characters p can start with (narrowed: then p cannot match there;
    // some strings p does not match are left out), and empty only where p
    // cannot match the empty end. p must not match the empty string
    // mid-text (then the lookahead always fails but at the end).
    RNode negative_lookahead(RNode a) {
        if (a.k != RNode::K::Seq || a.kids.empty() || a.kids[0].k != RNode::K::NotLook) return a;
        // Several in a row ("^(?!aws:)(?!memorydb:)..."): each must fail.
        Ranges first;
        bool empty_end = false, looks_past = false;
        while (!a.kids.empty() && a.kids[0].k == RNode::K::NotLook) {
            const RNode p = std::move(a.kids[0].kids[0]);
            a.kids.erase(a.kids.begin());
            if (nullable(p, false)) fail("has a negative lookahead that matches the empty string (not supported)");
            first_chars(p, first);
            empty_end = empty_end || nullable(p, true);
            // "(?!.*--)": what it tests may start anywhere later.
            looks_past = looks_past || starts_skippable(p);
        }
        first = normalize(first);
        RNode out{RNode::K::Alt, {}, {}, 0, 0};
        if (auto r = restrict_first(a, first)) out.kids.push_back(std::move(*r));
        if (nullable(a, true) && !empty_end) out.kids.push_back(RNode{});
        // Narrowing by the first character leaves nothing: a lookahead that
        // tests further on ("(?!.*-$)") cannot be written that way.
        if (out.kids.empty() && looks_past)
            fail("has a negative lookahead that tests past the first character ('(?!.*...)'): only lookaheads the "
                 "first character decides are supported");
        if (out.kids.empty()) fail("matches nothing after its negative lookahead");
        return out;
    }
    // Does n start with an item that may match nothing (".*x")?
    static bool starts_skippable(const RNode& n) {
        if (n.k == RNode::K::Alt) return std::any_of(n.kids.begin(), n.kids.end(), starts_skippable);
        if (n.k == RNode::K::Seq) return !n.kids.empty() && (nullable(n.kids[0], false) || starts_skippable(n.kids[0]));
        return false;
    }
    // Can n match the empty string: mid-text ($ cannot) or at the end ($ can).
    static bool nullable(const RNode& n, bool at_end) {
        switch (n.k) {
        case RNode::K::Set: return false;
        case RNode::K::Bol: case RNode::K::Look: case RNode::K::NotLook: return true;
        case RNode::K::Eol: return at_end;
        case RNode::K::Rep: return n.min == 0 || nullable(n.kids[0], at_end);
        case RNode::K::Alt:
            for (const auto& k : n.kids)
                if (nullable(k, at_end)) return true;
            return false;
        case RNode::K::Seq:
            for (const auto& k : n.kids)
                if (!nullable(k, at_end)) return false;
            return true;
        }
        return false;
    }
    // The characters a non-empty match of n can start with.
    static void first_chars(const RNode& n, Ranges& out) {
        switch (n.k) {
        case RNode::K::Set: out.insert(out.end(), n.set.begin(), n.set.end()); return;
        case RNode::K::Rep:
            if (n.max) first_chars(n.kids[0], out);
            return;
        case RNode::K::Alt:
            for (const auto& k : n.kids) first_chars(k, out);
            return;
        case RNode::K::Seq:
            for (const auto& k : n.kids) {
                first_chars(k, out);
                if (!nullable(k, false)) return;
            }
            return;
        default: return;
        }
    }
    static Ranges minus(const Ranges& a, const Ranges& b) {
        Ranges out;
        for (const auto& [lo, hi] : normalize(a)) {
            uint32_t from = lo;
            for (const auto& [blo, bhi] : b) {
                if (bhi < from || blo > hi) continue;
                if (blo > from) out.emplace_back(from, blo - 1);
                from = bhi + 1;
                if (bhi >= hi) break;
            }
            if (from <= hi && from >= lo) out.emplace_back(from, hi);
        }
        return out;
    }
    // n's non-empty matches whose first character is not in `ex`
    // (nullopt: none).
    std::optional<RNode> restrict_first(const RNode& n, const Ranges& ex) {
        switch (n.k) {
        case RNode::K::Set: {
            Ranges left = minus(n.set, ex);
            if (left.empty()) return std::nullopt;
            return RNode{RNode::K::Set, {}, std::move(left), 0, 0};
        }
        case RNode::K::Alt: {
            RNode out{RNode::K::Alt, {}, {}, 0, 0};
            for (const auto& k : n.kids)
                if (auto r = restrict_first(k, ex)) out.kids.push_back(std::move(*r));
            if (out.kids.empty()) return std::nullopt;
            return out;
        }
        case RNode::K::Rep: {
            if (n.max == 0) return std::nullopt;
            if (nullable(n.kids[0], false)) fail("has a negative lookahead before a repeat of what may be empty (not supported)");
            auto head = restrict_first(n.kids[0], ex);
            if (!head) return std::nullopt;
            RNode seq;
            seq.kids.push_back(std::move(*head));
            RNode more{RNode::K::Rep, {}, {}, n.min ? n.min - 1 : 0, n.max == kInf ? kInf : n.max - 1};
            more.kids.push_back(n.kids[0]);
            seq.kids.push_back(std::move(more));
            return seq;
        }
        case RNode::K::Seq: {
            if (n.kids.empty()) return std::nullopt;
            RNode out{RNode::K::Alt, {}, {}, 0, 0};
            if (auto h = restrict_first(n.kids[0], ex)) {
                RNode seq;
                seq.kids.push_back(std::move(*h));
                seq.kids.insert(seq.kids.end(), n.kids.begin() + 1, n.kids.end());
                out.kids.push_back(std::move(seq));
            }
            if (nullable(n.kids[0], false)) {
                RNode rest;
                rest.kids.assign(n.kids.begin() + 1, n.kids.end());
                if (auto r = restrict_first(rest, ex)) out.kids.push_back(std::move(*r));
            }
            if (out.kids.empty()) return std::nullopt;
            return out;
        }
        case RNode::K::Bol: case RNode::K::Eol: return std::nullopt;
        default: fail("has a lookahead inside what follows a negative lookahead (not supported)");
        }
    }

    // What anchoring left in place cannot be expressed.
    void check_anchors(const RNode& n) const {
        if (n.k == RNode::K::Bol) fail("uses '^' other than at the start (not supported)");
        if (n.k == RNode::K::Eol) fail("uses '$' other than at the end (not supported)");
        if (n.k == RNode::K::Look) fail("uses a lookahead other than at the end of the pattern (not supported)");
        if (n.k == RNode::K::NotLook)
            fail("uses a negative lookahead other than right after the '^' that starts it (not supported)");
        for (const auto& k : n.kids) check_anchors(k);
    }

    bool eof() const { return i_ >= cps_.size(); }
    uint32_t peek() const { return cps_[i_]; }

    RNode alt(uint32_t depth) {
        RNode n{RNode::K::Alt, {}, {}, 0, 0};
        n.kids.push_back(seq(depth));
        while (!eof() && peek() == '|') {
            ++i_;
            n.kids.push_back(seq(depth));
        }
        return n;
    }

    RNode seq(uint32_t depth) {
        RNode n;
        while (!eof() && peek() != '|' && peek() != ')') {
            if (peek() == '^' || peek() == '$') {
                n.kids.push_back(RNode{peek() == '^' ? RNode::K::Bol : RNode::K::Eol, {}, {}, 0, 0});
                ++i_;
                if (!eof() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
                    fail("has a quantifier on an anchor (not supported)");
                continue;
            }
            RNode a = atom(depth);
            quantifier(a);
            n.kids.push_back(std::move(a));
        }
        return n;
    }

    void quantifier(RNode& a) {
        if (eof()) return;
        uint32_t lo = 0, hi = 0;
        const uint32_t c = peek();
        if (c == '*') lo = 0, hi = kInf, ++i_;
        else if (c == '+') lo = 1, hi = kInf, ++i_;
        else if (c == '?') lo = 0, hi = 1, ++i_;
        else if (c == '{') {
            size_t j = i_ + 1;
            auto number = [&](uint64_t& v) {
                const size_t s = j;
                v = 0;
                while (j < cps_.size() && cps_[j] >= '0' && cps_[j] <= '9') v = std::min<uint64_t>(v * 10 + (cps_[j++] - '0'), 1u << 30);
                return j > s;
            };
            uint64_t m = 0, n = 0;
            if (!number(m)) return;  // a literal '{' (Annex B)
            n = m;
            if (j < cps_.size() && cps_[j] == ',') {
                ++j;
                if (!number(n)) n = kInf;
            }
            if (j >= cps_.size() || cps_[j] != '}') return;
            i_ = j + 1;
            if (m > kMaxRepeat) fail(fmt::format("has a repeat count above the limit of {}", kMaxRepeat));
            if (n != kInf && n > kMaxRepeat) n = kMaxRepeat;  // narrowed: at most 1,000 copies written
            if (n < m) fail("has a repeat {m,n} with n < m");
            lo = uint32_t(m), hi = uint32_t(n);
        } else {
            return;
        }
        if (!eof() && peek() == '?') ++i_;  // lazy: the same strings
        if (!eof() && (peek() == '*' || peek() == '+' || peek() == '?'))
            fail("has a quantifier after a quantifier (possessive forms are not ECMA-262)");
        RNode r{RNode::K::Rep, {}, {}, lo, hi};
        r.kids.push_back(std::move(a));
        a = std::move(r);
    }

    static RNode set(Ranges r) { return RNode{RNode::K::Set, {}, normalize(std::move(r)), 0, 0}; }

    RNode atom(uint32_t depth) {
        const uint32_t c = peek();
        ++i_;
        switch (c) {
        case '(': {
            if (depth >= kMaxGrammarNesting) fail(fmt::format("nests groups deeper than {}", kMaxGrammarNesting));
            bool look = false, negative = false;
            if (!eof() && peek() == '?') {
                ++i_;
                const uint32_t k = eof() ? 0 : peek();
                if (k == ':') {
                    ++i_;
                } else if (k == '=') {
                    ++i_;
                    look = true;
                } else if (k == '!') {
                    ++i_;
                    look = true;
                    negative = true;
                } else if (k == '<') {
                    ++i_;
                    if (!eof() && (peek() == '=' || peek() == '!')) fail("uses a lookbehind (not supported)");
                    while (!eof() && peek() != '>') ++i_;  // a named group: its name does not matter here
                    if (eof()) fail("has an unclosed group name");
                    ++i_;
                } else {
                    fail("uses an unknown group '(?'");
                }
            }
            RNode g = alt(depth + 1);
            if (eof() || peek() != ')') fail("has an unclosed group");
            ++i_;
            if (look) {
                if (!eof() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
                    fail("has a quantifier on a lookahead (not supported)");
                RNode l{negative ? RNode::K::NotLook : RNode::K::Look, {}, {}, 0, 0};
                l.kids.push_back(std::move(g));
                return l;
            }
            return g;
        }
        case '[': return cls();
        case '.': return set(complement(kLineTerminators));
        case '\\': {
            Ranges r;
            uint32_t cp = escape(false, r);
            if (cp == kInf) return set(std::move(r));
            return set({{cp, cp}});
        }
        case '*': case '+': case '?': fail("has a quantifier with nothing to repeat");
        case ')': fail("has an unmatched ')'");
        default: return set({{c, c}});
        }
    }

    RNode cls() {
        bool neg = false;
        if (!eof() && peek() == '^') ++i_, neg = true;
        Ranges r;
        while (!eof() && peek() != ']') {
            Ranges s1;
            const uint32_t a = class_atom(s1);
            if (a == kInf) {
                r.insert(r.end(), s1.begin(), s1.end());
                continue;
            }
            if (i_ + 1 < cps_.size() && peek() == '-' && cps_[i_ + 1] != ']') {
                ++i_;
                Ranges s2;
                const uint32_t b = class_atom(s2);
                if (b == kInf) {  // [a-\d]: Annex B reads the '-' literally
                    r.insert(r.end(), {{a, a}, {'-', '-'}});
                    r.insert(r.end(), s2.begin(), s2.end());
                    continue;
                }
                if (b < a) fail("has a class range out of order");
                r.emplace_back(a, b);
            } else {
                r.emplace_back(a, a);
            }
        }
        if (eof()) fail("has an unclosed '['");
        ++i_;
        return set(neg ? complement(r) : r);
    }

    uint32_t class_atom(Ranges& r) {
        const uint32_t c = peek();
        ++i_;
        if (c == '\\') return escape(true, r);
        return c;
    }

    uint32_t hex(size_t n) {
        uint32_t v = 0;
        for (size_t k = 0; k < n; ++k) {
            if (eof()) fail("has a cut-short \\x or \\u escape");
            const uint32_t c = peek();
            int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10) : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
            if (d < 0) fail("has a bad \\x or \\u escape");
            v = v * 16 + uint32_t(d);
            ++i_;
        }
        return v;
    }

    // One escape after the backslash: a code point, or kInf with the set in `r`.
    uint32_t escape(bool in_class, Ranges& r) {
        if (eof()) fail("ends with a lone backslash");
        const uint32_t c = peek();
        ++i_;
        switch (c) {
        case 'd': r = kDigit; return kInf;
        case 'D': r = complement(kDigit); return kInf;
        case 'w': r = kWord; return kInf;
        case 'W': r = complement(kWord); return kInf;
        case 's': r = kSpace; return kInf;
        case 'S': r = complement(kSpace); return kInf;
        case 't': return '\t';
        case 'n': return '\n';
        case 'r': return '\r';
        case 'v': return '\v';
        case 'f': return '\f';
        case 'b':
            if (in_class) return '\b';
            fail("uses the word boundary \\b (not supported)");
        case 'B': fail("uses the word boundary \\B (not supported)");
        case '0':
            if (!eof() && peek() >= '0' && peek() <= '9') fail("uses an octal escape (not supported)");
            return 0;
        case 'k': fail("uses a named backreference \\k (not supported)");
        case 'p': case 'P': {
            // \p{Name} / \p{Name=Value}: a Unicode property (General_Category,
            // Script, binary properties), as ICU knows it; \P the complement.
            if (eof() || peek() != '{') fail("has a \\p escape without {...}");
            ++i_;
            std::string name;
            while (!eof() && peek() != '}' && name.size() < 64) {
                const uint32_t ch = peek();
                if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '='))
                    fail("has a bad \\p{...} name");
                name += char(ch);
                ++i_;
            }
            if (eof() || peek() != '}' || name.empty()) fail("has a bad \\p{...} escape");
            ++i_;
            UErrorCode status = U_ZERO_ERROR;
            const icu::UnicodeSet set(icu::UnicodeString::fromUTF8("[\\p{" + name + "}]"), status);
            if (U_FAILURE(status)) fail("uses an unknown Unicode property \\p{" + name + "}");
            Ranges props;
            for (int32_t k = 0; k < set.getRangeCount(); ++k)
                props.emplace_back(uint32_t(set.getRangeStart(k)), uint32_t(set.getRangeEnd(k)));
            r = c == 'P' ? complement(props) : normalize(props);
            return kInf;
        }
        case 'x': return hex(2);
        case 'u': {
            if (!eof() && peek() == '{') {
                ++i_;
                uint32_t v = 0;
                size_t n = 0;
                while (!eof() && peek() != '}' && n < 7) v = v * 16 + hex(1), ++n;
                if (eof() || peek() != '}' || n == 0 || v > kMaxCp) fail("has a bad \\u{...} escape");
                ++i_;
                return v;
            }
            uint32_t v = hex(4);
            // A surrogate pair written as two \u escapes is one code point.
            if (v >= 0xD800 && v <= 0xDBFF && i_ + 5 < cps_.size() + 0 && peek() == '\\' && cps_[i_ + 1] == 'u') {
                const size_t save = i_;
                i_ += 2;
                const uint32_t lo = hex(4);
                if (lo >= 0xDC00 && lo <= 0xDFFF) return 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                i_ = save;
            }
            if (v >= 0xD800 && v <= 0xDFFF) {
                if (in_class) return v;  // a class's surrogates are no characters: left out of it
                fail("has a lone surrogate escape (no JSON string holds one)");
            }
            return v;
        }
        case 'c':
            if (!eof() && ((peek() >= 'a' && peek() <= 'z') || (peek() >= 'A' && peek() <= 'Z'))) return cps_[i_++] % 32;
            fail("has a bad \\c escape");
        default:
            if (c >= '1' && c <= '9') fail("uses a backreference (not supported)");
            return c;  // an escaped punctuation character stands for itself
        }
    }

    std::string_view src_;
    std::vector<uint32_t> cps_;
    size_t i_ = 0;
    bool search_ = true;
    std::vector<std::optional<std::pair<uint64_t, uint64_t>>> bounds_;
};

// A code point set as raw UTF-8 text (for output that is not a JSON string).
std::string raw_char_class(const Ranges& ranges) {
    std::string cls;
    for (auto [lo, hi] : normalize(ranges)) {
        // Surrogates are no characters of UTF-8 text.
        for (const auto& [a, b] : std::vector<std::pair<uint32_t, uint32_t>>{{lo, std::min(hi, 0xD7FFu)}, {std::max(lo, 0xE000u), hi}}) {
            if (a > b) continue;
            cls += fmt::format("\\U{:08X}", a);
            if (b != a) cls += fmt::format("-\\U{:08X}", b);
        }
    }
    if (cls.empty()) throw GrammarError("pattern", "'pattern' has a character class that matches no character");
    return "[" + cls + "]";
}

// any_char: the rule for one character of the open sides; "" writes the
// text raw (not as JSON string content).
std::string emit(const RNode& n, const std::string& any_char) {
    switch (n.k) {
    case RNode::K::Bol: case RNode::K::Eol: case RNode::K::Look: case RNode::K::NotLook:
        return "\"\"";  // removed by anchoring
    case RNode::K::Set:
        if (any_char.empty()) return raw_char_class(n.set);
        return n.any ? any_char : json_char_class(n.set);
    case RNode::K::Seq: {
        if (n.kids.empty()) return "\"\"";
        std::string out;
        for (const auto& k : n.kids) out += (out.empty() ? "" : " ") + emit(k, any_char);
        return n.kids.size() == 1 ? out : "( " + out + " )";
    }
    case RNode::K::Alt: {
        std::string out;
        for (const auto& k : n.kids) out += (out.empty() ? "" : " | ") + emit(k, any_char);
        return "( " + out + " )";
    }
    case RNode::K::Rep: {
        if (n.max == 0) return "\"\"";
        const std::string x = "( " + emit(n.kids[0], any_char) + " )";
        if (n.min == 0 && n.max == kInf) return x + "*";
        if (n.min == 1 && n.max == kInf) return x + "+";
        if (n.max == kInf) return fmt::format("{}{{{},}}", x, n.min);
        return fmt::format("{}{{{},{}}}", x, n.min, n.max);
    }
    }
    return "";
}

}  // namespace

std::string json_char_class(Ranges ranges) {
    ranges = normalize(std::move(ranges));
    Ranges plain;
    std::vector<uint32_t> escaped;
    for (auto [lo, hi] : ranges) {
        for (uint32_t c = lo; c <= std::min(hi, 0x1Fu); ++c) escaped.push_back(c);
        lo = std::max(lo, 0x20u);
        // Cut out '"', '\' and the surrogates (never characters of a string).
        for (const auto& [xlo, xhi] : std::vector<std::pair<uint32_t, uint32_t>>{{'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}}) {
            if (lo > hi) break;
            if (xhi < lo || xlo > hi) continue;
            if (xlo == '"' || xlo == '\\') escaped.push_back(xlo);
            if (lo < xlo) plain.emplace_back(lo, xlo - 1);
            lo = xhi + 1;
        }
        if (lo <= hi) plain.emplace_back(lo, hi);
    }
    std::vector<std::string> alts;
    if (!plain.empty()) {
        std::string cls = "[";
        for (const auto& [lo, hi] : plain) {
            cls += fmt::format("\\U{:08X}", lo);
            if (hi != lo) cls += fmt::format("-\\U{:08X}", hi);
        }
        alts.push_back(cls + "]");
    }
    // The escaped characters as JSON writers write them (short escapes,
    // else \u00XX in either case), factored behind ONE backslash: the
    // matcher keeps a parse stack per alternative that can start at a
    // byte, and a class with 30 escape alternatives, repeated in an
    // ambiguous pattern, would pass its 256-stack limit.
    std::string shorts;
    std::string lows[2];
    for (uint32_t c : escaped) {
        switch (c) {
        case '"': shorts += "\\\""; break;
        case '\\': shorts += "\\\\"; break;
        case '\b': shorts += 'b'; break;
        case '\t': shorts += 't'; break;
        case '\n': shorts += 'n'; break;
        case '\f': shorts += 'f'; break;
        case '\r': shorts += 'r'; break;
        default: {
            const uint32_t d = c & 15;
            lows[c >> 4] += d < 10 ? std::string(1, char('0' + d)) : std::string{char('a' + d - 10), char('A' + d - 10)};
        }
        }
    }
    std::vector<std::string> esc;
    if (!shorts.empty()) esc.push_back("[" + shorts + "]");
    std::string u;
    for (int hi = 0; hi < 2; ++hi)
        if (!lows[hi].empty()) u += fmt::format("{}\"{}\" [{}]", u.empty() ? "" : " | ", hi, lows[hi]);
    if (!u.empty()) esc.push_back("\"u00\" ( " + u + " )");
    if (!esc.empty()) alts.push_back("\"\\\\\" ( " + (esc.size() == 1 ? esc[0] : esc[0] + " | " + esc[1]) + " )");
    if (alts.empty()) throw GrammarError("pattern", "'pattern' has a character class that matches no character");
    if (alts.size() == 1) return alts[0];
    std::string out;
    for (const auto& a : alts) out += (out.empty() ? "( " : " | ") + a;
    return out + " )";
}

namespace {

// The repeats in the tree, each with the index of the repeat around it
// (-1: none).
void collect_repeats(RNode& n, int outer, std::vector<RNode*>& out, std::vector<int>& parent) {
    if (n.k == RNode::K::Rep) {
        out.push_back(&n);
        parent.push_back(outer);
        outer = int(out.size()) - 1;
    }
    for (auto& k : n.kids) collect_repeats(k, outer, out, parent);
}

// Work bound for narrowing to a length: attempts to add one copy to a
// repeat (each re-measures the pattern), and copies added (each costs about
// one grammar rule; kMaxGrammarRules is 20,000 for the whole schema).
constexpr size_t kCapAttempts = 4000;
constexpr size_t kCapCopies = 2000;

// Drops the alternatives that cannot reach `need` code points even with
// the longest of everything beside them (exact: no match is lost that the
// length allows). False when nothing is left.
bool prune_short(RNode& n, uint64_t need) {
    if (n.k == RNode::K::Alt) {
        std::erase_if(n.kids, [&](const RNode& k) { return lengths(k).max < need; });
        for (auto& k : n.kids)
            if (!prune_short(k, need)) return false;
        return !n.kids.empty();
    }
    if (n.k == RNode::K::Seq) {
        std::vector<uint64_t> max;
        for (const auto& k : n.kids) max.push_back(lengths(k).max);
        for (size_t i = 0; i < n.kids.size(); ++i) {
            uint64_t others = 0;
            for (size_t j = 0; j < n.kids.size(); ++j)
                if (j != i) others = sat_add(others, max[j]);
            if (others < need && !prune_short(n.kids[i], need - others)) return false;
        }
    }
    return true;
}

// Raises repeats' minimum counts, one copy at a time round robin, until
// every match is at least `need` long (narrowed: the shorter matches are
// not written). False if that cannot be reached.
bool raise_to_length(RNode& top, uint64_t need) {
    std::vector<RNode*> reps;
    std::vector<int> parent;
    collect_repeats(top, -1, reps, parent);
    size_t attempts = 0;
    while (lengths(top).min < need) {
        bool grew = false;
        for (RNode* r : reps) {
            if (r->min >= r->max || r->min >= kMaxRepeat || ++attempts > kCapAttempts) continue;
            ++r->min;
            grew = true;
            if (lengths(top).min >= need) return true;
        }
        if (!grew) return false;
    }
    return true;
}


// Cuts every repeat to its minimum, then hands out one more copy at a time,
// round robin, to each repeat whose copy still keeps the longest match
// within max_len. False if even the minimum copies are too long.
bool narrow_to_length(RNode& top, uint64_t max_len) {
    std::vector<RNode*> reps;
    std::vector<int> parent;
    collect_repeats(top, -1, reps, parent);
    // A repeat inside one allowed no copies costs nothing yet; growing it
    // first would starve the one around it.
    auto live = [&](size_t i) {
        for (int p = parent[i]; p >= 0; p = parent[size_t(p)])
            if (reps[size_t(p)]->max == 0) return false;
        return true;
    };
    std::vector<uint32_t> limit;
    for (RNode* r : reps) limit.push_back(r->max), r->max = r->min;
    if (lengths(top).max > max_len) return false;
    size_t attempts = 0, copies = 0;
    for (bool more = true; more && attempts < kCapAttempts && copies < kCapCopies;) {
        more = false;
        for (size_t i = 0; i < reps.size() && attempts < kCapAttempts && copies < kCapCopies; ++i) {
            if (reps[i]->max == limit[i] || reps[i]->max >= kMaxRepeat || !live(i)) continue;
            ++attempts;
            ++reps[i]->max;
            if (lengths(top).max > max_len) {
                --reps[i]->max;
                limit[i] = reps[i]->max;  // it will not fit later either: the others only grow
            } else {
                ++copies;
                more = true;
            }
        }
    }
    return true;
}

}  // namespace

std::optional<std::string> regex_grammar(std::string_view pattern, const std::string& any_char, uint64_t min_len,
                                         uint64_t max_len) {
    RegexParser parser(pattern);
    RNode top = parser.run();
    for (size_t i = 0; i < top.kids.size(); ++i) {
        const auto& b = parser.bounds()[i];
        if (!b) continue;
        RNode& alt = top.kids[i];
        if (lengths(alt).min < b->first &&
            (!prune_short(alt, b->first) || !raise_to_length(alt, b->first)))
            parser.fail("has a lookahead length its pattern cannot reach");
        if (lengths(alt).max > b->second && !narrow_to_length(alt, b->second))
            parser.fail("has a lookahead length its pattern cannot keep within");
    }
    const Lengths all = lengths(top);
    if (all.min > max_len || all.max < min_len) parser.fail("matches no string of the length minLength/maxLength allow");
    if (!(min_len <= all.min && all.max <= max_len)) {
        bool folded = false;
        // ^x{m,n}$ (or ^x$) for one class x: the bounds fold into the count.
        if (top.kids.size() == 1 && top.kids[0].k == RNode::K::Seq && top.kids[0].kids.size() == 1) {
            RNode& one = top.kids[0].kids[0];
            if (one.k == RNode::K::Set && !one.any) {
                RNode r{RNode::K::Rep, {}, {}, 1, 1};
                r.kids.push_back(one);
                one = std::move(r);
            }
            if (one.k == RNode::K::Rep && one.kids[0].k == RNode::K::Set && !one.kids[0].any) {
                const uint64_t lo = std::max<uint64_t>(one.min, min_len);
                const uint64_t hi = std::min<uint64_t>(one.max == kInf ? kRegexUnbounded : one.max, max_len);
                if (lo > hi) parser.fail("matches no string of the length minLength/maxLength allow");
                if (lo <= kMaxRepeat && (hi == kRegexUnbounded || hi <= kMaxRepeat)) {
                    one.min = uint32_t(lo);
                    one.max = hi == kRegexUnbounded ? kInf : uint32_t(hi);
                    folded = true;
                }
            }
        }
        // Otherwise the bounds are met by narrowing to a subset of the
        // pattern's matches: alternatives too short for minLength are
        // dropped and repeats' minimum counts raised until every match is
        // long enough; then every repeat (the unanchored sides' included) is
        // cut to as many copies as keep the longest match within maxLength.
        if (!folded) {
            if (all.min < min_len) {
                if (!prune_short(top, min_len)) parser.fail("matches no string of the length minLength/maxLength allow");
                if (!raise_to_length(top, min_len)) return std::nullopt;
            }
            if (!narrow_to_length(top, max_len)) return std::nullopt;
        }
    }
    return emit(top, any_char);
}

std::string regex_text_grammar(std::string_view pattern) {
    RegexParser parser(pattern);
    return emit(parser.run(false), "");
}

}  // namespace eh::constrain::detail
