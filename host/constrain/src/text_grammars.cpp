// Output constraints on plain text that vLLM's request fields name: a
// regular expression the whole output matches (guided_regex), and one of a
// list of literal strings (guided_choice). Both become grammar text and go
// through the GBNF compiler, so they share its limits and checks.
#include <fmt/format.h>

#include "eh/constrain/grammar.hpp"
#include "regex.hpp"

namespace eh::constrain {

namespace {

// A GBNF literal for `s`: raw UTF-8, with `"`, `\` and control bytes escaped.
std::string literal(std::string_view s) {
    std::string out = "\"";
    for (char ch : s) {
        const auto b = uint8_t(ch);
        if (ch == '"' || ch == '\\') out += '\\', out += ch;
        else if (b < 0x20 || b == 0x7F) out += fmt::format("\\x{:02X}", b);
        else out += ch;
    }
    return out + "\"";
}

}  // namespace

std::shared_ptr<const Grammar> regex_output_grammar(std::string_view pattern) {
    return gbnf_grammar("root ::= " + detail::regex_text_grammar(pattern) + "\n");
}

std::shared_ptr<const Grammar> choice_grammar(const std::vector<std::string>& choices) {
    if (choices.empty()) throw GrammarError("choice", "the list of choices is empty");
    std::string text = "root ::= ";
    for (size_t i = 0; i < choices.size(); ++i) {
        if (text.size() > kMaxGrammarTextBytes)
            throw GrammarError("choice", fmt::format("the choices are longer than {} bytes in all (the limit)",
                                                     kMaxGrammarTextBytes));
        text += (i ? " | " : "") + literal(choices[i]);
    }
    return gbnf_grammar(text + "\n");
}

}  // namespace eh::constrain
