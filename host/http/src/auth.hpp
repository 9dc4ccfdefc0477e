// API keys (--api-key, --api-key-file, ENGINE_HOST_API_KEY): which routes
// need one, how a request presents it, and the comparison.
//
// The server keeps only each key's SHA-256 digest. A presented key is hashed
// once and its digest compared with every configured digest by
// CRYPTO_memcmp, with no early exit: the time taken depends on the number of
// keys and the length of what the client sent, never on how much of a real
// key it guessed or on the real keys' lengths.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "eh/http/api_keys.hpp"

namespace eh::http {

class ApiKeys {
public:
    ApiKeys() = default;
    explicit ApiKeys(const std::vector<std::string>& keys);
    bool required() const { return !digests_.empty(); }
    bool accepts(std::string_view presented) const;

private:
    std::vector<std::array<unsigned char, 32>> digests_;
};

// The key a request presents: the token of "Authorization: Bearer TOKEN"
// (scheme case-insensitive), else `x_api_key` (Anthropic clients send the
// key in x-api-key; pass "" where that header is not accepted). "" if none.
std::string_view presented_key(std::string_view authorization, std::string_view x_api_key);

// Whether a request needs a key when keys are configured. Open: /health,
// /metrics (unless `metrics_require_key`), the chat page's files (GET / and
// /NAME.html|css|js: the page asks for the key itself) and CORS preflights
// (OPTIONS; browsers never send credentials on them).
bool route_needs_key(std::string_view method, std::string_view path, bool metrics_require_key);

}  // namespace eh::http
