// API keys as the command line reads them (--api-key, --api-key-file,
// ENGINE_HOST_API_KEY); the server's checking lives in src/auth.hpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace eh::http {

// Why `key` cannot be an API key ("" when it can): empty, longer than 4096
// bytes, or a byte outside printable ASCII or a space (it travels in a
// header and must not start or end in whitespace).
std::string key_problem(std::string_view key);

// The keys of an --api-key-file: one per line; blank lines and lines that
// start with '#' are skipped, spaces and a CR around a key are trimmed.
// Throws eh::Error(InvalidRequest) naming the path (and the line) when the
// path is not a readable regular file, holds no key or a bad one.
std::vector<std::string> read_api_key_file(const std::string& path);

}  // namespace eh::http
