// libFuzzer target: arbitrary bytes as a grammar text (first byte even) or a
// JSON schema (odd); what compiles is matched against the input's own bytes
// and asked for masks over a one-byte vocabulary. Any crash, hang or
// sanitizer report is a bug: bad input must fail with eh::Error.
//   ./fuzz_constrain corpus tests/constrain/fuzz_constrain_seeds -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "eh/constrain/automaton.hpp"
#include "eh/constrain/grammar.hpp"
#include "eh/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
    static const auto vocab = [] {
        std::vector<std::string> bytes;
        for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
        bytes.emplace_back();
        return std::make_shared<const eh::constrain::TokenVocab>(std::move(bytes), std::vector<int32_t>{256});
    }();
    try {
        auto g = (data[0] & 1) ? eh::constrain::json_schema_grammar(text) : eh::constrain::gbnf_grammar(text);
        eh::constrain::Matcher m(std::make_shared<eh::constrain::Automaton>(g, vocab));
        // Follow the mask: take the allowed byte nearest the input's next byte.
        for (size_t i = 0; i < std::min<size_t>(size, 64); ++i) {
            auto mask = m.mask();
            int pick = -1;
            for (int d = 0; d < 257 && pick < 0; ++d) {
                const int b = (data[i] + d) % 257;
                if (((*mask)[size_t(b) / 32] >> (b % 32)) & 1u) pick = b;
            }
            if (pick < 0) __builtin_trap();  // a state with no way on
            if (pick == 256) {
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
