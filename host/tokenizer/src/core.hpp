// The one Tokenizer implementation behind all backends. A loader (GGUF
// metadata or tokenizer.json) fills a CoreSpec; the pipeline is then
//   added-token split -> normalise -> pre-tokenise -> BPE or SPM -> ids
// and decoding is a per-token byte table plus the leading-space rule.
#pragma once

#include <array>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "eh/tokenizer/tokenizer.hpp"
#include "pretokenize.hpp"

namespace eh::tokenizer {

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TextIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

enum class ModelKind { Bpe, Spm };

// Where a "▁" prefix goes: never, on the first fragment and after each
// special token (llama.cpp's add_space_prefix), or on every non-empty
// fragment between added tokens (tokenizer.json's Prepend normaliser).
enum class SpacePrefix { None, FirstAndAfterSpecial, EveryFragment };

struct AddedToken {
    std::string text;
    int32_t id = -1;
    bool special = false;  // only matched with parse_special
    bool lstrip = false;   // swallows whitespace on its left
    bool rstrip = false;   // swallows whitespace on its right
};

struct CoreSpec {
    std::string kind;
    ModelKind model = ModelKind::Bpe;
    SplitPattern split = SplitPattern::None;
    bool byte_level = false;     // words go through the GPT-2 byte-to-char map
    bool nfc = false;
    bool escape_spaces = false;  // ' ' -> U+2581 before the model
    SpacePrefix prefix = SpacePrefix::None;
    bool ignore_merges = false;  // a word that is itself a token is not merged
    bool byte_fallback = false;  // unknown characters become <0xXX> tokens
    bool fuse_unk = false;
    bool strip_leading_space = false;  // decode() drops one leading space
    bool add_bos = false;
    bool add_eos = false;
    SpecialTokens special;
    std::string chat_template;

    std::vector<std::string> tokens;
    std::vector<TokenType> types;
    std::vector<float> scores;                                // SPM only
    std::vector<std::pair<std::string, std::string>> merges;  // BPE only, by rank
    std::vector<AddedToken> added;  // tokens matched in raw text before the model
};

class Core final : public Tokenizer {
public:
    explicit Core(CoreSpec spec);

    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override;
    std::vector<int32_t> encode_with_literals(std::string_view text, bool add_special,
                                              std::span<const Range> literal) const override;
    std::vector<std::string> special_texts() const override;
    std::string token_to_piece(int32_t id, bool include_special) const override;
    std::string decode(std::span<const int32_t> ids, bool include_special) const override;
    const std::string& token_text(int32_t id) const override;
    TokenType token_type(int32_t id) const override;
    std::optional<int32_t> token_id(std::string_view text) const override;
    size_t vocab_size() const override { return spec_.tokens.size(); }
    const SpecialTokens& special() const override { return spec_.special; }
    bool add_bos() const override { return spec_.add_bos; }
    bool add_eos() const override { return spec_.add_eos; }
    bool strips_leading_space() const override { return spec_.strip_leading_space; }
    std::string_view kind() const override { return spec_.kind; }
    bool is_eog(int32_t id) const override { return eog_.count(id) != 0; }
    const std::string& chat_template() const override { return spec_.chat_template; }

private:
    struct Merge {
        int32_t rank;
        int32_t result;
    };

    std::vector<int32_t> encode_impl(std::string_view text, bool add_special, bool parse_special,
                                     std::span<const Range> literal) const;
    void encode_fragment(std::string_view text, bool after_special, std::vector<int32_t>& out) const;
    void encode_word(std::string_view word, std::vector<int32_t>& out) const;
    void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
    void spm_word(std::string_view word, std::vector<int32_t>& out) const;
    void emit_unknown(std::string_view bytes, std::vector<int32_t>& out) const;
    const Merge* find_merge(int32_t left, int32_t right) const;

    CoreSpec spec_;
    TextIndex index_;
    std::unordered_map<uint64_t, Merge> merges_;
    std::array<int32_t, 256> byte_token_{};     // byte-level: byte -> token of its mapped char
    std::array<int32_t, 256> fallback_token_{};  // <0xXX> tokens
    std::vector<std::string> pieces_;           // decoded bytes of each token
    std::unordered_set<int32_t> eog_;
    // No token holds "▁" right after another character, so no merge can
    // cross such a point: SPM-style text is split there into cacheable words.
    bool split_before_metaspace_ = false;
    // Added tokens grouped by first byte, longest first: all of them, and
    // the ones matched even without parse_special.
    std::array<std::vector<int32_t>, 256> added_all_;
    std::array<std::vector<int32_t>, 256> added_plain_;

    // Words seen before, with their ids; most text repeats its words.
    mutable std::mutex cache_mu_;
    mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

// GPT-2's byte <-> printable character map.
const std::array<uint32_t, 256>& byte_to_char();
// Inverse: -1 for characters outside the map.
int byte_from_char(uint32_t cp);

}  // namespace eh::tokenizer
