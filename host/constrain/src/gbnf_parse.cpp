// The grammar text (docs/http-api.md, "Grammar syntax"): rules
// `name ::= alternatives`, alternatives split by `|`, sequences of
// "literals", [classes], (groups), rule names and `.`, each optionally
// followed by * + ? {m} {m,} {m,n}; `#` comments. A rule ends at the end of
// a line unless it is inside parentheses, the line ends in `::=` or `|`, or
// the next line starts with `|`.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "gbnf_ast.hpp"
#include "utf8_ranges.hpp"

namespace eh::constrain::detail {
namespace {

class Parser {
public:
    explicit Parser(std::string_view text) : s_(text) {}

    std::vector<RuleDef> run() {
        std::vector<RuleDef> rules;
        // about a rule a line, capped: a text of blank lines reserves no more
        // than a real grammar's rules, the vector grows past it as needed
        rules.reserve(std::min<size_t>(size_t(std::count(s_.begin(), s_.end(), '\n')) + 1, 4096));
        skip(true);
        while (!eof()) {
            RuleDef r;
            r.line = line_;
            r.name = name();
            if (r.name.empty()) fail("expected a rule name");
            skip(false);
            if (!at_define()) fail(fmt::format("expected '::=' after the rule name '{}'", r.name));
            pos_ += 3;
            body_on_next_line();
            r.body = alternatives(0);
            skip(false);
            if (!eof() && peek() != '\n' && peek() != '\r') fail(fmt::format("unexpected '{}'", printable(peek())));
            rules.push_back(std::move(r));
            skip(true);
        }
        return rules;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw GrammarError("grammar", fmt::format("grammar: {} at line {}, column {}", what, line_, pos_ - line_start_ + 1));
    }
    static std::string printable(char c) {
        const auto u = uint8_t(c);
        return u >= 0x20 && u < 0x7F ? std::string(1, c) : fmt::format("\\x{:02X}", u);
    }
    bool eof() const { return pos_ >= s_.size(); }
    // At "::=" (checked after every rule name: a first-byte test, not a compare).
    bool at_define() const { return pos_ + 3 <= s_.size() && s_[pos_] == ':' && s_[pos_ + 1] == ':' && s_[pos_ + 2] == '='; }
    char peek() const { return s_[pos_]; }
    void newline() {
        ++line_;
        line_start_ = pos_;
    }
    // Blanks and comments; newlines too when `lines`.
    void skip(bool lines) {
        while (!eof()) {
            const char c = peek();
            if (c == ' ' || c == '\t') {
                ++pos_;
            } else if (c == '#') {
                while (!eof() && peek() != '\n') ++pos_;
            } else if (lines && (c == '\n' || c == '\r')) {
                ++pos_;
                if (c == '\n') newline();
            } else {
                break;
            }
        }
    }
    // The body may start on the line after `::=` (as llama.cpp's grammars
    // write it), unless that line starts the next rule: then this one is
    // empty.
    void body_on_next_line() {
        skip(false);
        if (eof() || (peek() != '\n' && peek() != '\r')) return;
        const size_t save = pos_, save_line = line_, save_start = line_start_;
        skip(true);
        const size_t body = pos_, body_line = line_, body_start = line_start_;
        const bool next_rule = !name().empty() && (skip(false), at_define());
        if (next_rule) pos_ = save, line_ = save_line, line_start_ = save_start;
        else pos_ = body, line_ = body_line, line_start_ = body_start;
    }
    static bool name_char(char c) {
        static constexpr auto kTable = [] {
            std::array<bool, 256> t{};
            for (int b = 0; b < 256; ++b)
                t[size_t(b)] = (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '_' || b == '-';
            return t;
        }();
        return kTable[uint8_t(c)];
    }
    std::string name() {
        const size_t start = pos_, end = s_.size();
        while (pos_ < end && name_char(s_[pos_])) ++pos_;
        if (pos_ - start > 128) fail("a rule name is longer than 128 characters");
        return std::string(s_.substr(start, pos_ - start));
    }

    Node alternatives(uint32_t depth) {
        if (depth > kMaxGrammarNesting) fail(fmt::format("parentheses nest deeper than {}", kMaxGrammarNesting));
        Node alt;
        alt.type = Node::Type::Alt;
        alt.kids.push_back(sequence(depth));
        for (;;) {
            // A `|` may start the next line (continuing the rule) or end this one.
            const size_t save = pos_, save_line = line_, save_start = line_start_;
            skip(true);
            if (!eof() && peek() == '|') {
                ++pos_;
                skip(true);
                alt.kids.push_back(sequence(depth));
                continue;
            }
            pos_ = save, line_ = save_line, line_start_ = save_start;
            break;
        }
        if (alt.kids.size() == 1) return std::move(alt.kids[0]);
        return alt;
    }

    Node sequence(uint32_t depth) {
        // The items gather in this depth's scratch vector, then move to the
        // node in one allocation of their number (a schema grammar has a
        // sequence or more per line of its 1 MB of text).
        if (scratch_.size() <= depth) scratch_.resize(depth + 1);
        const size_t from = scratch_[depth].size();  // (empty unless a caller at this depth is still filling it)
        for (;;) {
            skip(depth > 0);
            if (eof()) break;
            const char c = peek();
            if (c == '|' || c == ')' || c == '\n' || c == '\r') break;
            Node item = primary(depth);
            postfix(item);
            scratch_[depth].push_back(std::move(item));
        }
        auto& items = scratch_[depth];
        Node seq;
        seq.type = Node::Type::Seq;
        seq.kids.reserve(items.size() - from);
        for (size_t i = from; i < items.size(); ++i) seq.kids.push_back(std::move(items[i]));
        items.resize(from);
        return seq;
    }

    void postfix(Node& item) {
        while (!eof()) {
            const char c = peek();
            uint32_t lo = 0, hi = 0;
            if (c == '*') lo = 0, hi = kUnbounded, ++pos_;
            else if (c == '+') lo = 1, hi = kUnbounded, ++pos_;
            else if (c == '?') lo = 0, hi = 1, ++pos_;
            else if (c == '{') braces(lo, hi);
            else break;
            Node rep;
            rep.type = Node::Type::Repeat;
            rep.min = lo;
            rep.max = hi;
            rep.kids.push_back(std::move(item));
            item = std::move(rep);
        }
    }

    uint32_t number() {
        skip(false);
        if (eof() || peek() < '0' || peek() > '9') fail("expected a number in {m,n}");
        uint64_t v = 0;
        while (!eof() && peek() >= '0' && peek() <= '9') {
            v = v * 10 + uint64_t(peek() - '0');
            if (v > kMaxRepeat) fail(fmt::format("a repeat count is larger than {}", kMaxRepeat));
            ++pos_;
        }
        skip(false);
        return uint32_t(v);
    }

    void braces(uint32_t& lo, uint32_t& hi) {
        ++pos_;  // {
        lo = number();
        hi = lo;
        if (!eof() && peek() == ',') {
            ++pos_;
            skip(false);
            hi = (!eof() && peek() == '}') ? kUnbounded : number();
        }
        if (eof() || peek() != '}') fail("expected '}'");
        ++pos_;
        if (hi < lo) fail(fmt::format("{{{},{}}} has its maximum below its minimum", lo, hi));
    }

    Node primary(uint32_t depth) {
        const char c = peek();
        Node n;
        if (c == '"') {
            ++pos_;
            n.type = Node::Type::Literal;
            while (!eof() && peek() != '"') {
                if (peek() == '\n') fail("a literal is not closed on its line");
                if (peek() == '\\') append_utf8(n.text, escape());
                else n.text.push_back(s_[pos_++]);
            }
            if (eof()) fail("a literal is not closed");
            ++pos_;
            return n;
        }
        if (c == '[') return char_class();
        if (c == '(') {
            ++pos_;
            n = alternatives(depth + 1);
            skip(true);
            if (eof() || peek() != ')') fail("expected ')'");
            ++pos_;
            return n;
        }
        if (c == '.') {
            ++pos_;
            n.type = Node::Type::Class;
            n.ranges.emplace_back(0, kMaxCodePoint);
            return n;
        }
        if (name_char(c)) {
            n.type = Node::Type::Ref;
            n.text = name();
            skip(false);
            if (at_define())
                fail(fmt::format("'{}' ::= starts a new rule on the same line as another; put it on its own line", n.text));
            return n;
        }
        fail(fmt::format("unexpected '{}'", printable(c)));
    }

    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
            if (eof()) fail("a \\x, \\u or \\U escape is cut short");
            const char h = peek();
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) fail(fmt::format("'{}' is not a hex digit", printable(h)));
            v = v * 16 + uint32_t(d);
            ++pos_;
        }
        return v;
    }

    // After a backslash: the code point it stands for.
    uint32_t escape() {
        ++pos_;
        if (eof()) fail("a backslash ends the text");
        const char c = s_[pos_++];
        uint32_t cp = 0;
        switch (c) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': return uint8_t(c);
        case 'x': cp = hex(2); break;
        case 'u': cp = hex(4); break;
        case 'U': cp = hex(8); break;
        default: fail(fmt::format("unknown escape '\\{}'", printable(c)));
        }
        if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) fail(fmt::format("U+{:X} is not a Unicode scalar value", cp));
        return cp;
    }

    // One code point of class text: an escape or raw UTF-8.
    uint32_t class_char() {
        if (peek() == '\\') return escape();
        const auto b0 = uint8_t(s_[pos_]);
        int n = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
        if (n == 0 || pos_ + size_t(n) > s_.size()) fail("a character class holds invalid UTF-8");
        uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1Fu) : n == 3 ? (b0 & 0x0Fu) : (b0 & 0x07u);
        for (int i = 1; i < n; ++i) {
            const auto b = uint8_t(s_[pos_ + size_t(i)]);
            if ((b >> 6) != 2) fail("a character class holds invalid UTF-8");
            cp = (cp << 6) | (b & 0x3Fu);
        }
        pos_ += size_t(n);
        return cp;
    }

    Node char_class() {
        ++pos_;  // [
        Node n;
        n.type = Node::Type::Class;
        if (!eof() && peek() == '^') {
            n.negated = true;
            ++pos_;
        }
        while (!eof() && peek() != ']') {
            if (peek() == '\n') fail("a character class is not closed on its line");
            const uint32_t lo = class_char();
            uint32_t hi = lo;
            if (pos_ + 1 < s_.size() && peek() == '-' && s_[pos_ + 1] != ']') {
                ++pos_;
                hi = class_char();
                if (hi < lo) fail("a character class range runs backwards");
            }
            n.ranges.emplace_back(lo, hi);
        }
        if (eof()) fail("a character class is not closed");
        ++pos_;
        return n;
    }

    std::vector<std::vector<Node>> scratch_;  // per nesting depth (sequence())
    std::string_view s_;
    size_t pos_ = 0;
    size_t line_ = 1;
    size_t line_start_ = 0;
};

}  // namespace

std::vector<RuleDef> parse_gbnf(std::string_view text, const GrammarLimits& limits) {
    if (text.size() > limits.text_bytes)
        throw GrammarError("grammar", fmt::format("the grammar is {} bytes; the limit is {}", text.size(), limits.text_bytes));
    return Parser(text).run();
}

}  // namespace eh::constrain::detail
