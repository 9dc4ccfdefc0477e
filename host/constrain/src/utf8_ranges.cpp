#include "utf8_ranges.hpp"

namespace eh::constrain::detail {
namespace {

int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void encode(uint32_t cp, uint8_t* b) {
    switch (utf8_len(cp)) {
    case 1: b[0] = uint8_t(cp); break;
    case 2: b[0] = uint8_t(0xC0 | (cp >> 6)); b[1] = uint8_t(0x80 | (cp & 0x3F)); break;
    case 3:
        b[0] = uint8_t(0xE0 | (cp >> 12)); b[1] = uint8_t(0x80 | ((cp >> 6) & 0x3F)); b[2] = uint8_t(0x80 | (cp & 0x3F));
        break;
    default:
        b[0] = uint8_t(0xF0 | (cp >> 18)); b[1] = uint8_t(0x80 | ((cp >> 12) & 0x3F));
        b[2] = uint8_t(0x80 | ((cp >> 6) & 0x3F)); b[3] = uint8_t(0x80 | (cp & 0x3F));
    }
}

// [lo, hi] of one encoded length: split until every byte position of the
// range's encodings is a contiguous interval independent of the others.
void split(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
    const int n = utf8_len(lo);
    for (int i = 1; i < n; ++i) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                split(lo, lo | m, out);
                split((lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                split(lo, (hi & ~m) - 1, out);
                split(hi & ~m, hi, out);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    encode(lo, a);
    encode(hi, b);
    ByteRangeSeq seq;
    for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
    out.push_back(std::move(seq));
}

}  // namespace

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo > hi) return;
    // Surrogates have no encoding; the length boundaries split the rest.
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
        if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
        return;
    }
    for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
        if (lo <= edge && hi > edge) {
            utf8_sequences(lo, edge, out);
            utf8_sequences(edge + 1, hi, out);
            return;
        }
    }
    split(lo, hi, out);
}

void append_utf8(std::string& out, uint32_t cp) {
    uint8_t b[4];
    encode(cp, b);
    out.append(reinterpret_cast<const char*>(b), size_t(utf8_len(cp)));
}

}  // namespace eh::constrain::detail
