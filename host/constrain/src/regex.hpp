// JSON-schema `pattern` (an ECMA-262 regular expression) as grammar text
// over the JSON string's CONTENT: each character the regex matches is
// written as JSON writes it (raw, or `\"`, `\\`, `\n`, `\u001f` ... for the
// characters JSON must escape), so the output parses back to a string the
// regex matches.
//
// Supported: literals, classes ([a-z], [^...]), escapes (\d \D \w \W \s \S,
// \t \n \r \v \f \0, \xHH, \uHHHH, \u{H...}, \cX, escaped punctuation), `.`,
// groups ((...), (?:...), (?<name>...)), alternation, quantifiers ? * + {m}
// {m,} {m,n} (lazy forms too: they match the same strings), and anchors ^ at
// the start and $ at the end of a top-level alternative. A side that is not
// anchored may have anything there (a pattern is a search, not a match).
// Refused by name (GrammarError keyword "pattern"): backreferences,
// lookahead/lookbehind, \b \B, \p{...}, ^ or $ elsewhere, counts above
// kMaxRepeat.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace eh::constrain::detail {

inline constexpr uint64_t kRegexUnbounded = UINT64_MAX;

// The grammar expression for a string's content matching `pattern`, with
// a length (in code points) in [min_len, max_len] (max_len may be
// kRegexUnbounded). `any_char` names the grammar rule for one JSON-encoded
// character (used for the unanchored sides). Returns nullopt when the
// length bounds can neither be shown to hold for every match nor be folded
// into the pattern (only an anchored single class under a quantifier, or a
// pattern whose match lengths already lie in the bounds, can carry them).
// Throws GrammarError("pattern", ...) for what the subset refuses.
std::optional<std::string> regex_grammar(std::string_view pattern, const std::string& any_char, uint64_t min_len,
                                         uint64_t max_len);

// The grammar expression for raw text (not a JSON string) that `pattern`
// matches as a whole: what vLLM's guided_regex asks for (^ and $ may be
// written and change nothing; a lookahead is refused). Same subset, same
// GrammarError("pattern", ...) refusals.
std::string regex_text_grammar(std::string_view pattern);

// One JSON-encoded character from the code point ranges (inclusive,
// sorted or not): raw where JSON allows, escaped where it must.
std::string json_char_class(std::vector<std::pair<uint32_t, uint32_t>> ranges);

}  // namespace eh::constrain::detail
