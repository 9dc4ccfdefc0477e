// The grammar text's syntax tree: what gbnf_parse.cpp reads and lower.cpp
// turns into a Grammar. Character classes hold code points; literals hold
// bytes (their UTF-8).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eh/constrain/grammar.hpp"

namespace eh::constrain::detail {

inline constexpr uint32_t kUnbounded = UINT32_MAX;
inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct Node {
    enum class Type { Seq, Alt, Literal, Class, Ref, Repeat };
    Type type = Type::Seq;
    std::vector<Node> kids;                            // Seq, Alt; Repeat: one
    std::string text;                                  // Literal bytes; Ref: rule name
    std::vector<std::pair<uint32_t, uint32_t>> ranges; // Class: inclusive code point ranges
    bool negated = false;                              // Class
    uint32_t min = 0, max = 0;                         // Repeat; max may be kUnbounded
};

struct RuleDef {
    std::string name;
    Node body;
    size_t line = 0;
};

// Size limits on a grammar: the public ones (grammar.hpp) for grammar text
// a request sends, larger ones for grammars compiled from a JSON schema
// (json_schema_grammar, tagged_json_grammar), which real schemas of 0.5-1.7
// MB need (Vega-Lite, Octokit's webhooks, oxlint, AWS EC2 resources) and
// whose size the schema already bounds. Each overrun is a GrammarError
// naming the number (docs/http-api.md).
struct GrammarLimits {
    size_t text_bytes = kMaxGrammarTextBytes;
    size_t rules = kMaxGrammarRules;
    size_t elements = kMaxGrammarElements;
};
inline constexpr GrammarLimits kSchemaGrammarLimits{2 * 1024 * 1024, 160000, 8000000};

// Throws GrammarError naming the line and column.
std::vector<RuleDef> parse_gbnf(std::string_view text, const GrammarLimits& limits = {});

// Checks (undefined or twice-defined rules, rules that can never end,
// left recursion, the size limits) and flattens.
std::shared_ptr<const Grammar> lower(const std::vector<RuleDef>& rules, std::string_view root,
                                     const GrammarLimits& limits = {});

}  // namespace eh::constrain::detail
