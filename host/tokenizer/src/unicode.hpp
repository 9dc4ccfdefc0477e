// Codepoint-level helpers for the tokenizer: UTF-8 decoding that never
// fails (invalid bytes become one-byte "invalid" units so byte-level models
// still see and round-trip them), the character classes the pre-tokenizer
// patterns use, and NFC. Category data comes from ICU (libicu-dev).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace eh::tokenizer::unicode {

// Classes the supported split patterns distinguish. A codepoint has exactly
// one; \s is White_Space, and letter subclasses keep the o200k distinctions.
enum Cls : uint8_t {
    kLu = 1,      // uppercase letter
    kLl = 2,      // lowercase letter
    kLt = 3,      // titlecase letter
    kLm = 4,      // modifier letter
    kLo = 5,      // other letter
    kM = 6,       // mark (Mn, Mc, Me)
    kN = 7,       // number (Nd, Nl, No)
    kSpace = 8,   // White_Space property
    kOther = 9,   // punctuation, symbols, controls, unassigned, invalid bytes
};

inline bool is_letter(uint8_t c) { return c >= kLu && c <= kLo; }

Cls classify(uint32_t cp);

// Marker for a byte that does not start a valid UTF-8 sequence.
constexpr uint32_t kInvalid = 0xFFFFFFFFu;

// Decodes one unit at s[i]: returns the codepoint (or kInvalid) and sets len
// to the bytes consumed (1 for an invalid byte). Rejects overlongs,
// surrogates and values past U+10FFFF.
uint32_t decode_one(std::string_view s, size_t i, size_t& len);

// Length of a valid UTF-8 sequence that starts at s[i], 0 if it is invalid,
// or -1 if it is a valid but incomplete prefix running past the end.
int utf8_prefix_state(std::string_view s, size_t i);

void append_utf8(std::string& out, uint32_t cp);

// NFC-normalises valid UTF-8; invalid bytes pass through unchanged.
std::string nfc(std::string_view s);

}  // namespace eh::tokenizer::unicode
