// UTF-8 helpers for streaming text safely.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace eh::service {

// Length of the longest prefix of `s` that does not end inside a UTF-8
// sequence that could still be completed by more bytes. Bytes that can never
// be valid are counted in (sanitize_utf8 replaces them).
size_t complete_utf8_prefix(std::string_view s);
// `s` with every invalid sequence replaced by U+FFFD.
std::string sanitize_utf8(std::string_view s);
// True when `s` is valid UTF-8.
bool is_valid_utf8(std::string_view s);
// Number of code points (invalid bytes count one each).
size_t utf8_length(std::string_view s);

}  // namespace eh::service
