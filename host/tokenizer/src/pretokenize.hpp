// Pre-tokenizer splitters. The split patterns of the supported vocabularies
// need Unicode classes and a lookahead, which std::regex lacks, so each
// pattern is a small hand-written matcher over codepoints that reproduces
// what a backtracking regex engine returns for it (first alternative that
// matches at the current position, greedy quantifiers).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace eh::tokenizer {

enum class SplitPattern {
    None,    // the whole fragment is one word
    Gpt2,    // GPT-2 / ByteLevel(use_regex=true)
    Llama3,  // Llama 3 ("llama-bpe"): \p{N}{1,3}, case-insensitive contractions
    Qwen2,   // as Llama 3 but single digits
    O200k,   // GPT-4o / gpt-oss: case-aware letter runs, "/" after punctuation
};

// The pattern whose regex text (as tokenizer.json spells it) this is.
std::optional<SplitPattern> pattern_from_regex(std::string_view regex);

// The pattern for a GGUF tokenizer.ggml.pre value.
std::optional<SplitPattern> pattern_from_gguf_pre(std::string_view pre);

const char* pattern_name(SplitPattern p);

// Splits text into pieces (byte ranges [first, second)) that cover it
// exactly, in order. Invalid UTF-8 bytes count as punctuation-like units.
void split_words(SplitPattern p, std::string_view text,
                 std::vector<std::pair<uint32_t, uint32_t>>& out);

}  // namespace eh::tokenizer
