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

namespace httplib {
struct Request;
}

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

// An Authorization header's credentials (RFC 7235): the scheme, compared
// case-insensitively, and what follows it after any run of spaces or tabs,
// surrounding blanks trimmed. Both "" for an empty header.
struct Credentials {
    std::string_view scheme;
    std::string_view token;
};
Credentials parse_authorization(std::string_view authorization);

// The key a request presents: the token of "Authorization: Bearer TOKEN"
// (scheme case-insensitive), else `x_api_key` (Anthropic clients send the
// key in x-api-key; pass "" where that header is not accepted). "" if none.
std::string_view presented_key(std::string_view authorization, std::string_view x_api_key);
// The key `req` presents: x-api-key counts on /v1/messages* (Anthropic's
// clients send it there) and nowhere else. A copy: headers are copied out.
std::string request_key(const httplib::Request& req);
// Lower-case hex SHA-256 of `s`: how a key is kept when it must be told
// apart from others without being kept itself.
std::string digest_hex(std::string_view s);

// Who a request's credentials say it is, for comparing two requests (the
// submitter of a job and a POST /cancel): the SHA-256 of the lower-cased
// scheme and the token, in hex. "Bearer K", "bearer  K" and "BEARER\tK"
// are one identity; the key itself is never kept. "" for an empty header.
std::string credential_identity(std::string_view authorization);

// Why the request's credential headers cannot be read, or "": Authorization
// sent more than once (and x-api-key, where `x_api_key_accepted`). It is not
// a list-valued header (RFC 9110), and which copy counts would be a guess
// that a proxy in front may make differently; such a request is a 400.
std::string credential_header_problem(const httplib::Request& req, bool x_api_key_accepted);

// Whether a request needs a key when keys are configured. Open: /health,
// the probes /health/live and /health/ready,
// /metrics (unless `metrics_require_key`), the chat page's files (GET / and
// /NAME.html|css|js: the page asks for the key itself) and CORS preflights
// (OPTIONS; browsers never send credentials on them).
bool route_needs_key(std::string_view method, std::string_view path, bool metrics_require_key);

}  // namespace eh::http
