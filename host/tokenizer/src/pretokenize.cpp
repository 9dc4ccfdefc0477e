#include "pretokenize.hpp"

#include <string>

#include "unicode.hpp"

namespace eh::tokenizer {
namespace {

using namespace unicode;

const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kO200kRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The text as codepoints with their classes; index n is a sentinel.
struct Units {
    std::vector<uint32_t> cp;
    std::vector<uint8_t> cls;
    std::vector<uint32_t> off;  // byte offset of each unit, plus the end
    size_t n = 0;

    explicit Units(std::string_view s) {
        cp.reserve(s.size() + 1);
        cls.reserve(s.size() + 1);
        off.reserve(s.size() + 1);
        size_t i = 0;
        while (i < s.size()) {
            size_t len;
            const uint32_t c = decode_one(s, i, len);
            cp.push_back(c);
            cls.push_back(c == kInvalid ? kOther : classify(c));
            off.push_back(static_cast<uint32_t>(i));
            i += len;
        }
        n = cp.size();
        cp.push_back(0);
        cls.push_back(0);  // sentinel: belongs to no class
        off.push_back(static_cast<uint32_t>(s.size()));
    }

    bool L(size_t i) const { return i < n && is_letter(cls[i]); }
    bool N(size_t i) const { return i < n && cls[i] == kN; }
    bool S(size_t i) const { return i < n && cls[i] == kSpace; }
    bool NL(size_t i) const { return i < n && (cp[i] == '\r' || cp[i] == '\n'); }
    // [^\s\p{L}\p{N}]
    bool P(size_t i) const { return i < n && !is_letter(cls[i]) && cls[i] != kN && cls[i] != kSpace; }
    // [^\r\n\p{L}\p{N}]
    bool Q(size_t i) const { return i < n && !NL(i) && !is_letter(cls[i]) && cls[i] != kN; }
    // o200k: [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}]
    bool Up(size_t i) const {
        return i < n && (cls[i] == kLu || cls[i] == kLt || cls[i] == kLm || cls[i] == kLo || cls[i] == kM);
    }
    bool Lo(size_t i) const {
        return i < n && (cls[i] == kLl || cls[i] == kLm || cls[i] == kLo || cls[i] == kM);
    }

    template <class Pred>
    size_t run(size_t i, Pred pred) const {
        while (pred(i)) ++i;
        return i;
    }

    // 's|'t|'re|'ve|'m|'ll|'d at i; returns the end or 0.
    size_t contraction(size_t i, bool fold) const {
        if (i >= n || cp[i] != '\'') return 0;
        auto at = [&](size_t k) -> uint32_t {
            if (k >= n) return 0;
            uint32_t c = cp[k];
            if (fold && c >= 'A' && c <= 'Z') c += 32;
            return c;
        };
        const uint32_t a = at(i + 1);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        const uint32_t b = at(i + 2);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        return 0;
    }

    // \s*[\r\n]+ at i (0 when it fails): ends after the last newline of the run.
    size_t space_newlines(size_t i) const {
        const size_t j = run(i, [&](size_t k) { return S(k); });
        for (size_t k = j; k > i; --k)
            if (NL(k - 1)) return k;
        return 0;
    }

    // \s+(?!\S)|\s+ at i, which must be a space.
    size_t spaces(size_t i) const {
        const size_t j = run(i, [&](size_t k) { return S(k); });
        if (j == n || j - 1 == i) return j;
        return j - 1;
    }
};

size_t match_gpt2(const Units& u, size_t i) {
    if (size_t e = u.contraction(i, false)) return e;
    const bool sp = u.cp[i] == ' ';
    auto optional_space_run = [&](auto pred) -> size_t {
        if (sp && pred(i + 1)) return u.run(i + 1, pred);
        if (pred(i)) return u.run(i, pred);
        return 0;
    };
    if (size_t e = optional_space_run([&](size_t k) { return u.L(k); })) return e;
    if (size_t e = optional_space_run([&](size_t k) { return u.N(k); })) return e;
    if (size_t e = optional_space_run([&](size_t k) { return u.P(k); })) return e;
    return u.spaces(i);
}

// Llama 3 and Qwen2 differ only in how many digits one piece takes.
size_t match_llama3(const Units& u, size_t i, size_t max_digits) {
    if (size_t e = u.contraction(i, true)) return e;
    auto letters = [&](size_t k) { return u.L(k); };
    if (u.Q(i) && u.L(i + 1)) return u.run(i + 1, letters);
    if (u.L(i)) return u.run(i, letters);
    if (u.N(i)) {
        size_t e = i;
        while (e - i < max_digits && u.N(e)) ++e;
        return e;
    }
    auto punct = [&](size_t k) { return u.P(k); };
    auto nl = [&](size_t k) { return u.NL(k); };
    if (u.cp[i] == ' ' && u.P(i + 1)) return u.run(u.run(i + 1, punct), nl);
    if (u.P(i)) return u.run(u.run(i, punct), nl);
    if (size_t e = u.space_newlines(i)) return e;
    return u.spaces(i);
}

size_t o200k_tail(const Units& u, size_t e) {
    if (size_t c = u.contraction(e, true)) return c;
    return e;
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ at q, 0 on failure.
size_t o200k_body1(const Units& u, size_t q) {
    const size_t up_end = u.run(q, [&](size_t k) { return u.Up(k); });
    for (size_t k = up_end + 1; k-- > q;) {
        if (u.Lo(k)) return o200k_tail(u, u.run(k, [&](size_t m) { return u.Lo(m); }));
    }
    return 0;
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* at q, 0 on failure.
size_t o200k_body2(const Units& u, size_t q) {
    if (!u.Up(q)) return 0;
    const size_t up_end = u.run(q, [&](size_t k) { return u.Up(k); });
    return o200k_tail(u, u.run(up_end, [&](size_t m) { return u.Lo(m); }));
}

size_t match_o200k(const Units& u, size_t i) {
    for (auto body : {o200k_body1, o200k_body2}) {
        if (u.Q(i))
            if (size_t e = body(u, i + 1)) return e;
        if (size_t e = body(u, i)) return e;
    }
    if (u.N(i)) {
        size_t e = i;
        while (e - i < 3 && u.N(e)) ++e;
        return e;
    }
    auto punct = [&](size_t k) { return u.P(k); };
    auto tail = [&](size_t k) { return u.NL(k) || (k < u.n && u.cp[k] == '/'); };
    if (u.cp[i] == ' ' && u.P(i + 1)) return u.run(u.run(i + 1, punct), tail);
    if (u.P(i)) return u.run(u.run(i, punct), tail);
    if (size_t e = u.space_newlines(i)) return e;
    return u.spaces(i);
}

}  // namespace

std::optional<SplitPattern> pattern_from_regex(std::string_view regex) {
    if (regex == kGpt2Regex) return SplitPattern::Gpt2;
    if (regex == kLlama3Regex) return SplitPattern::Llama3;
    if (regex == kQwen2Regex) return SplitPattern::Qwen2;
    if (regex == kO200kRegex) return SplitPattern::O200k;
    return std::nullopt;
}

std::optional<SplitPattern> pattern_from_gguf_pre(std::string_view pre) {
    // Names as llama.cpp's converter writes them for these families.
    if (pre == "gpt-2" || pre == "gpt2" || pre == "default-bpe") return SplitPattern::Gpt2;
    if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return SplitPattern::Llama3;
    if (pre == "qwen2") return SplitPattern::Qwen2;
    if (pre == "gpt-4o" || pre == "o200k" || pre == "gpt-oss") return SplitPattern::O200k;
    return std::nullopt;
}

const char* pattern_name(SplitPattern p) {
    switch (p) {
        case SplitPattern::None: return "none";
        case SplitPattern::Gpt2: return "gpt-2";
        case SplitPattern::Llama3: return "llama-bpe";
        case SplitPattern::Qwen2: return "qwen2";
        case SplitPattern::O200k: return "o200k";
    }
    return "?";
}

void split_words(SplitPattern p, std::string_view text,
                 std::vector<std::pair<uint32_t, uint32_t>>& out) {
    if (text.empty()) return;
    if (p == SplitPattern::None) {
        out.emplace_back(0, static_cast<uint32_t>(text.size()));
        return;
    }
    const Units u(text);
    size_t i = 0;
    while (i < u.n) {
        size_t e = 0;
        switch (p) {
            case SplitPattern::Gpt2: e = match_gpt2(u, i); break;
            case SplitPattern::Llama3: e = match_llama3(u, i, 3); break;
            case SplitPattern::Qwen2: e = match_llama3(u, i, 1); break;
            case SplitPattern::O200k: e = match_o200k(u, i); break;
            case SplitPattern::None: break;
        }
        if (e <= i) e = i + 1;  // every unit belongs to some alternative; guard anyway
        out.emplace_back(u.off[i], u.off[e]);
        i = e;
    }
}

}  // namespace eh::tokenizer
