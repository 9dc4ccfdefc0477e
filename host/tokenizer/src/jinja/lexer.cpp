#include "lexer.hpp"

#include <cctype>
#include <charconv>
#include <cstdlib>

#include "limits.hpp"

namespace eh::tokenizer::jinja {

std::vector<Segment> lex(std::string_view src) {
    struct Raw {
        Segment::Kind kind;  // Text, Var, Block; comments are Block with empty body and `comment`
        bool comment = false;
        std::string body;
        size_t begin = 0;    // source offset (texts)
        bool ltrim = false, rtrim = false, lplus = false, rplus = false;
        int line = 1;
    };
    std::vector<Raw> raw;
    size_t i = 0;
    int line = 1;
    auto count_lines = [&](size_t a, size_t b) {
        for (size_t k = a; k < b; ++k) line += src[k] == '\n';
    };
    while (i < src.size()) {
        size_t open = std::string_view::npos;
        for (size_t k = src.find('{', i); k != std::string_view::npos; k = src.find('{', k + 1)) {
            if (k + 1 < src.size() && (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#')) { open = k; break; }
        }
        if (open == std::string_view::npos) open = src.size();
        if (open > i) {
            raw.push_back({Segment::Text, false, std::string(src.substr(i, open - i)), i, false, false, false, false, line});
            count_lines(i, open);
        }
        if (open >= src.size()) break;
        const char type = src[open + 1];
        Raw tag{type == '{' ? Segment::Var : Segment::Block, type == '#', {}, open, false, false, false, false, line};
        size_t p = open + 2;
        if (p < src.size() && src[p] == '-') { tag.ltrim = true; ++p; }
        else if (p < src.size() && src[p] == '+') { tag.lplus = true; ++p; }
        const char close = type == '{' ? '}' : type == '%' ? '%' : '#';
        size_t end = std::string_view::npos;
        char quote = 0;
        for (size_t k = p; k + 1 < src.size(); ++k) {
            const char c = src[k];
            if (type != '#') {
                if (quote) {
                    if (c == '\\') { ++k; continue; }
                    if (c == quote) quote = 0;
                    continue;
                }
                if (c == '"' || c == '\'') { quote = c; continue; }
            }
            if (c == close && src[k + 1] == '}') { end = k; break; }
        }
        if (end == std::string_view::npos) syntax(line, "unclosed tag");
        size_t body_end = end;
        if (body_end > p && src[body_end - 1] == '-') { tag.rtrim = true; --body_end; }
        else if (body_end > p && src[body_end - 1] == '+' && type != '{') { tag.rplus = true; --body_end; }
        if (!tag.comment) tag.body = std::string(src.substr(p, body_end - p));
        raw.push_back(std::move(tag));
        count_lines(open, end + 2);
        i = end + 2;
    }

    // Whitespace control, as Jinja with trim_blocks and lstrip_blocks.
    for (size_t k = 0; k < raw.size(); ++k) {
        Raw& t = raw[k];
        if (t.kind == Segment::Text) continue;
        const bool block = t.kind == Segment::Block;
        if (k > 0 && raw[k - 1].kind == Segment::Text) {
            std::string& prev = raw[k - 1].body;
            if (t.ltrim) {
                while (!prev.empty() && is_ws(prev.back())) prev.pop_back();
            } else if (block && !t.lplus) {
                const size_t nl = prev.rfind('\n');
                const size_t from = nl == std::string::npos ? 0 : nl + 1;
                const size_t seg_begin = raw[k - 1].begin;
                const bool line_start = nl != std::string::npos || seg_begin == 0 || src[seg_begin - 1] == '\n';
                if (line_start && prev.find_first_not_of(" \t", from) == std::string::npos) prev.resize(from);
            }
        }
        if (k + 1 < raw.size() && raw[k + 1].kind == Segment::Text) {
            std::string& next = raw[k + 1].body;
            if (t.rtrim) {
                size_t n = 0;
                while (n < next.size() && is_ws(next[n])) ++n;
                next.erase(0, n);
            } else if (block && !t.rplus) {
                if (next.rfind("\r\n", 0) == 0) next.erase(0, 2);
                else if (!next.empty() && next[0] == '\n') next.erase(0, 1);
            }
        }
    }
    std::vector<Segment> out;
    for (auto& r : raw) {
        if (r.comment) continue;
        if (r.kind == Segment::Text && r.body.empty()) continue;
        out.push_back({r.kind, std::move(r.body), r.line});
    }
    return out;
}

std::vector<Tok> tokenize(const std::string& s, int line) {
    std::vector<Tok> out;
    size_t i = 0;
    while (i < s.size()) {
        const char c = s[i];
        if (is_ws(c)) { ++i; continue; }
        if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
            size_t j = i;
            while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
            out.push_back({Tok::Name, s.substr(i, j - i)});
            i = j;
        } else if (std::isdigit(static_cast<unsigned char>(c))) {
            size_t j = i;
            while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
            if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
                ++j;
                while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
                Tok t{Tok::Float, s.substr(i, j - i)};
                t.f = std::strtod(t.text.c_str(), nullptr);  // overflow is inf, as in Python
                out.push_back(t);
            } else {
                Tok t{Tok::Int, s.substr(i, j - i)};
                auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), t.i);
                if (ec != std::errc()) syntax(line, "integer literal " + t.text.substr(0, 40) + " does not fit 64 bits");
                out.push_back(t);
            }
            i = j;
        } else if (c == '"' || c == '\'') {
            std::string v;
            size_t j = i + 1;
            for (; j < s.size() && s[j] != c; ++j) {
                if (s[j] != '\\' || j + 1 >= s.size()) { v += s[j]; continue; }
                const char e = s[++j];
                switch (e) {
                    case 'n': v += '\n'; break;
                    case 't': v += '\t'; break;
                    case 'r': v += '\r'; break;
                    case '\\': v += '\\'; break;
                    case '\'': v += '\''; break;
                    case '"': v += '"'; break;
                    default: v += '\\'; v += e;
                }
            }
            if (j >= s.size()) syntax(line, "unterminated string");
            out.push_back({Tok::Str, v});
            i = j + 1;
        } else {
            static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
            std::string op(1, c);
            for (const char* t : two)
                if (s.compare(i, 2, t) == 0) op = t;
            if (op.size() == 1 && std::string_view("+-*/%<>()[]{},.:|~=").find(c) == std::string_view::npos)
                syntax(line, std::string("unexpected character '") + c + "'");
            out.push_back({Tok::Op, op});
            i += op.size();
        }
    }
    out.push_back({Tok::End, ""});
    return out;
}

}  // namespace eh::tokenizer::jinja
