#include "auth.hpp"

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "eh/error.hpp"
#include "web_assets.hpp"

namespace eh::http {
namespace {

std::array<unsigned char, 32> digest(std::string_view s) {
    std::array<unsigned char, 32> d{};
    SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
    return d;
}

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
    return true;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

}  // namespace

ApiKeys::ApiKeys(const std::vector<std::string>& keys) {
    for (const auto& k : keys) digests_.push_back(digest(k));
}

bool ApiKeys::accepts(std::string_view presented) const {
    if (presented.empty()) return false;
    const auto d = digest(presented);
    int match = 0;
    for (const auto& k : digests_) match |= CRYPTO_memcmp(d.data(), k.data(), d.size()) == 0;
    return match != 0;
}

Credentials parse_authorization(std::string_view authorization) {
    const std::string_view a = trim(authorization);
    size_t end = 0;
    while (end < a.size() && a[end] != ' ' && a[end] != '\t') ++end;
    return {a.substr(0, end), trim(a.substr(end))};
}

std::string_view presented_key(std::string_view authorization, std::string_view x_api_key) {
    const Credentials c = parse_authorization(authorization);
    if (iequals(c.scheme, "bearer") && !c.token.empty()) return c.token;
    return trim(x_api_key);
}

std::string request_key(const httplib::Request& req) {
    const bool anthropic = req.path.rfind("/v1/messages", 0) == 0;
    const std::string authorization = req.get_header_value("Authorization");
    const std::string x_api_key = anthropic ? req.get_header_value("x-api-key") : std::string();
    return std::string(presented_key(authorization, x_api_key));
}

std::string digest_hex(std::string_view s) {
    std::string hex;
    for (unsigned char b : digest(s)) hex += fmt::format("{:02x}", b);
    return hex;
}

std::string credential_identity(std::string_view authorization) {
    const Credentials c = parse_authorization(authorization);
    if (c.scheme.empty()) return "";
    std::string canonical;
    for (char ch : c.scheme) canonical += char(std::tolower(static_cast<unsigned char>(ch)));
    canonical += ' ';
    canonical += c.token;
    return digest_hex(canonical);
}

std::string credential_header_problem(const httplib::Request& req, bool x_api_key_accepted) {
    for (const char* name : {"Authorization", "x-api-key"}) {
        if (name[0] == 'x' && !x_api_key_accepted) continue;
        if (const size_t n = req.get_header_value_count(name); n > 1)
            return fmt::format("the request has {} {} headers; send one", n, name);
    }
    return "";
}

bool route_needs_key(std::string_view method, std::string_view path, bool metrics_require_key) {
    if (method == "OPTIONS") return false;
    if (path == "/health" || path == "/health/live" || path == "/health/ready") return false;  // probes
    if (path == "/metrics") return metrics_require_key;
    if (method == "GET" || method == "HEAD") {
        static const std::regex page(web::kRoutePattern);
        if (std::regex_match(path.begin(), path.end(), page)) return false;
    }
    return true;
}

std::string key_problem(std::string_view key) {
    if (key.empty()) return "an API key must not be empty";
    if (key.size() > 4096) return "an API key must be at most 4096 bytes";
    for (unsigned char c : key)
        if (c <= 0x20 || c >= 0x7f) return "an API key may hold printable ASCII only (no spaces or control characters)";
    return "";
}

std::vector<std::string> read_api_key_file(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
        throw Error(Code::InvalidRequest,
                    fmt::format("--api-key-file {}: {}", path,
                                std::filesystem::exists(path, ec) ? "not a regular file" : "no such file"));
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(Code::InvalidRequest, fmt::format("--api-key-file {}: cannot be read", path));
    std::vector<std::string> keys;
    std::string line;
    for (size_t n = 1; std::getline(f, line); ++n) {
        std::string_view k = trim(line);
        if (k.empty() || k.front() == '#') continue;
        if (std::string why = key_problem(k); !why.empty())
            throw Error(Code::InvalidRequest, fmt::format("--api-key-file {}, line {}: {}", path, n, why));
        keys.emplace_back(k);
    }
    if (keys.empty()) throw Error(Code::InvalidRequest, fmt::format("--api-key-file {}: holds no key", path));
    return keys;
}

}  // namespace eh::http
