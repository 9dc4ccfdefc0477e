// Code point ranges as UTF-8 byte patterns: [lo, hi] becomes a few
// sequences of byte ranges, each matching exactly the encodings of a
// sub-range (surrogates U+D800..U+DFFF are never encoded).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace eh::constrain::detail {

using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out);
// The UTF-8 of one code point (no checks; callers pass valid scalars).
void append_utf8(std::string& out, uint32_t cp);

}  // namespace eh::constrain::detail
