// Parsers for the response headers a download depends on. They read text a
// server (or a mirror at HF_ENDPOINT) chose, so each is fuzzed
// (tests/hub/fuzz_hub_ref.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace eh::hub {

// Content-Range: "bytes 100-999/1000" -> {100, 1000}; total 0 for "/*".
struct ContentRange {
    uint64_t start = 0;
    uint64_t total = 0;
};
std::optional<ContentRange> parse_content_range(std::string_view value);

// Link: <URL>; rel="next", ... -> URL ("" when there is no next page).
std::string next_link(std::string_view value);

// ETag / X-Linked-Etag: W/"abc" or "abc" -> abc.
std::string unquote_etag(std::string_view value);

}  // namespace eh::hub
