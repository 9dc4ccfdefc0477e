#include "unicode.hpp"

#include <array>
#include <memory>

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

namespace eh::tokenizer::unicode {
namespace {

Cls classify_icu(UChar32 cp) {
    if (u_isUWhiteSpace(cp)) return kSpace;
    switch (u_charType(cp)) {
        case U_UPPERCASE_LETTER: return kLu;
        case U_LOWERCASE_LETTER: return kLl;
        case U_TITLECASE_LETTER: return kLt;
        case U_MODIFIER_LETTER: return kLm;
        case U_OTHER_LETTER: return kLo;
        case U_NON_SPACING_MARK:
        case U_COMBINING_SPACING_MARK:
        case U_ENCLOSING_MARK: return kM;
        case U_DECIMAL_DIGIT_NUMBER:
        case U_LETTER_NUMBER:
        case U_OTHER_NUMBER: return kN;
        default: return kOther;
    }
}

// One byte per codepoint (1.1 MB), filled once: the splitters classify every
// character of every request, and a table lookup keeps that off ICU's path.
struct Table {
    std::unique_ptr<uint8_t[]> cls{new uint8_t[0x110000]};
    Table() {
        for (UChar32 cp = 0; cp < 0x110000; ++cp) cls[cp] = classify_icu(cp);
    }
};

const Table& table() {
    static const Table t;
    return t;
}

}  // namespace

Cls classify(uint32_t cp) {
    if (cp >= 0x110000) return kOther;
    return static_cast<Cls>(table().cls[cp]);
}

uint32_t decode_one(std::string_view s, size_t i, size_t& len) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    len = 1;
    if (b0 < 0x80) return b0;
    int n;
    uint32_t cp;
    uint32_t min;
    if ((b0 & 0xE0) == 0xC0) { n = 2; cp = b0 & 0x1F; min = 0x80; }
    else if ((b0 & 0xF0) == 0xE0) { n = 3; cp = b0 & 0x0F; min = 0x800; }
    else if ((b0 & 0xF8) == 0xF0) { n = 4; cp = b0 & 0x07; min = 0x10000; }
    else return kInvalid;
    if (i + n > s.size()) return kInvalid;
    for (int k = 1; k < n; ++k) {
        const auto b = static_cast<uint8_t>(s[i + k]);
        if ((b & 0xC0) != 0x80) return kInvalid;
        cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalid;
    len = static_cast<size_t>(n);
    return cp;
}

int utf8_prefix_state(std::string_view s, size_t i) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    if (b0 < 0x80) return 1;
    int n;
    if (b0 >= 0xC2 && b0 <= 0xDF) n = 2;
    else if ((b0 & 0xF0) == 0xE0) n = 3;
    else if (b0 >= 0xF0 && b0 <= 0xF4) n = 4;
    else return 0;
    // Second-byte ranges that rule out overlongs, surrogates and > U+10FFFF.
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 == 0xE0) lo = 0xA0;
    else if (b0 == 0xED) hi = 0x9F;
    else if (b0 == 0xF0) lo = 0x90;
    else if (b0 == 0xF4) hi = 0x8F;
    for (int k = 1; k < n; ++k) {
        if (i + k >= s.size()) return -1;
        const auto b = static_cast<uint8_t>(s[i + k]);
        if (k == 1 ? (b < lo || b > hi) : ((b & 0xC0) != 0x80)) return 0;
    }
    return n;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

namespace {

void nfc_valid_run(const icu::Normalizer2& norm, std::string_view run, std::string& out) {
    // Pure ASCII is always NFC; most text takes this exit.
    bool ascii = true;
    for (char c : run)
        if (static_cast<uint8_t>(c) >= 0x80) { ascii = false; break; }
    if (ascii) { out.append(run); return; }
    UErrorCode err = U_ZERO_ERROR;
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(
        icu::StringPiece(run.data(), static_cast<int32_t>(run.size())));
    if (norm.isNormalized(u, err) && U_SUCCESS(err)) { out.append(run); return; }
    err = U_ZERO_ERROR;
    const icu::UnicodeString n = norm.normalize(u, err);
    if (U_FAILURE(err)) { out.append(run); return; }
    n.toUTF8String(out);
}

}  // namespace

std::string nfc(std::string_view s) {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* norm = icu::Normalizer2::getNFCInstance(err);
    if (U_FAILURE(err) || norm == nullptr) return std::string(s);
    std::string out;
    out.reserve(s.size());
    size_t run_start = 0, i = 0;
    while (i < s.size()) {
        size_t len;
        if (decode_one(s, i, len) == kInvalid) {
            nfc_valid_run(*norm, s.substr(run_start, i - run_start), out);
            out += s[i];
            run_start = i + 1;
        }
        i += len;
    }
    nfc_valid_run(*norm, s.substr(run_start), out);
    return out;
}

}  // namespace eh::tokenizer::unicode
