// GGUF tokenizer.* metadata -> CoreSpec. Key names and token types follow
// GGUF; defaults follow what llama.cpp assumes when a key is absent.
#include <cstring>

#include "core.hpp"
#include "eh/error.hpp"

namespace eh::tokenizer {
namespace {

std::string_view sv(const eh_string& s) { return {s.data ? s.data : "", static_cast<size_t>(s.size)}; }

class Meta {
public:
    explicit Meta(const eh_model_view& v) : v_(v) {}

    const eh_value* find(std::string_view key) const {
        for (uint64_t i = 0; i < v_.n_metadata; ++i)
            if (sv(v_.metadata[i].key) == key) return &v_.metadata[i].value;
        return nullptr;
    }

    std::optional<std::string_view> str(std::string_view key) const {
        const eh_value* v = find(key);
        if (!v) return std::nullopt;
        if (v->type != EH_VALUE_STRING) fail(key, "is not a string");
        return sv(v->v.str);
    }

    std::optional<bool> boolean(std::string_view key) const {
        const eh_value* v = find(key);
        if (!v) return std::nullopt;
        switch (v->type) {
            case EH_VALUE_BOOL: case EH_VALUE_U8: case EH_VALUE_U16: case EH_VALUE_U32: case EH_VALUE_U64:
                return v->v.u64 != 0;
            case EH_VALUE_I8: case EH_VALUE_I16: case EH_VALUE_I32: case EH_VALUE_I64:
                return v->v.i64 != 0;
            default: fail(key, "is not a boolean");
        }
    }

    // A token id; absent, negative, 0xFFFFFFFF or out of range mean "none".
    int32_t token_id(std::string_view key, size_t n_vocab, int32_t fallback = -1) const {
        const eh_value* v = find(key);
        if (!v) return fallback;
        int64_t id;
        switch (v->type) {
            case EH_VALUE_U8: case EH_VALUE_U16: case EH_VALUE_U32: case EH_VALUE_U64:
                id = v->v.u64 > uint64_t(INT32_MAX) ? -1 : int64_t(v->v.u64); break;
            case EH_VALUE_I8: case EH_VALUE_I16: case EH_VALUE_I32: case EH_VALUE_I64:
                id = v->v.i64; break;
            default: fail(key, "is not an integer");
        }
        return id >= 0 && id < int64_t(n_vocab) ? int32_t(id) : -1;
    }

    const eh_value* array(std::string_view key, uint32_t elem_type_class) const {
        const eh_value* v = find(key);
        if (!v) return nullptr;
        if (v->type != EH_VALUE_ARRAY) fail(key, "is not an array");
        if (v->count > 0 && v->v.array == nullptr) fail(key, "has no data");
        if (elem_type_class == EH_VALUE_STRING && v->elem_type != EH_VALUE_STRING) fail(key, "is not an array of strings");
        return v;
    }

    // Element i of a numeric array as double, whatever its stored type.
    static double number_at(const eh_value& a, uint64_t i) {
        const void* p = a.v.array;
        switch (a.elem_type) {
            case EH_VALUE_U8: case EH_VALUE_BOOL: return static_cast<const uint8_t*>(p)[i];
            case EH_VALUE_I8: return static_cast<const int8_t*>(p)[i];
            case EH_VALUE_U16: return static_cast<const uint16_t*>(p)[i];
            case EH_VALUE_I16: return static_cast<const int16_t*>(p)[i];
            case EH_VALUE_U32: return static_cast<const uint32_t*>(p)[i];
            case EH_VALUE_I32: return static_cast<const int32_t*>(p)[i];
            case EH_VALUE_F32: return static_cast<const float*>(p)[i];
            case EH_VALUE_U64: return double(static_cast<const uint64_t*>(p)[i]);
            case EH_VALUE_I64: return double(static_cast<const int64_t*>(p)[i]);
            case EH_VALUE_F64: return static_cast<const double*>(p)[i];
            default: return 0;
        }
    }

    static bool numeric(uint32_t t) { return t <= EH_VALUE_BOOL || (t >= EH_VALUE_U64 && t <= EH_VALUE_F64); }

    [[noreturn]] static void fail(std::string_view key, std::string_view what) {
        throw Error(Code::ModelLoadFailed, "tokenizer: metadata '" + std::string(key) + "' " + std::string(what));
    }

private:
    const eh_model_view& v_;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_view(const eh_model_view& view) {
    const Meta meta(view);
    const auto model = meta.str("tokenizer.ggml.model");
    if (!model) throw Error(Code::ModelLoadFailed, "tokenizer: missing metadata 'tokenizer.ggml.model'");

    CoreSpec spec;
    if (*model == "gpt2") {
        spec.kind = "gguf-bpe";
        spec.model = ModelKind::Bpe;
        spec.byte_level = true;
        const std::string pre(meta.str("tokenizer.ggml.pre").value_or("default"));
        auto pattern = pre == "default" ? std::optional(SplitPattern::Gpt2) : pattern_from_gguf_pre(pre);
        if (!pattern)
            throw Error(Code::ModelLoadFailed, "tokenizer: unsupported tokenizer.ggml.pre '" + pre +
                                                   "' (supported: gpt-2, llama-bpe, qwen2, gpt-4o)");
        spec.split = *pattern;
        spec.ignore_merges = *pattern == SplitPattern::Llama3 || *pattern == SplitPattern::O200k;
        spec.nfc = *pattern == SplitPattern::Qwen2;  // Qwen2's tokenizer.json normalises to NFC
    } else if (*model == "llama") {
        spec.kind = "gguf-spm";
        spec.model = ModelKind::Spm;
        spec.escape_spaces = true;
        spec.byte_fallback = true;
        const bool prefix = meta.boolean("tokenizer.ggml.add_space_prefix").value_or(true);
        spec.prefix = prefix ? SpacePrefix::FirstAndAfterSpecial : SpacePrefix::None;
        spec.strip_leading_space = prefix;
    } else {
        throw Error(Code::ModelLoadFailed,
                    "tokenizer: unsupported tokenizer.ggml.model '" + std::string(*model) + "' (supported: gpt2, llama)");
    }

    const eh_value* tokens = meta.array("tokenizer.ggml.tokens", EH_VALUE_STRING);
    if (!tokens || tokens->count == 0) throw Error(Code::ModelLoadFailed, "tokenizer: missing metadata 'tokenizer.ggml.tokens'");
    const size_t n = tokens->count;
    const auto* tok = static_cast<const eh_string*>(tokens->v.array);
    spec.tokens.reserve(n);
    for (size_t i = 0; i < n; ++i) spec.tokens.emplace_back(sv(tok[i]));

    if (const eh_value* types = meta.array("tokenizer.ggml.token_type", EH_VALUE_I32)) {
        if (types->count != n || !Meta::numeric(types->elem_type))
            Meta::fail("tokenizer.ggml.token_type", "does not hold one number per token");
        spec.types.resize(n);
        for (size_t i = 0; i < n; ++i) {
            const double t = Meta::number_at(*types, i);
            spec.types[i] = t >= 1 && t <= 6 ? static_cast<TokenType>(int(t)) : TokenType::Normal;
        }
    }
    if (spec.model == ModelKind::Spm) {
        const eh_value* scores = meta.array("tokenizer.ggml.scores", EH_VALUE_F32);
        if (!scores) throw Error(Code::ModelLoadFailed, "tokenizer: missing metadata 'tokenizer.ggml.scores'");
        if (scores->count != n || !Meta::numeric(scores->elem_type))
            Meta::fail("tokenizer.ggml.scores", "does not hold one number per token");
        spec.scores.resize(n);
        for (size_t i = 0; i < n; ++i) spec.scores[i] = static_cast<float>(Meta::number_at(*scores, i));
    } else {
        const eh_value* merges = meta.array("tokenizer.ggml.merges", EH_VALUE_STRING);
        if (!merges) throw Error(Code::ModelLoadFailed, "tokenizer: missing metadata 'tokenizer.ggml.merges'");
        const auto* m = static_cast<const eh_string*>(merges->v.array);
        spec.merges.reserve(merges->count);
        for (uint64_t i = 0; i < merges->count; ++i) {
            const std::string_view s = sv(m[i]);
            const size_t sp = s.find(' ', 1);  // the left part may itself start with a space
            if (sp == std::string_view::npos) Meta::fail("tokenizer.ggml.merges", "has an entry without a space");
            spec.merges.emplace_back(std::string(s.substr(0, sp)), std::string(s.substr(sp + 1)));
        }
    }

    const bool spm = spec.model == ModelKind::Spm;
    spec.special.bos = meta.token_id("tokenizer.ggml.bos_token_id", n, spm ? 1 : -1);
    spec.special.eos = meta.token_id("tokenizer.ggml.eos_token_id", n, spm ? 2 : -1);
    spec.special.unk = meta.token_id("tokenizer.ggml.unknown_token_id", n, spm ? 0 : -1);
    spec.special.pad = meta.token_id("tokenizer.ggml.padding_token_id", n);
    spec.special.eot = meta.token_id("tokenizer.ggml.eot_token_id", n);
    spec.add_bos = meta.boolean("tokenizer.ggml.add_bos_token").value_or(spm);
    spec.add_eos = meta.boolean("tokenizer.ggml.add_eos_token").value_or(false);
    if (auto t = meta.str("tokenizer.chat_template")) spec.chat_template = std::string(*t);

    // Control, user-defined and unknown tokens are matched in raw text
    // before the model runs, as whole units.
    if (!spec.types.empty()) {
        for (size_t i = 0; i < n; ++i) {
            const TokenType t = spec.types[i];
            if (t != TokenType::Control && t != TokenType::UserDefined && t != TokenType::Unknown) continue;
            AddedToken a;
            a.text = spec.tokens[i];
            a.id = static_cast<int32_t>(i);
            a.special = t != TokenType::UserDefined;
            spec.added.push_back(std::move(a));
        }
    }
    return std::make_unique<Core>(std::move(spec));
}

}  // namespace eh::tokenizer
