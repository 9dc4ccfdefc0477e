// Text <-> token ids for every model the host serves. The host owns all text:
// plugins see only ids. One interface, three backends:
//   "gguf-bpe"  byte-level BPE from GGUF metadata (tokenizer.ggml.model=gpt2)
//   "gguf-spm"  SentencePiece-style from GGUF metadata (tokenizer.ggml.model=llama)
//   "hf-json"   a Hugging Face tokenizer.json (BPE model)
// A Tokenizer is immutable after loading and safe to use from many threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace eh::tokenizer {

// Token types, numbered as GGUF's tokenizer.ggml.token_type.
enum class TokenType : uint8_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,      // special tokens: <s>, <|im_end|>, ... (matched only with parse_special)
    UserDefined = 4,  // added tokens that are always matched as a whole
    Unused = 5,
    Byte = 6,         // <0xXX> byte-fallback tokens
};

// Ids of the special tokens; -1 where the vocabulary has none.
struct SpecialTokens {
    int32_t bos = -1;
    int32_t eos = -1;
    int32_t eot = -1;  // end of turn (<|im_end|>, <|end|>, <|eot_id|>, ...)
    int32_t pad = -1;
    int32_t unk = -1;
};

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    // Text to ids. add_special: prepend BOS when the model wants one
    // (add_bos()) and append EOS when its metadata asks for that.
    // parse_special: exact occurrences of control-token strings in `text`
    // ("<|im_start|>") become their ids; when false they are encoded as plain
    // text. User-defined added tokens are always matched. Never throws on
    // any byte string (invalid UTF-8 and NULs included).
    virtual std::vector<int32_t> encode(std::string_view text, bool add_special,
                                        bool parse_special) const = 0;

    // Byte range [first, second) of a text.
    using Range = std::pair<size_t, size_t>;
    // encode(text, add_special, true), except that control-token text that
    // overlaps a range of `literal` (sorted, not overlapping) is plain text:
    // a chat template's own markup becomes ids, the messages' text does not.
    virtual std::vector<int32_t> encode_with_literals(std::string_view text, bool add_special,
                                                      std::span<const Range> literal) const = 0;
    // The texts encode() turns into ids only with parse_special.
    virtual std::vector<std::string> special_texts() const = 0;

    // The bytes one token stands for (for SPM, "▁" is already a space and
    // <0xXX> is that byte). Control tokens give their text when
    // include_special, else "". May be an incomplete UTF-8 sequence.
    // An id out of range gives "".
    virtual std::string token_to_piece(int32_t id, bool include_special = true) const = 0;

    // Ids to text: the concatenated pieces, minus the leading space that an
    // SPM-style model's prefix added. Control tokens are left out unless
    // include_special. The result is raw bytes and may be invalid UTF-8 if
    // the ids split a character; use StreamDecoder for user-facing text.
    virtual std::string decode(std::span<const int32_t> ids, bool include_special = false) const = 0;

    // The vocabulary entry as stored (byte-level or "▁" form); "" out of range.
    virtual const std::string& token_text(int32_t id) const = 0;
    virtual TokenType token_type(int32_t id) const = 0;
    // The id whose stored text is exactly `text`.
    virtual std::optional<int32_t> token_id(std::string_view text) const = 0;

    virtual size_t vocab_size() const = 0;
    virtual const SpecialTokens& special() const = 0;
    virtual bool add_bos() const = 0;
    virtual bool add_eos() const = 0;
    // True if decode() drops one leading space (SPM add_space_prefix).
    virtual bool strips_leading_space() const = 0;
    // "gguf-bpe", "gguf-spm" or "hf-json".
    virtual std::string_view kind() const = 0;
    // Does generation end at this token (EOS, EOT, EOM and the end-of-turn
    // control tokens of known chat formats)?
    virtual bool is_eog(int32_t id) const = 0;
    // A token that encode() emits only for special text (control/unknown).
    bool is_special(int32_t id) const {
        const TokenType t = token_type(id);
        return t == TokenType::Control || t == TokenType::Unknown;
    }
    // tokenizer.chat_template from GGUF, or the chat template found beside a
    // tokenizer.json (tokenizer_config.json "chat_template" or
    // chat_template.jinja); "" if none.
    virtual const std::string& chat_template() const = 0;

    // Loads from GGUF tokenizer.* metadata (format-independent: a view
    // built from a Hugging Face directory carries the same keys).
    // Throws eh::Error(ModelLoadFailed) naming the missing or bad key.
    static std::unique_ptr<Tokenizer> from_view(const eh_model_view& view);

    // Loads a tokenizer.json, given the file or the directory holding it.
    // tokenizer_config.json beside it supplies BOS/EOS/PAD, add_bos_token
    // and the chat template when present.
    static std::unique_ptr<Tokenizer> from_hf_json(const std::filesystem::path& path);
};

// Picks the backend: the Hugging Face directory's tokenizer.json when
// hf_dir is given and holds one, else the GGUF metadata of the view.
std::unique_ptr<Tokenizer> load_tokenizer(const eh_model_view& view,
                                          const std::optional<std::filesystem::path>& hf_dir = std::nullopt);

}  // namespace eh::tokenizer
