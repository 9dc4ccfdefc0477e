#include "eh/service/utf8.hpp"

#include <cstdint>

namespace eh::service {
namespace {

// Length of the valid sequence starting at s[i], 0 when invalid, or -n when
// the input ends after n bytes of a sequence that is valid so far.
int sequence_at(std::string_view s, size_t i) {
    auto b = [&](size_t k) { return uint8_t(s[k]); };
    uint8_t c = b(i);
    if (c < 0x80) return 1;
    int len;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (int k = 1; k < len; ++k) {
        if (i + k >= s.size()) return -k;
        uint8_t x = b(i + k);
        if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return 0;
    }
    return len;
}

}  // namespace

size_t complete_utf8_prefix(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        int n = sequence_at(s, i);
        if (n < 0) return i;
        i += n == 0 ? 1 : size_t(n);
    }
    return i;
}

std::string sanitize_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        int n = sequence_at(s, i);
        if (n > 0) {
            out.append(s.substr(i, size_t(n)));
            i += size_t(n);
        } else {
            out += "\xEF\xBF\xBD";
            i += n < 0 ? size_t(-n) : 1;
        }
    }
    return out;
}

bool is_valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        int n = sequence_at(s, i);
        if (n <= 0) return false;
        i += size_t(n);
    }
    return true;
}

size_t utf8_length(std::string_view s) {
    size_t count = 0;
    for (size_t i = 0; i < s.size(); ++count) {
        int n = sequence_at(s, i);
        i += n > 0 ? size_t(n) : (n < 0 ? size_t(-n) : 1);
    }
    return count;
}

}  // namespace eh::service
