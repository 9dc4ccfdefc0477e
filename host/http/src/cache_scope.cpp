// The prefix-cache scope of a request (service::GenerationRequest::
// cache_scope): the API key it presented, as a SHA-256 digest, so one key's
// cached prompts are never reused for, and so never revealed to, another.
#include <openssl/sha.h>

#include <array>

#include "impl.hpp"

namespace eh::http {

std::string cache_scope_of(const Server::Impl& s, const httplib::Request& req) {
    if (!s.keys.required()) return {};  // no tenants to keep apart
    const bool anthropic = req.path.rfind("/v1/messages", 0) == 0;
    const std::string authorization = req.get_header_value("Authorization");
    const std::string x_api_key = anthropic ? req.get_header_value("x-api-key") : std::string();
    const std::string_view key = presented_key(authorization, x_api_key);
    std::array<unsigned char, SHA256_DIGEST_LENGTH> d{};
    SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), d.data());
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * d.size());
    for (unsigned char b : d) {
        out += kHex[b >> 4];
        out += kHex[b & 15];
    }
    return out;
}

}  // namespace eh::http
