#include "request_guard.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

namespace eh::http {
namespace {

std::string lower(std::string_view s) {
    std::string r(s);
    for (auto& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

bool all_digits(std::string_view s) {
    return !s.empty() && s.size() <= 5 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Splits "host[:port]" / "[v6][:port]"; false when the form is wrong.
bool split_host_port(std::string_view hp, std::string& host) {
    if (hp.empty()) return false;
    if (hp.front() == '[') {
        size_t close = hp.find(']');
        if (close == std::string_view::npos) return false;
        host = lower(hp.substr(0, close + 1));
        std::string_view rest = hp.substr(close + 1);
        return rest.empty() || (rest.front() == ':' && all_digits(rest.substr(1)));
    }
    size_t colon = hp.find(':');
    host = lower(hp.substr(0, colon));
    if (host.empty()) return false;
    return colon == std::string_view::npos || all_digits(hp.substr(colon + 1));
}

bool ip_literal(const std::string& host) {
    unsigned char buf[16];
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
        return ::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1;
    return ::inet_pton(AF_INET, host.c_str(), buf) == 1;
}

}  // namespace

bool local_origin(std::string_view origin) {
    std::string o = lower(origin);
    std::string_view rest;
    if (o.rfind("http://", 0) == 0) rest = std::string_view(o).substr(7);
    else if (o.rfind("https://", 0) == 0) rest = std::string_view(o).substr(8);
    else return false;
    if (rest.find_first_of("/@?#") != std::string_view::npos) return false;
    std::string host;
    if (!split_host_port(rest, host)) return false;
    return host == "localhost" || host == "127.0.0.1" || host == "[::1]";
}

bool host_allowed(std::string_view host_header, const std::string& bound_host, const std::vector<std::string>& allowed) {
    std::string host;
    if (!split_host_port(host_header, host)) return false;
    if (host == "localhost" || ip_literal(host)) return true;
    std::string bound = lower(bound_host);
    if (host == bound || host == "[" + bound + "]") return true;
    for (const auto& a : allowed)
        if (a == "*" || lower(a) == host) return true;
    return false;
}

namespace {

// "Text/Plain; charset=x" -> "text/plain".
std::string media_type(std::string_view content_type) {
    std::string t = lower(content_type.substr(0, content_type.find(';')));
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.erase(0, 1);
    return t;
}

}  // namespace

bool form_content_type(std::string_view content_type) {
    return media_type(content_type) == "application/x-www-form-urlencoded";
}

bool cross_site_form_post(std::string_view content_type, bool has_origin) {
    std::string t = media_type(content_type);
    if (t == "text/plain" || t == "multipart/form-data") return true;
    return t == "application/x-www-form-urlencoded" && has_origin;
}

}  // namespace eh::http
