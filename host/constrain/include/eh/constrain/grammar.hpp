// Constrained decoding, part 1: what the output may be, as a context-free
// grammar over output BYTES. Every constructor here returns a compiled,
// immutable Grammar (shareable between threads and requests); the token
// mask side (vocab.hpp, automaton.hpp) turns it into allowed-token sets.
//
// Constructors:
//   gbnf_grammar          the native API's grammar text (docs/http-api.md,
//                         "Grammar syntax")
//   json_schema_grammar   a JSON schema (the subset OpenAI's strict structured
//                         outputs documents); JSON text in the schema's shape
//   json_object_grammar   any JSON object (response_format json_object)
//   regex_output_grammar  text matching a regular expression (guided_regex)
//   choice_grammar        one of several literal strings (guided_choice)
//   tagged_json_grammar   literal prefix + JSON matching a schema + literal
//                         suffix, one of several, repeated (tool calls)
// All of them throw GrammarError (an eh::Error with Code::InvalidRequest)
// that names the offending keyword or rule; nothing they are given crashes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "eh/error.hpp"

namespace eh::constrain {

// A schema or grammar the compiler refuses. keyword(): the JSON-schema
// keyword ("pattern", "allOf", ...) or grammar construct at fault, "" when
// none applies; the message says where ("at /properties/age").
class GrammarError : public Error {
public:
    GrammarError(std::string keyword, const std::string& message)
        : Error(Code::InvalidRequest, message), keyword_(std::move(keyword)) {}
    const std::string& keyword() const { return keyword_; }

private:
    std::string keyword_;
};

// Documented limits (docs/http-api.md); each overrun is a GrammarError.
inline constexpr size_t kMaxGrammarTextBytes = 256 * 1024;  // grammar text, or generated from a schema
inline constexpr size_t kMaxGrammarRules = 20000;           // rules after lowering groups and repeats
inline constexpr size_t kMaxGrammarElements = 1000000;      // items over all alternatives
inline constexpr uint32_t kMaxRepeat = 1000;                // the n of {m,n}
inline constexpr uint32_t kMaxGrammarNesting = 64;          // parentheses, and schema nesting

// The compiled form: rules whose alternatives are sequences of byte sets
// and rule references, stored flat. An alternative starting at position p
// is elems[p], elems[p+1], ... up to an End element.
struct Grammar {
    enum class Kind : uint8_t { Bytes, Ref, End };
    struct Elem {
        Kind kind = Kind::End;
        uint32_t arg = 0;  // Bytes: index into sets; Ref: rule index
    };
    using ByteSet = std::array<uint64_t, 4>;

    std::vector<ByteSet> sets;
    std::vector<Elem> elems;
    std::vector<std::vector<uint32_t>> alts;  // per rule: start positions of its alternatives
    std::vector<std::string> names;           // per rule, for messages
    uint32_t root = 0;
    // Counted repeats x{m,n} are chains of rules, one link per copy, and a
    // parse stack holds a reference to the rest of the chain: "exactly
    // `left` more copies" in an exact chain (the m), "up to `left` more" in
    // the other kind (the n-m). chains[c-1].at[left] is the element that
    // refers to the rest with `left` copies to go; counted[p] says which
    // chain and `left` element p is (chain 0: none; empty when the grammar
    // has no chain). The matcher uses this twice: continuing with more
    // copies left allows a superset of what continuing with fewer does
    // ("up to" chains), and a token of at most D bytes cannot tell `left`
    // >= D from D (either kind, copies matching at least one byte). Both
    // hold for a stack position inside a link's x too, with that link's
    // count.
    // `copy`: the element is a link's x rather than its reference to the
    // rest (chains[c-1].at[left] - 1, the element before it).
    struct Counted {
        uint32_t chain = 0, left = 0;
        bool copy = false;
    };
    struct Chain {
        bool exact = false;
        std::vector<uint32_t> at;
    };
    std::vector<Counted> counted;
    std::vector<Chain> chains;


    bool has(uint32_t set, uint8_t b) const { return (sets[set][b >> 6] >> (b & 63)) & 1u; }
};

std::shared_ptr<const Grammar> gbnf_grammar(std::string_view text);
// schema_json: the schema as JSON text.
std::shared_ptr<const Grammar> json_schema_grammar(std::string_view schema_json);
std::shared_ptr<const Grammar> json_object_grammar();
// vLLM's guided_regex: the whole output (raw text, not JSON) matches the
// ECMA-262 `pattern`, in the subset JSON-schema `pattern` takes (^ and $
// optional; GrammarError "pattern" for the rest).
std::shared_ptr<const Grammar> regex_output_grammar(std::string_view pattern);
// vLLM's guided_choice: the output is exactly one of `choices` (GrammarError
// "choice" for an empty list).
std::shared_ptr<const Grammar> choice_grammar(const std::vector<std::string>& choices);

// For tool calls: the output is `count` parts, min_count <= count <=
// max_count, joined by `separator`; each part is one of `alternatives`:
// its prefix bytes, a JSON value matching its schema (JSON text; "" = any
// JSON value), then its suffix bytes. Leading whitespace before the first
// part is not allowed: the prefix decides how the output starts.
// Example (Qwen2.5, tool_choice=required, parallel calls):
//   alternatives = {{"<tool_call>\n", R"({"type":"object",...name const "f"...})", "\n</tool_call>"}, ...}
//   min_count 1, max_count 8, separator "\n"
struct TaggedJson {
    std::string prefix;
    std::string schema_json;
    std::string suffix;
};
std::shared_ptr<const Grammar> tagged_json_grammar(const std::vector<TaggedJson>& alternatives,
                                                   uint32_t min_count = 1, uint32_t max_count = 1,
                                                   std::string_view separator = "");

}  // namespace eh::constrain
