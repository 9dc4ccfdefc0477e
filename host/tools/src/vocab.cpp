#include "eh/tools/vocab.hpp"

#include <cctype>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "eh/error.hpp"
#include "eh/file_text.hpp"

namespace eh::tools {

namespace fs = std::filesystem;
using model::GgufValue;

namespace {

// llama.cpp token types
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

bool looks_special(const std::string& t) {
    if (t.size() >= 4 && t.rfind("<|", 0) == 0 && t.compare(t.size() - 2, 2, "|>") == 0) return true;
    return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]";
}

void put(std::vector<std::pair<std::string, GgufValue>>& kv, const std::string& key, GgufValue v) {
    for (auto& [k, old] : kv)
        if (k == key) { old = std::move(v); return; }
    kv.emplace_back(key, std::move(v));
}

Vocab from_gguf(const std::string& path) {
    auto mf = model::ModelFile::open(path);
    Vocab v;
    v.source = path;
    for (const auto& kv : mf->metadata()) {
        const std::string key(model::to_sv(kv.key));
        if (key.rfind("tokenizer.", 0) != 0) continue;
        v.kv.emplace_back(key, to_gguf_value(kv.value));
    }
    v.n_tokens = mf->get_string_array("tokenizer.ggml.tokens").size();
    if (v.n_tokens == 0) throw Error(Code::ModelLoadFailed, fmt::format("'{}' has no tokenizer.ggml.tokens", path));
    return v;
}

// tokenizer_config.json beside tokenizer.json, or null.
nlohmann::json tokenizer_config(const fs::path& dir) {
    if (!fs::exists(dir / "tokenizer_config.json")) return nullptr;
    try {
        return nlohmann::json::parse(read_text_file(dir / "tokenizer_config.json"));
    } catch (const nlohmann::json::exception&) {
        return nullptr;  // a broken config only costs the template and flags
    }
}

// A special token of tokenizer_config.json ("<s>" or {"content": "<s>"}).
std::string config_token(const nlohmann::json& cfg, const char* key) {
    if (!cfg.is_object() || !cfg.contains(key)) return "";
    const auto& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return "";
}

bool is_byte_token(const std::string& t) {
    return t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
           std::isxdigit(static_cast<unsigned char>(t[4]));
}

// A SentencePiece-style BPE (Llama 2, Phi-3, Mistral): "▁" for spaces and
// <0xXX> byte fallback instead of GPT-2's byte-to-unicode mapping.
bool is_spm_style(const nlohmann::json& j) {
    const auto& model = j["model"];
    if (!model.value("byte_fallback", false)) return false;
    const std::string dump = j.value("pre_tokenizer", nlohmann::json()).dump();
    return dump.find("ByteLevel") == std::string::npos;
}

// Whether the normalizer / pre-tokenizer puts "▁" before the text.
bool adds_space_prefix(const nlohmann::json& j) {
    bool prefix = false;
    std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& n) {
        if (n.is_array()) {
            for (const auto& x : n) walk(x);
            return;
        }
        if (!n.is_object()) return;
        const std::string type = n.value("type", "");
        if (type == "Prepend" && n.value("prepend", "") == "\xE2\x96\x81") prefix = true;
        if (type == "Metaspace") {
            if (n.contains("prepend_scheme")) prefix = n["prepend_scheme"] != "never";
            else prefix = n.value("add_prefix_space", true);
        }
        for (const char* k : {"normalizers", "pretokenizers"})
            if (n.contains(k)) walk(n[k]);
    };
    walk(j.value("normalizer", nlohmann::json()));
    walk(j.value("pre_tokenizer", nlohmann::json()));
    return prefix;
}

// What a tokenizer.json lists: its tokens by id (added ones flagged special
// or not), the BPE merges, the unknown token.
struct JsonTokens {
    std::unordered_map<int64_t, std::string> by_id;
    std::unordered_map<int64_t, bool> added_special;
    int64_t max_id = -1;
    std::vector<std::string> merges;
    std::string unk;
};

JsonTokens read_json_tokens(const nlohmann::json& j, const nlohmann::json& model, const std::string& path) {
    JsonTokens t;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        if (!it.value().is_number_integer()) throw Error(Code::ModelLoadFailed, fmt::format("'{}': token '{}' has no integer id", path, it.key()));
        const int64_t id = it.value().get<int64_t>();
        if (id < 0 || id > (1 << 24)) throw Error(Code::ModelLoadFailed, fmt::format("'{}': token id {} out of range", path, id));
        t.by_id[id] = it.key();
        t.max_id = std::max(t.max_id, id);
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
        for (const auto& a : j["added_tokens"]) {
            const int64_t id = a.value("id", int64_t(-1));
            if (id < 0 || id > (1 << 24)) continue;
            t.by_id[id] = a.value("content", "");
            t.added_special[id] = a.value("special", false);
            t.max_id = std::max(t.max_id, id);
        }
    }
    if (model.contains("merges") && model["merges"].is_array()) {
        t.merges.reserve(model["merges"].size());
        for (const auto& m : model["merges"]) {
            if (m.is_string()) t.merges.push_back(m.get<std::string>());
            else if (m.is_array() && m.size() == 2) t.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
        }
    }
    t.unk = model.contains("unk_token") && model["unk_token"].is_string() ? model["unk_token"].get<std::string>() : "";
    return t;
}

// SentencePiece merges the adjacent pair whose result scores highest;
// scoring each token by minus the rank of the first BPE merge that makes it
// gives the BPE merge order.
std::vector<float> spm_scores(const std::vector<std::string>& merges, const std::vector<std::string>& tokens,
                              const std::vector<int32_t>& types) {
    std::unordered_map<std::string, float> rank;
    for (size_t r = 0; r < merges.size(); ++r) {
        const size_t sp = merges[r].find(' ', 1);
        if (sp == std::string::npos) continue;
        std::string joined = merges[r].substr(0, sp) + merges[r].substr(sp + 1);
        rank.emplace(std::move(joined), -static_cast<float>(r));
    }
    std::vector<float> scores(tokens.size(), 0.0f);
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (types[i] == kControl || types[i] == kUserDefined || types[i] == kUnknown || types[i] == kUnused) scores[i] = -1000.0f;
        else if (auto it = rank.find(tokens[i]); it != rank.end()) scores[i] = it->second;
    }
    return scores;
}

// Special tokens and flags from tokenizer_config.json (config.json's ids,
// passed as `extra`, win), and the chat template: chat_template.jinja beside
// the file, else tokenizer_config.json's.
void add_config_keys(Vocab& v, const fs::path& dir, const nlohmann::json& tcfg,
                     const std::unordered_map<int64_t, std::string>& by_id) {
    for (auto [key, gkey] : {std::pair{"bos_token", "tokenizer.ggml.bos_token_id"},
                             std::pair{"eos_token", "tokenizer.ggml.eos_token_id"},
                             std::pair{"pad_token", "tokenizer.ggml.padding_token_id"}}) {
        const std::string t = config_token(tcfg, key);
        if (t.empty()) continue;
        for (const auto& [id, text] : by_id)
            if (text == t) { v.kv.emplace_back(gkey, GgufValue::u32(static_cast<uint32_t>(id))); break; }
    }
    for (auto [key, gkey] : {std::pair{"add_bos_token", "tokenizer.ggml.add_bos_token"},
                             std::pair{"add_eos_token", "tokenizer.ggml.add_eos_token"}})
        if (tcfg.is_object() && tcfg.contains(key) && tcfg[key].is_boolean())
            v.kv.emplace_back(gkey, GgufValue::boolean(tcfg[key].get<bool>()));
    std::string tmpl;
    if (fs::exists(dir / "chat_template.jinja")) tmpl = read_text_file(dir / "chat_template.jinja");
    else if (tcfg.is_object() && tcfg.contains("chat_template") && tcfg["chat_template"].is_string())
        tmpl = tcfg["chat_template"].get<std::string>();
    if (!tmpl.empty()) v.kv.emplace_back("tokenizer.chat_template", GgufValue::string(tmpl));
}

Vocab from_tokenizer_json(const std::string& path, uint64_t pad_to, const std::string& pre) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_text_file(path));
    } catch (const nlohmann::json::exception& e) {
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': invalid JSON: {}", path, e.what()));
    }
    const auto& model = j.value("model", nlohmann::json::object());
    const std::string kind = model.value("type", "");
    if ((kind != "BPE" && kind != "WordLevel") || !model.contains("vocab") || !model["vocab"].is_object())
        throw Error(Code::ModelLoadFailed,
                    fmt::format("'{}': model.type must be BPE or WordLevel with a vocab object (found '{}')", path, kind));
    const bool spm = kind == "BPE" && is_spm_style(j);
    JsonTokens jt = read_json_tokens(j, model, path);

    const uint64_t n = std::max<uint64_t>(pad_to, static_cast<uint64_t>(jt.max_id + 1));
    std::vector<std::string> tokens(n);
    std::vector<int32_t> types(n);
    int64_t unk_id = -1;
    for (uint64_t i = 0; i < n; ++i) {
        auto it = jt.by_id.find(static_cast<int64_t>(i));
        if (it == jt.by_id.end()) {
            tokens[i] = fmt::format("[PAD{}]", i);
            types[i] = kUnused;
            continue;
        }
        tokens[i] = it->second;
        auto a = jt.added_special.find(static_cast<int64_t>(i));
        if (a != jt.added_special.end()) types[i] = (a->second || looks_special(it->second)) ? kControl : kUserDefined;
        else if (spm && it->second == jt.unk) types[i] = kUnknown;
        else if (spm && is_byte_token(it->second)) types[i] = kByte;
        else types[i] = kNormal;
        if (!jt.unk.empty() && it->second == jt.unk) unk_id = static_cast<int64_t>(i);
    }

    Vocab v;
    v.source = path;
    v.n_tokens = n;
    const fs::path dir = fs::path(path).parent_path();
    const nlohmann::json tcfg = tokenizer_config(dir);
    if (kind == "WordLevel") {
        // llama.cpp has no word-level model: the vocabulary is kept (ids and
        // texts) for inspection, without a tokenizer the host can run.
        v.kv.emplace_back("tokenizer.ggml.model", GgufValue::string("none"));
        v.kv.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array(std::move(tokens)));
        v.kv.emplace_back("tokenizer.ggml.token_type", GgufValue::array(std::span<const int32_t>(types)));
    } else if (spm) {
        const std::vector<float> scores = spm_scores(jt.merges, tokens, types);
        v.kv.emplace_back("tokenizer.ggml.model", GgufValue::string("llama"));
        v.kv.emplace_back("tokenizer.ggml.pre", GgufValue::string("default"));
        v.kv.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array(std::move(tokens)));
        v.kv.emplace_back("tokenizer.ggml.scores", GgufValue::array(std::span<const float>(scores)));
        v.kv.emplace_back("tokenizer.ggml.token_type", GgufValue::array(std::span<const int32_t>(types)));
        v.kv.emplace_back("tokenizer.ggml.add_space_prefix", GgufValue::boolean(adds_space_prefix(j)));
        if (unk_id >= 0) v.kv.emplace_back("tokenizer.ggml.unknown_token_id", GgufValue::u32(static_cast<uint32_t>(unk_id)));
    } else {
        v.kv.emplace_back("tokenizer.ggml.model", GgufValue::string("gpt2"));
        v.kv.emplace_back("tokenizer.ggml.pre", GgufValue::string(pre.empty() ? "default" : pre));
        v.kv.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array(std::move(tokens)));
        v.kv.emplace_back("tokenizer.ggml.token_type", GgufValue::array(std::span<const int32_t>(types)));
        v.kv.emplace_back("tokenizer.ggml.merges", GgufValue::string_array(std::move(jt.merges)));
    }
    add_config_keys(v, dir, tcfg, jt.by_id);
    return v;
}

}  // namespace

GgufValue to_gguf_value(const eh_value& v) {
    switch (v.type) {
    case EH_VALUE_U8: return GgufValue::u8(static_cast<uint8_t>(v.v.u64));
    case EH_VALUE_I8: return GgufValue::i8(static_cast<int8_t>(v.v.i64));
    case EH_VALUE_U16: return GgufValue::u16(static_cast<uint16_t>(v.v.u64));
    case EH_VALUE_I16: return GgufValue::i16(static_cast<int16_t>(v.v.i64));
    case EH_VALUE_U32: return GgufValue::u32(static_cast<uint32_t>(v.v.u64));
    case EH_VALUE_I32: return GgufValue::i32(static_cast<int32_t>(v.v.i64));
    case EH_VALUE_U64: return GgufValue::u64(v.v.u64);
    case EH_VALUE_I64: return GgufValue::i64(v.v.i64);
    case EH_VALUE_F32: return GgufValue::f32(static_cast<float>(v.v.f64));
    case EH_VALUE_F64: return GgufValue::f64(v.v.f64);
    case EH_VALUE_BOOL: return GgufValue::boolean(v.v.u64 != 0);
    case EH_VALUE_STRING: return GgufValue::string(model::to_sv(v.v.str));
    case EH_VALUE_ARRAY: break;
    default: throw Error(Code::InvalidRequest, fmt::format("metadata value type {} cannot be copied", v.type));
    }
    if (v.elem_type == EH_VALUE_STRING) {
        const auto* s = static_cast<const eh_string*>(v.v.array);
        std::vector<std::string> out;
        out.reserve(v.count);
        for (uint64_t i = 0; i < v.count; ++i) out.emplace_back(model::to_sv(s[i]));
        return GgufValue::string_array(std::move(out));
    }
    if (v.elem_type == EH_VALUE_ARRAY) {
        const auto* e = static_cast<const eh_value*>(v.v.array);
        std::vector<GgufValue> out;
        for (uint64_t i = 0; i < v.count; ++i) out.push_back(to_gguf_value(e[i]));
        return GgufValue::array_of_arrays(std::move(out));
    }
    return GgufValue::numeric_array(v.elem_type, v.v.array, v.count);
}

Vocab load_vocab(const std::string& path, uint64_t pad_to, const std::string& pre,
                 const std::vector<std::pair<std::string, GgufValue>>& extra) {
    if (!fs::exists(path)) throw Error(Code::NotFound, fmt::format("vocabulary file '{}' does not exist", path));
    Vocab v;
    const std::string ext = fs::path(path).extension().string();
    if (ext == ".gguf") {
        v = from_gguf(path);
    } else {
        v = from_tokenizer_json(path, pad_to, pre);
        for (const auto& [k, val] : extra) put(v.kv, k, val);
    }
    return v;
}

Vocab synthetic_vocab(uint64_t n_tokens) {
    std::vector<std::string> tokens(n_tokens);
    std::vector<float> scores(n_tokens, 0.0f);
    std::vector<int32_t> types(n_tokens, kNormal);
    for (uint64_t i = 0; i < n_tokens; ++i) tokens[i] = fmt::format("<tok {}>", i);
    Vocab v;
    v.source = "synthetic";
    v.n_tokens = n_tokens;
    v.kv.emplace_back("tokenizer.ggml.model", GgufValue::string("none"));
    v.kv.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array(std::move(tokens)));
    v.kv.emplace_back("tokenizer.ggml.scores", GgufValue::array(std::span<const float>(scores)));
    v.kv.emplace_back("tokenizer.ggml.token_type", GgufValue::array(std::span<const int32_t>(types)));
    return v;
}

std::string testdata_dir() {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("EH_TESTDATA_DIR"); env && *env) candidates.emplace_back(env);
#ifdef EH_TOOLS_TESTDATA_DIR
    candidates.emplace_back(EH_TOOLS_TESTDATA_DIR);
#endif
    candidates.emplace_back("../shared/testdata");
    candidates.emplace_back("shared/testdata");
    for (const auto& c : candidates) {
        std::error_code ec;
        if (fs::is_directory(c, ec)) return c;
    }
    return "";
}

}  // namespace eh::tools
