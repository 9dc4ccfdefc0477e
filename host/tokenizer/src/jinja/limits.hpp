// The chat-template interpreter's errors and the bounds that keep a hostile
// template from crashing the host: every stage (lexer, parser, evaluator)
// reports through these and counts against these limits.
#pragma once

#include <cstddef>
#include <string>

#include "eh/error.hpp"

namespace eh::tokenizer::jinja {

[[noreturn]] inline void syntax(int line, const std::string& what) {
    throw Error(Code::InvalidRequest, "chat template line " + std::to_string(line) + ": " + what);
}
[[noreturn]] inline void runtime(const std::string& what) { throw Error(Code::InvalidRequest, "chat template: " + what); }

// Hostile templates must fail, not crash: the parsers recurse once per
// nesting level, so nesting is bounded well below what the stack holds, and
// every string or list a template builds is bounded so that a few doubling
// steps cannot exhaust memory before the step budget notices.
constexpr int kMaxNesting = 200;
constexpr size_t kMaxValueBytes = size_t(8) << 20;
constexpr size_t kMaxListItems = 1'000'000;

inline std::string checked_size(std::string s) {
    if (s.size() > kMaxValueBytes)
        runtime("a string grew past " + std::to_string(kMaxValueBytes) + " bytes");
    return s;
}
inline size_t checked_sum(size_t a, size_t b, size_t limit, const char* what) {
    if (a > limit || b > limit - a) runtime(std::string(what) + " grew past " + std::to_string(limit));
    return a + b;
}

// Counts one level of parser recursion; throws past kMaxNesting.
struct NestGuard {
    int& depth;
    NestGuard(int& d, int line) : depth(d) {
        if (++depth > kMaxNesting) {
            --depth;
            throw Error(Code::InvalidRequest, "chat template line " + std::to_string(line) +
                                                  ": nesting deeper than " + std::to_string(kMaxNesting) + " levels");
        }
    }
    ~NestGuard() { --depth; }
};

inline bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace eh::tokenizer::jinja
