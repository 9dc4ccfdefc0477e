#include "eh/hub/http_client.hpp"

#include <httplib.h>

#include "eh/hub/http_headers.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace eh::hub {
namespace {

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return s;
}

std::map<std::string, std::string> lowered(const httplib::Headers& h) {
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : h) out[lower(k)] = v;
    return out;
}

bool is_redirect(int status) { return status == 301 || status == 302 || status == 303 || status == 307 || status == 308; }

std::unique_ptr<httplib::Client> make_client(const Url& url, const HttpOptions& opt) {
    auto c = std::make_unique<httplib::Client>(url.origin());
    c->set_follow_location(false);
    c->set_decompress(false);
    c->set_connection_timeout(opt.connect_timeout);
    c->set_read_timeout(opt.read_timeout);
    c->set_write_timeout(opt.read_timeout);
    return c;
}

httplib::Headers request_headers(const Url& url, const HttpOptions& opt) {
    httplib::Headers h{{"User-Agent", opt.user_agent}, {"Accept-Encoding", "identity"}};
    if (!opt.token.empty() && !opt.token_origin.empty() && url.origin() == opt.token_origin)
        h.emplace("Authorization", "Bearer " + opt.token);
    return h;
}

Url next_hop(const Url& from, const std::string& location, int& hops) {
    if (++hops > kMaxRedirects)
        throw NetworkError("more than " + std::to_string(kMaxRedirects) + " redirects from " + from.str());
    auto to = resolve_location(from, location);
    if (!to) throw NetworkError("bad redirect from " + from.str() + " to '" + location + "'");
    return *to;
}

}  // namespace

std::string Url::origin() const {
    std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    bool default_port = (scheme == "http" && port == 80) || (scheme == "https" && port == 443);
    return scheme + "://" + h + (default_port ? "" : ":" + std::to_string(port));
}

std::optional<Url> parse_url(std::string_view text) {
    Url u;
    size_t p = text.find("://");
    if (p == std::string_view::npos) return std::nullopt;
    u.scheme = lower(std::string(text.substr(0, p)));
    if (u.scheme != "http" && u.scheme != "https") return std::nullopt;
    std::string_view rest = text.substr(p + 3);
    size_t slash = rest.find_first_of("/?#");
    std::string_view authority = rest.substr(0, slash);
    std::string_view target = slash == std::string_view::npos ? "/" : rest.substr(slash);
    if (size_t hash = target.find('#'); hash != std::string_view::npos) target = target.substr(0, hash);
    if (authority.find('@') != std::string_view::npos) return std::nullopt;  // no credentials in URLs
    std::string_view port;
    if (!authority.empty() && authority.front() == '[') {
        size_t close = authority.find(']');
        if (close == std::string_view::npos) return std::nullopt;
        u.host = authority.substr(1, close - 1);
        std::string_view after = authority.substr(close + 1);
        if (!after.empty()) {
            if (after.front() != ':') return std::nullopt;
            port = after.substr(1);
        }
    } else {
        size_t colon = authority.rfind(':');
        u.host = authority.substr(0, colon);
        if (colon != std::string_view::npos) port = authority.substr(colon + 1);
    }
    if (u.host.empty()) return std::nullopt;
    u.host = lower(u.host);  // host names compare case-insensitively: one origin, one spelling
    u.port = u.scheme == "https" ? 443 : 80;
    if (!port.empty()) {
        int n = 0;
        auto r = std::from_chars(port.data(), port.data() + port.size(), n);
        if (r.ec != std::errc() || r.ptr != port.data() + port.size() || n < 1 || n > 65535) return std::nullopt;
        u.port = n;
    }
    u.target = target.empty() || target.front() != '/' ? "/" + std::string(target) : std::string(target);
    return u;
}

std::optional<Url> resolve_location(const Url& base, std::string_view location) {
    if (location.find("://") != std::string_view::npos) return parse_url(location);
    if (location.substr(0, 2) == "//") return parse_url(base.scheme + ":" + std::string(location));
    if (location.empty() || location.front() != '/') return std::nullopt;  // the hub sends absolute paths
    Url u = base;
    u.target = location;
    return u;
}

std::string encode_path(std::string_view path) {
    static const char* hex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : path) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
            out.push_back(char(c));
        } else {
            out.push_back('%');
            out.push_back(hex[c >> 4]);
            out.push_back(hex[c & 15]);
        }
    }
    return out;
}

std::string HttpResponse::header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
}

HttpResponse HttpClient::head(const Url& first) const {
    Url url = first;
    for (int hops = 0;;) {
        auto c = make_client(url, opt_);
        auto res = c->Head(url.target, request_headers(url, opt_));
        if (!res) throw NetworkError("HEAD " + url.str() + " failed: " + httplib::to_string(res.error()));
        HttpResponse out{res->status, lowered(res->headers), {}, url};
        bool hub_answer = !out.header("x-repo-commit").empty() || !out.header("x-linked-etag").empty();
        std::string loc = out.header("location");
        if (!is_redirect(out.status) || hub_answer || loc.empty() || loc.front() != '/' || loc.substr(0, 2) == "//")
            return out;
        url = next_hop(url, loc, hops);
    }
}

HttpResponse HttpClient::get_text(const Url& first) const {
    Url url = first;
    for (int hops = 0;;) {
        auto c = make_client(url, opt_);
        HttpResponse out;
        out.url = url;
        bool too_big = false;
        auto res = c->Get(
            url.target, request_headers(url, opt_),
            [&](const httplib::Response& r) {
                out.status = r.status;
                out.headers = lowered(r.headers);
                return true;
            },
            [&](const char* data, size_t n) {
                if (out.body.size() + n > kMaxTextBody) {
                    too_big = true;
                    return false;
                }
                out.body.append(data, n);
                return true;
            });
        if (too_big) throw Error(Code::ModelLoadFailed, url.str() + " answered more than " +
                                                            std::to_string(kMaxTextBody >> 20) + " MiB");
        if (!res) throw NetworkError("GET " + url.str() + " failed: " + httplib::to_string(res.error()));
        if (!is_redirect(out.status) || out.header("location").empty()) return out;
        url = next_hop(url, out.header("location"), hops);
    }
}

HttpClient::Stream HttpClient::get_stream(const Url& first, uint64_t offset,
                                          const std::function<void(uint64_t, uint64_t)>& begin,
                                          const std::function<bool(const char*, size_t)>& sink) const {
    Url url = first;
    for (int hops = 0;;) {
        auto c = make_client(url, opt_);
        httplib::Headers h = request_headers(url, opt_);
        if (offset > 0) h.emplace("Range", "bytes=" + std::to_string(offset) + "-");
        Stream out;
        bool body = false, sink_stopped = false;
        auto res = c->Get(
            url.target, h,
            [&](const httplib::Response& r) {
                out.status = r.status;
                out.headers = lowered(r.headers);
                if (r.status == 200) {
                    uint64_t len = 0;
                    auto cl = r.get_header_value("Content-Length");
                    std::from_chars(cl.data(), cl.data() + cl.size(), len);
                    begin(0, len);
                    body = true;
                } else if (r.status == 206) {
                    auto range = parse_content_range(r.get_header_value("Content-Range"));
                    if (!range || range->start > offset)
                        return false;  // a range we did not ask for: status 206 without a body
                    begin(range->start, range->total);
                    body = true;
                }
                return body;  // redirects and errors: headers are enough
            },
            [&](const char* data, size_t n) {
                if (!sink(data, n)) sink_stopped = true;
                return !sink_stopped;
            });
        if (!res) {
            if (body && !sink_stopped) out.transport_error = httplib::to_string(res.error());
            else if (!body && out.status == 0)
                throw NetworkError("GET " + url.str() + " failed: " + httplib::to_string(res.error()));
            if (out.status == 206 && !body) out.transport_error = "the server answered a range that was not asked for";
        }
        auto loc = out.headers.find("location");
        if (!is_redirect(out.status) || loc == out.headers.end() || loc->second.empty()) return out;
        url = next_hop(url, loc->second, hops);
    }
}

}  // namespace eh::hub
