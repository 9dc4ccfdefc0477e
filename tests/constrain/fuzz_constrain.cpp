// libFuzzer target: arbitrary bytes as a JSON schema (first byte odd), a
// regular expression for the whole output (bit 1 set, bit 2 clear: vLLM's
// guided_regex), a list of choices one per line (bits 1 and 2: guided_choice)
// or a grammar text (else); what compiles is matched against the input's own bytes
// and asked for masks over a small vocabulary: every single byte, an
// end-of-generation token, and a few multi-byte tokens (JSON punctuation,
// words, UTF-8 characters, a control token, one token with no bytes), so
// the mask's trie walk skips and cuts subtrees as it does over a real
// vocabulary, at the cost of one walk over ~300 trie nodes per new state.
// Checks: no crash, hang or sanitizer report (bad input must fail with
// eh::Error: the mask work budget's too); a state always has a way on; the end-of-generation bit is
// exactly "accepting"; each multi-byte token is in the mask exactly when
// the matcher accepts its bytes.
//   ./fuzz_constrain corpus tests/constrain/fuzz_constrain_seeds -max_total_time=60
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "eh/constrain/automaton.hpp"
#include "eh/constrain/grammar.hpp"
#include "eh/constrain/vocab.hpp"
#include "eh/error.hpp"

namespace {

constexpr int kEog = 256;
constexpr size_t kWorkPerToken = 100000;
constexpr size_t kWorkPerInput = 2000000;
constexpr int kFirstMulti = 257;  // multi-byte tokens from here on

std::shared_ptr<const eh::constrain::TokenVocab> make_vocab() {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
    bytes.emplace_back();  // kEog
    for (const char* t : {"{\"", "\":", "\",\"", "\"}", "[{", "}]", "true", "false", "null", "ab", "abc", "ab",
                          "12", "0.5", "e+", " \n", "\n  ", "\xc3\xa9", "\xe6\x97\xa5\"", "\xf0\x9f\x98\x80", ""})
        bytes.emplace_back(t);
    bytes.push_back(eh::constrain::control_token_bytes("<|x|>"));
    return std::make_shared<const eh::constrain::TokenVocab>(std::move(bytes), std::vector<int32_t>{kEog});
}

bool allowed(const eh::constrain::Mask& m, int id) { return (m[size_t(id) / 32] >> (id % 32)) & 1u; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
    static const auto vocab = make_vocab();
    const int n_tokens = int(vocab->size());
    try {
        std::shared_ptr<const eh::constrain::Grammar> g;
        if (data[0] & 1) {
            g = eh::constrain::json_schema_grammar(text);
        } else if ((data[0] & 6) == 2) {
            g = eh::constrain::regex_output_grammar(text);
        } else if ((data[0] & 6) == 6) {
            std::vector<std::string> choices;
            for (size_t at = 0; at <= text.size();) {
                const size_t nl = std::min(text.find('\n', at), text.size());
                choices.emplace_back(text.substr(at, nl - at));
                at = nl + 1;
            }
            g = eh::constrain::choice_grammar(choices);
        } else {
            g = eh::constrain::gbnf_grammar(text);
        }
        // A budget for this ~300-token vocabulary's masks (the server's
        // kMaxMaskWork is sized for 150 K-token ones), and a cap on the
        // whole input's work, so a grammar of the slow kind ends its input
        // (with the budget's error, or here) instead of timing out.
        auto automaton = std::make_shared<eh::constrain::Automaton>(g, vocab, kWorkPerToken);
        eh::constrain::Matcher m(automaton);
        // Follow the mask: a byte >= 0xF0 asks for a multi-byte token if one
        // is allowed; otherwise take the allowed byte nearest the input's.
        for (size_t i = 0; i < std::min<size_t>(size, 64); ++i) {
            if (automaton->stats().total_work > kWorkPerInput) break;
            const auto mask = m.mask();
            if (allowed(*mask, kEog) != m.accepting()) __builtin_trap();
            for (int k = kFirstMulti; k < n_tokens; ++k) {
                eh::constrain::Matcher copy = m;
                if (allowed(*mask, k) != copy.accept(k)) __builtin_trap();  // mask and matcher disagree
            }
            if (data[i] >= 0xF0) {
                const int k = kFirstMulti + (data[i] - 0xF0) % (n_tokens - kFirstMulti);
                if (allowed(*mask, k)) {
                    if (!m.accept(k)) __builtin_trap();
                    if (m.complete()) break;
                    continue;
                }
            }
            int pick = -1;
            for (int d = 0; d < 257 && pick < 0; ++d) {
                const int b = (data[i] + d) % 257;
                if (allowed(*mask, b)) pick = b;
            }
            if (pick < 0) __builtin_trap();  // a state with no way on (a token's first byte is a token too)
            if (pick == kEog) {
                if (!m.accepting()) __builtin_trap();
                break;
            }
            if (!m.accept(pick)) __builtin_trap();  // the mask allowed it
            if (m.complete()) break;
        }
    } catch (const eh::Error&) {
    }
    return 0;
}
