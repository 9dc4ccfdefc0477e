// The few HTTP(S) requests a hub download makes, over cpp-httplib. Redirects
// are followed here rather than by the library so that the token is only
// ever sent to the hub's own origin (the hub redirects file downloads to a
// CDN on another host, and any URL the hub names may point anywhere) and so
// a HEAD can stop at the hub's answer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "eh/error.hpp"

namespace eh::hub {

inline constexpr int kMaxRedirects = 10;
inline constexpr size_t kMaxTextBody = 32u << 20;  // a tree API page, an error body

struct Url {
    std::string scheme;   // http or https
    std::string host;     // lower case, without brackets for IPv6
    int port = 0;
    std::string target;   // path and query, starting with '/'
    std::string origin() const;
    std::string str() const { return origin() + target; }
};

// nullopt unless `text` is an absolute http(s) URL.
std::optional<Url> parse_url(std::string_view text);
// A Location header against the URL that sent it (absolute, or a path).
std::optional<Url> resolve_location(const Url& base, std::string_view location);
// Percent-encodes a repository file path, keeping '/'.
std::string encode_path(std::string_view path);

// The host could not be reached, or the connection broke: the caller may fall
// back to the cache or retry.
class NetworkError : public Error {
public:
    explicit NetworkError(const std::string& msg) : Error(Code::ModelLoadFailed, msg) {}
};

struct HttpResponse {
    int status = 0;
    std::map<std::string, std::string> headers;  // names in lower case
    std::string body;                            // get_text only
    Url url;                                     // the URL that answered
    std::string header(const std::string& lower_name) const;
};

struct HttpOptions {
    // Bearer token, sent only on requests to token_origin (Url::origin(): scheme,
    // host and port; the configured endpoint's), whichever URL a request
    // started from and wherever a redirect leads. Empty origin: never sent.
    std::string token;
    std::string token_origin;
    std::chrono::seconds connect_timeout{15};
    std::chrono::seconds read_timeout{60};
    std::string user_agent = "engine-host";
};

class HttpClient {
public:
    explicit HttpClient(HttpOptions options) : opt_(std::move(options)) {}

    // HEAD. Follows redirects to a path on the same origin (a renamed repo);
    // returns the first response that is not one, or that carries the hub's
    // X-Repo-Commit / X-Linked-Etag. Throws NetworkError.
    HttpResponse head(const Url& url) const;

    // GET into memory, following every redirect; bodies over kMaxTextBody
    // are an error. Throws NetworkError.
    HttpResponse get_text(const Url& url) const;

    // GET from byte `offset` (a Range request when offset > 0), following
    // every redirect. Before the first body byte, `begin(start, total)` says
    // where the body starts (0 when the server ignored the Range) and the
    // whole file's size (0 if unknown); then `sink` gets the bytes. Returns
    // the final status; `transport_error` is set when the connection broke
    // mid-way (what arrived was delivered, so a retry can resume).
    struct Stream {
        int status = 0;
        std::map<std::string, std::string> headers;
        std::string transport_error;
    };
    Stream get_stream(const Url& url, uint64_t offset, const std::function<void(uint64_t, uint64_t)>& begin,
                      const std::function<bool(const char*, size_t)>& sink) const;

private:
    HttpOptions opt_;
};

}  // namespace eh::hub
