// JSON schemas as grammar text (the syntax gbnf_parse.cpp reads): the
// shared rules for JSON's lexical parts and one rule set per schema, so a
// grammar can hold several schemas (tool calls) under different prefixes.
#pragma once

#include <string>
#include <string_view>

namespace eh::constrain::detail {

// The rules every JSON grammar uses: j-ws (nothing, a space, or a newline
// and up to 20 spaces/tabs), j-value,
// j-object, j-array, j-string, j-number, j-integer, j-boolean, j-null.
const std::string& json_base_rules();

// `schema_json` compiled into rules named `<prefix>...` appended to `out`;
// returns the expression (a rule name) for a value matching the schema.
// Throws GrammarError naming the keyword and its place in the schema.
std::string schema_rules(std::string_view schema_json, const std::string& prefix, std::string& out);

// `bytes` as a grammar literal ("..." with escapes).
std::string literal(std::string_view bytes);

}  // namespace eh::constrain::detail
