#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "eh/image/image.hpp"

namespace eh::image {
namespace {

bool starts_with_ci(std::string_view s, std::string_view prefix) {
    if (s.size() < prefix.size()) return false;
    for (size_t i = 0; i < prefix.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
    return true;
}

std::string shown(std::string_view s) {
    std::string out;
    for (char c : s.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
    return s.size() > 40 ? out + "..." : out;
}

}  // namespace

std::string data_url_bytes(std::string_view url, const Limits& limits) {
    if (starts_with_ci(url, "http://") || starts_with_ci(url, "https://"))
        throw ImageError("remote image URLs are not fetched (the server never downloads): send the image inline as "
                         "a data URL, \"data:image/png;base64,...\"");
    if (!starts_with_ci(url, "data:"))
        throw ImageError("the image URL must be a data URL (\"data:image/png;base64,...\"); got \"" + shown(url) + "\"");
    const size_t comma = url.find(',');
    if (comma == std::string_view::npos) throw ImageError("the data URL has no ',' before its data");
    const std::string_view head = url.substr(5, comma - 5), body = url.substr(comma + 1);
    if (!starts_with_ci(head, "image/"))
        throw ImageError("the data URL's media type must be image/*; got \"" + shown(head) + "\"");
    if (head.size() < 7 || !starts_with_ci(head.substr(head.size() - 7), ";base64"))
        throw ImageError("the data URL must be base64 (\"data:image/png;base64,...\")");
    if (body.size() / 4 * 3 > limits.max_bytes + 2)
        throw ImageError("the image is larger than " + std::to_string(limits.max_bytes) + " bytes");
    if (body.empty()) throw ImageError("the data URL carries no data");
    if (body.size() % 4 != 0)
        throw ImageError("the data URL's base64 is " + std::to_string(body.size()) +
                         " characters, not a multiple of 4 (padded base64 is required)");
    std::string out(body.size() / 4 * 3, '\0');
    const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(body.data()), int(body.size()));
    // EVP_DecodeBlock skips surrounding blanks, which a strict decoder would
    // not: refuse them, and any character outside the alphabet.
    const bool clean = std::all_of(body.begin(), body.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/' || c == '=';
    });
    const size_t pad = body.back() == '=' ? (body[body.size() - 2] == '=' ? 2 : 1) : 0;
    const size_t eq = size_t(std::count(body.begin(), body.end(), '='));
    if (n < 0 || !clean || eq != pad || size_t(n) != out.size())
        throw ImageError("the data URL's base64 is invalid");
    out.resize(out.size() - pad);
    if (out.size() > limits.max_bytes)
        throw ImageError("the image is larger than " + std::to_string(limits.max_bytes) + " bytes");
    return out;
}

}  // namespace eh::image
