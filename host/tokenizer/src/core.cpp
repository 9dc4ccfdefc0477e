#include "core.hpp"

#include <algorithm>
#include <queue>

#include "eh/error.hpp"
#include "unicode.hpp"

namespace eh::tokenizer {
namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581
constexpr size_t kMaxCachedWord = 64;
constexpr size_t kMaxCacheEntries = 1 << 16;

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// "<0x41>" -> 0x41, or -1.
int parse_byte_token(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    const int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (true) {
        const size_t j = s.find(from, i);
        if (j == std::string_view::npos) break;
        out.append(s.substr(i, j - i));
        out.append(to);
        i = j + from.size();
    }
    out.append(s.substr(i));
    return out;
}

// Byte-level text back to bytes; characters outside the map stay as UTF-8.
std::string unmap_byte_level(std::string_view t) {
    std::string out;
    size_t i = 0;
    while (i < t.size()) {
        size_t len;
        const uint32_t cp = unicode::decode_one(t, i, len);
        const int b = cp == unicode::kInvalid ? -1 : byte_from_char(cp);
        if (b >= 0) out += static_cast<char>(b);
        else out.append(t.substr(i, len));
        i += len;
    }
    return out;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_char() {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            t[b] = printable ? b : next++;
        }
        return t;
    }();
    return table;
}

int byte_from_char(uint32_t cp) {
    static const std::vector<int16_t> inverse = [] {
        std::vector<int16_t> v(512, -1);
        const auto& fwd = byte_to_char();
        for (int b = 0; b < 256; ++b) v[fwd[b]] = static_cast<int16_t>(b);
        return v;
    }();
    return cp < inverse.size() ? inverse[cp] : -1;
}

Core::Core(CoreSpec spec) : spec_(std::move(spec)) {
    const size_t n = spec_.tokens.size();
    if (n == 0) throw Error(Code::ModelLoadFailed, "tokenizer: empty vocabulary");
    spec_.types.resize(n, TokenType::Normal);
    if (spec_.model == ModelKind::Spm) spec_.scores.resize(n, 0.0f);

    index_.reserve(n);
    for (size_t i = 0; i < n; ++i)
        if (!spec_.tokens[i].empty()) index_.emplace(spec_.tokens[i], static_cast<int32_t>(i));

    fallback_token_.fill(-1);
    byte_token_.fill(-1);
    for (size_t i = 0; i < n; ++i) {
        if (spec_.types[i] == TokenType::Byte || (spec_.byte_fallback && spec_.types[i] == TokenType::Normal)) {
            const int b = parse_byte_token(spec_.tokens[i]);
            if (b >= 0 && fallback_token_[b] < 0) {
                fallback_token_[b] = static_cast<int32_t>(i);
                spec_.types[i] = TokenType::Byte;
            }
        }
    }
    if (spec_.byte_level) {
        for (int b = 0; b < 256; ++b) {
            std::string c;
            unicode::append_utf8(c, byte_to_char()[b]);
            if (auto it = index_.find(c); it != index_.end()) byte_token_[b] = it->second;
        }
    }

    // Merges whose parts are not tokens can never apply; they are dropped.
    merges_.reserve(spec_.merges.size());
    for (size_t r = 0; r < spec_.merges.size(); ++r) {
        const auto& [a, b] = spec_.merges[r];
        auto ia = index_.find(a), ib = index_.find(b), ic = index_.find(a + b);
        if (ia == index_.end() || ib == index_.end() || ic == index_.end()) continue;
        const uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
        merges_.emplace(key, Merge{static_cast<int32_t>(r), ic->second});
    }
    spec_.merges.clear();
    spec_.merges.shrink_to_fit();

    if (spec_.split == SplitPattern::None && (spec_.model == ModelKind::Spm || spec_.escape_spaces)) {
        split_before_metaspace_ = true;
        for (const auto& t : spec_.tokens) {
            for (size_t p = t.find(kMetaspace, 1); p != std::string::npos; p = t.find(kMetaspace, p + 1)) {
                if (p < kMetaspace.size() || t.compare(p - kMetaspace.size(), kMetaspace.size(), kMetaspace) != 0) {
                    split_before_metaspace_ = false;
                    break;
                }
            }
            if (!split_before_metaspace_) break;
        }
    }

    std::vector<bool> is_added(n, false);
    for (const auto& a : spec_.added)
        if (a.id >= 0 && static_cast<size_t>(a.id) < n) is_added[a.id] = true;

    pieces_.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const std::string& t = spec_.tokens[i];
        const TokenType ty = spec_.types[i];
        if (ty == TokenType::Byte) {
            pieces_[i] = std::string(1, static_cast<char>(parse_byte_token(t)));
        } else if (ty == TokenType::Control || ty == TokenType::UserDefined || ty == TokenType::Unknown || is_added[i]) {
            pieces_[i] = t;  // added tokens are stored as raw text
        } else if (spec_.byte_level) {
            pieces_[i] = unmap_byte_level(t);
        } else if (spec_.escape_spaces || spec_.model == ModelKind::Spm) {
            pieces_[i] = replace_all(t, kMetaspace, " ");
        } else {
            pieces_[i] = t;
        }
    }

    for (size_t k = 0; k < spec_.added.size(); ++k) {
        const auto& a = spec_.added[k];
        if (a.text.empty() || a.id < 0 || static_cast<size_t>(a.id) >= n) continue;
        const auto first = static_cast<uint8_t>(a.text[0]);
        added_all_[first].push_back(static_cast<int32_t>(k));
        if (!a.special) added_plain_[first].push_back(static_cast<int32_t>(k));
    }
    auto by_length = [&](int32_t x, int32_t y) { return spec_.added[x].text.size() > spec_.added[y].text.size(); };
    for (auto& v : added_all_) std::stable_sort(v.begin(), v.end(), by_length);
    for (auto& v : added_plain_) std::stable_sort(v.begin(), v.end(), by_length);

    if (spec_.special.eot < 0) {
        for (const char* s : {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|return|>", "<|end|>"})
            if (auto it = index_.find(s); it != index_.end()) { spec_.special.eot = it->second; break; }
    }
    for (int32_t id : {spec_.special.eos, spec_.special.eot})
        if (id >= 0) eog_.insert(id);
    // End-of-turn markers of known chat formats. gpt-oss ends a message of
    // another channel with <|end|> and goes on, so there only <|return|> and
    // <|call|> end generation.
    const bool harmony = index_.count("<|return|>") != 0;
    for (const char* s : {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
                          "<end_of_turn>", "<|return|>", "<|call|>", "<|end|>"}) {
        if (harmony && std::string_view(s) == "<|end|>") continue;
        if (auto it = index_.find(s); it != index_.end()) {
            const TokenType ty = spec_.types[it->second];
            if (ty == TokenType::Control || ty == TokenType::UserDefined) eog_.insert(it->second);
        }
    }
}

const std::string& Core::token_text(int32_t id) const {
    static const std::string empty;
    if (id < 0 || static_cast<size_t>(id) >= spec_.tokens.size()) return empty;
    return spec_.tokens[id];
}

TokenType Core::token_type(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= spec_.types.size()) return TokenType::Undefined;
    return spec_.types[id];
}

std::optional<int32_t> Core::token_id(std::string_view text) const {
    if (auto it = index_.find(text); it != index_.end()) return it->second;
    return std::nullopt;
}

std::string Core::token_to_piece(int32_t id, bool include_special) const {
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return {};
    if (!include_special && is_special(id)) return {};
    return pieces_[id];
}

std::string Core::decode(std::span<const int32_t> ids, bool include_special) const {
    std::string out;
    for (int32_t id : ids) {
        if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) continue;
        if (!include_special && is_special(id)) continue;
        out += pieces_[id];
    }
    if (spec_.strip_leading_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
}

std::vector<int32_t> Core::encode(std::string_view text, bool add_special, bool parse_special) const {
    return encode_impl(text, add_special, parse_special, {});
}

std::vector<int32_t> Core::encode_with_literals(std::string_view text, bool add_special,
                                                std::span<const Range> literal) const {
    return encode_impl(text, add_special, true, literal);
}

std::vector<std::string> Core::special_texts() const {
    std::vector<std::string> out;
    for (const auto& a : spec_.added)
        if (a.special && !a.text.empty() && a.id >= 0 && static_cast<size_t>(a.id) < spec_.tokens.size())
            out.push_back(a.text);
    return out;
}

std::vector<int32_t> Core::encode_impl(std::string_view text, bool add_special, bool parse_special,
                                       std::span<const Range> literal) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (add_special && spec_.add_bos && spec_.special.bos >= 0) out.push_back(spec_.special.bos);

    const auto& table = parse_special ? added_all_ : added_plain_;
    size_t frag_start = 0;  // start of the pending plain-text fragment
    size_t i = 0;
    bool after_special = true;  // the text start counts as "after a special token"
    bool strip_next = false;    // the last added token swallows following whitespace
    size_t lit = 0;             // the first literal range that does not end before i
    while (i < text.size()) {
        while (lit < literal.size() && literal[lit].second <= i) ++lit;
        const AddedToken* hit = nullptr;
        for (int32_t k : table[static_cast<uint8_t>(text[i])]) {
            const AddedToken& a = spec_.added[k];
            if (text.compare(i, a.text.size(), a.text) != 0) continue;
            if (a.special && lit < literal.size() && literal[lit].first < i + a.text.size()) continue;
            hit = &a;
            break;
        }
        if (!hit) { ++i; continue; }
        size_t frag_end = i;
        if (hit->lstrip)
            while (frag_end > frag_start && is_ascii_space(text[frag_end - 1])) --frag_end;
        if (strip_next)
            while (frag_start < frag_end && is_ascii_space(text[frag_start])) ++frag_start;
        if (frag_end > frag_start) encode_fragment(text.substr(frag_start, frag_end - frag_start), after_special, out);
        out.push_back(hit->id);
        after_special = true;
        strip_next = hit->rstrip;
        i += hit->text.size();
        frag_start = i;
    }
    if (strip_next)
        while (frag_start < text.size() && is_ascii_space(text[frag_start])) ++frag_start;
    if (frag_start < text.size()) encode_fragment(text.substr(frag_start), after_special, out);

    if (add_special && spec_.add_eos && spec_.special.eos >= 0) out.push_back(spec_.special.eos);
    return out;
}

void Core::encode_fragment(std::string_view text, bool after_special, std::vector<int32_t>& out) const {
    std::string norm;
    std::string_view s = text;
    if (spec_.nfc) {
        norm = unicode::nfc(s);
        s = norm;
    }
    const bool prefix = (spec_.prefix == SpacePrefix::EveryFragment && !s.empty()) ||
                        (spec_.prefix == SpacePrefix::FirstAndAfterSpecial && after_special);
    if (spec_.escape_spaces) {
        std::string esc = prefix ? std::string(kMetaspace) : std::string();
        esc += replace_all(s, " ", kMetaspace);
        norm = std::move(esc);
        s = norm;
    } else if (prefix) {
        norm = " " + std::string(s);
        s = norm;
    }

    if (split_before_metaspace_) {
        size_t start = 0;
        for (size_t p = s.find(kMetaspace, 1); p != std::string_view::npos; p = s.find(kMetaspace, p + 1)) {
            if (p >= kMetaspace.size() && s.compare(p - kMetaspace.size(), kMetaspace.size(), kMetaspace) == 0)
                continue;
            encode_word(s.substr(start, p - start), out);
            start = p;
        }
        encode_word(s.substr(start), out);
        return;
    }
    std::vector<std::pair<uint32_t, uint32_t>> words;
    split_words(spec_.split, s, words);
    for (const auto& [b, e] : words) encode_word(s.substr(b, e - b), out);
}

void Core::encode_word(std::string_view word, std::vector<int32_t>& out) const {
    const bool cacheable = word.size() <= kMaxCachedWord;
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mu_);
        if (auto it = cache_.find(word); it != cache_.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    const size_t before = out.size();
    if (spec_.model == ModelKind::Spm) spm_word(word, out);
    else bpe_word(word, out);
    if (cacheable) {
        std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
        std::lock_guard<std::mutex> lock(cache_mu_);
        if (cache_.size() >= kMaxCacheEntries) cache_.clear();
        cache_.emplace(std::string(word), std::move(ids));
    }
}

const Core::Merge* Core::find_merge(int32_t left, int32_t right) const {
    if (left < 0 || right < 0) return nullptr;
    auto it = merges_.find((uint64_t(uint32_t(left)) << 32) | uint32_t(right));
    return it == merges_.end() ? nullptr : &it->second;
}

void Core::emit_unknown(std::string_view bytes, std::vector<int32_t>& out) const {
    if (spec_.byte_fallback) {
        bool all = true;
        for (char c : bytes) all = all && fallback_token_[static_cast<uint8_t>(c)] >= 0;
        if (all) {
            for (char c : bytes) out.push_back(fallback_token_[static_cast<uint8_t>(c)]);
            return;
        }
    }
    const int32_t unk = spec_.special.unk;
    if (unk < 0) return;  // nothing can stand for it; dropped
    if (spec_.fuse_unk && !out.empty() && out.back() == unk) return;
    out.push_back(unk);
}

namespace {

struct Symbol {
    int32_t id;       // token id, or -1 for a character with no token
    int32_t prev;     // neighbour indices, -1 at the ends
    int32_t next;
    uint32_t begin;   // byte range in the word
    uint32_t end;
};

struct Candidate {
    double priority;  // smaller pops first
    int32_t left;
    int32_t left_id;
    int32_t right_id;
    uint32_t left_len;
    uint32_t right_len;
    bool operator>(const Candidate& o) const {
        return priority != o.priority ? priority > o.priority : left > o.left;
    }
};

using CandidateQueue = std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>>;

// One symbol per character of `word`, its id what id_of says of the
// character's bytes.
template <class F>
void char_symbols(std::string_view word, std::vector<Symbol>& sym, F id_of) {
    size_t i = 0;
    while (i < word.size()) {
        size_t len;
        unicode::decode_one(word, i, len);
        sym.push_back({id_of(word.substr(i, len)), 0, 0, uint32_t(i), uint32_t(i + len)});
        i += len;
    }
}

// Links the symbols into a list in their order; returns how many.
int32_t link(std::vector<Symbol>& sym) {
    const int32_t n = static_cast<int32_t>(sym.size());
    for (int32_t k = 0; k < n; ++k) {
        sym[k].prev = k - 1;
        sym[k].next = k + 1 < n ? k + 1 : -1;
    }
    return n;
}

// The symbol after sym[left] in the list; -1 at the end (and for left -1).
int32_t next_of(const std::vector<Symbol>& sym, int32_t left) { return left < 0 ? -1 : sym[left].next; }

// sym[left] takes in the symbol after it, which leaves the list (dead: id -2).
void absorb_next(std::vector<Symbol>& sym, int32_t left) {
    Symbol& l = sym[left];
    Symbol& r = sym[l.next];
    l.end = r.end;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = left;
    r.id = -2;
}

}  // namespace

void Core::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
    std::vector<Symbol> sym;
    sym.reserve(word.size());
    if (spec_.byte_level) {
        if (spec_.ignore_merges) {
            std::string mapped;
            for (char c : word) unicode::append_utf8(mapped, byte_to_char()[static_cast<uint8_t>(c)]);
            if (auto it = index_.find(mapped); it != index_.end()) {
                out.push_back(it->second);
                return;
            }
        }
        for (size_t i = 0; i < word.size(); ++i)
            sym.push_back({byte_token_[static_cast<uint8_t>(word[i])], 0, 0, uint32_t(i), uint32_t(i + 1)});
    } else {
        if (spec_.ignore_merges)
            if (auto it = index_.find(word); it != index_.end()) {
                out.push_back(it->second);
                return;
            }
        char_symbols(word, sym, [&](std::string_view c) {
            auto it = index_.find(c);
            return it == index_.end() ? -1 : it->second;
        });
    }
    const int32_t n = link(sym);

    CandidateQueue queue;
    auto consider = [&](int32_t left) {
        const int32_t right = next_of(sym, left);
        if (right < 0) return;
        if (const Merge* m = find_merge(sym[left].id, sym[right].id))
            queue.push({double(m->rank), left, sym[left].id, sym[right].id, 0, 0});
    };
    for (int32_t k = 0; k + 1 < n; ++k) consider(k);

    while (!queue.empty()) {
        const Candidate c = queue.top();
        queue.pop();
        Symbol& l = sym[c.left];
        if (l.id != c.left_id || l.next < 0) continue;  // stale
        Symbol& r = sym[l.next];
        if (r.id != c.right_id) continue;
        l.id = find_merge(c.left_id, c.right_id)->result;
        absorb_next(sym, c.left);
        consider(l.prev);
        consider(c.left);
    }

    for (int32_t k = 0; k >= 0 && k < n; k = sym[k].next) {
        if (sym[k].id >= 0) out.push_back(sym[k].id);
        else emit_unknown(word.substr(sym[k].begin, sym[k].end - sym[k].begin), out);
    }
}

void Core::spm_word(std::string_view word, std::vector<int32_t>& out) const {
    std::vector<Symbol> sym;
    sym.reserve(word.size());
    char_symbols(word, sym, [](std::string_view) { return 0; });
    const int32_t n = link(sym);

    // Highest score first; equal scores merge the leftmost pair first.
    CandidateQueue queue;
    auto consider = [&](int32_t left) {
        const int32_t right = next_of(sym, left);
        if (right < 0) return;
        const Symbol& l = sym[left];
        const Symbol& r = sym[right];
        auto it = index_.find(word.substr(l.begin, r.end - l.begin));
        if (it == index_.end()) return;
        queue.push({-double(spec_.scores[it->second]), left, 0, 0, l.end - l.begin, r.end - r.begin});
    };
    for (int32_t k = 0; k + 1 < n; ++k) consider(k);

    while (!queue.empty()) {
        const Candidate c = queue.top();
        queue.pop();
        Symbol& l = sym[c.left];
        if (l.id < 0 || l.next < 0 || l.end - l.begin != c.left_len) continue;  // stale
        Symbol& r = sym[l.next];
        if (r.end - r.begin != c.right_len) continue;
        absorb_next(sym, c.left);
        consider(l.prev);
        consider(c.left);
    }

    for (int32_t k = 0; k >= 0 && k < n; k = sym[k].next) {
        const std::string_view piece = word.substr(sym[k].begin, sym[k].end - sym[k].begin);
        if (auto it = index_.find(piece); it != index_.end()) {
            out.push_back(it->second);
            continue;
        }
        // SentencePiece byte fallback: every byte of the piece as <0xXX>.
        bool all = true;
        for (char ch : piece) all = all && fallback_token_[static_cast<uint8_t>(ch)] >= 0;
        if (all) {
            for (char ch : piece) out.push_back(fallback_token_[static_cast<uint8_t>(ch)]);
        } else if (spec_.special.unk >= 0) {
            out.push_back(spec_.special.unk);
        }
    }
}

}  // namespace eh::tokenizer
