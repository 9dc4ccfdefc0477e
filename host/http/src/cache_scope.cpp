// The prefix-cache scope of a request (service::GenerationRequest::
// cache_scope): the API key it presented, as a SHA-256 digest, so one key's
// cached prompts are never reused for, and so never revealed to, another.
#include "impl.hpp"

namespace eh::http {

std::string cache_scope_of(const Server::Impl& s, const httplib::Request& req) {
    if (!s.keys.required()) return {};  // no tenants to keep apart
    return digest_hex(request_key(req));
}

}  // namespace eh::http
