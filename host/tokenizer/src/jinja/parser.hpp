// The parser: a template's segments into a statement tree, by recursive
// descent with Jinja's operator precedence. Nesting, both of the parser's
// recursion and of the trees it builds, is bounded by kMaxNesting.
#pragma once

#include <vector>

#include "lexer.hpp"
#include "tree.hpp"

namespace eh::tokenizer::jinja {

// Throws a "chat template line N: ..." error for a syntax error or an
// unsupported statement.
Body parse(std::vector<Segment> segments);

}  // namespace eh::tokenizer::jinja
