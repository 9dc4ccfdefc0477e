// The lexer: a template's source into text, {{ expression }} and {% block %}
// segments (comments dropped, trim_blocks / lstrip_blocks and "-" / "+"
// whitespace control applied), and an expression's text into tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace eh::tokenizer::jinja {

struct Segment {
    enum Kind { Text, Var, Block } kind;
    std::string body;
    int line;
};

// Throws a "chat template line N" error for an unclosed tag.
std::vector<Segment> lex(std::string_view src);

struct Tok {
    enum Kind { End, Name, Str, Int, Float, Op } kind = End;
    std::string text;
    int64_t i = 0;
    double f = 0;
};

// The tokens of one segment's expression, ending with an End token; `line`
// names the segment in errors.
std::vector<Tok> tokenize(const std::string& s, int line);

}  // namespace eh::tokenizer::jinja
