// tokenizer.json (Hugging Face `tokenizers` serialisation) -> CoreSpec.
// Supported: model BPE; normalizers NFC, Prepend, Replace (" " -> "▁") and
// Sequences of them; pre-tokenizers ByteLevel, Split (with one of the known
// regexes), Metaspace and Sequences; decoders ByteLevel, Metaspace and the
// SentencePiece-style Sequence (Replace, ByteFallback, Fuse, Strip).
// Anything else is refused with a message naming it, never guessed at.
#include <fstream>
#include <simdjson.h>

#include "core.hpp"
#include "eh/error.hpp"

namespace eh::tokenizer {
namespace fs = std::filesystem;
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
    throw Error(Code::ModelLoadFailed, "tokenizer: " + file.string() + ": " + what);
}

std::string_view get_str(element e, std::string_view field, std::string_view fallback = {}) {
    std::string_view s;
    if (e[field].get(s) == simdjson::SUCCESS) return s;
    return fallback;
}

bool get_bool(element e, std::string_view field, bool fallback) {
    bool b;
    if (e[field].get(b) == simdjson::SUCCESS) return b;
    return fallback;
}

struct Loader {
    fs::path file;
    CoreSpec& spec;

    void normalizer(element n) {
        if (n.is_null()) return;
        const std::string_view type = get_str(n, "type");
        if (type == "Sequence") {
            array items;
            if (n["normalizers"].get(items)) fail(file, "normalizer Sequence without 'normalizers'");
            for (element x : items) normalizer(x);
        } else if (type == "NFC") {
            spec.nfc = true;
        } else if (type == "Prepend") {
            if (get_str(n, "prepend") != kMetaspace) fail(file, "normalizer Prepend supports only \"\\u2581\"");
            spec.prefix = SpacePrefix::EveryFragment;
        } else if (type == "Replace") {
            if (get_str(n["pattern"], "String") != " " || get_str(n, "content") != kMetaspace)
                fail(file, "normalizer Replace supports only \" \" -> \"\\u2581\"");
            spec.escape_spaces = true;
        } else {
            fail(file, "unsupported normalizer '" + std::string(type) + "'");
        }
    }

    void pre_tokenizer(element p) {
        if (p.is_null()) return;
        const std::string_view type = get_str(p, "type");
        if (type == "Sequence") {
            array items;
            if (p["pretokenizers"].get(items)) fail(file, "pre_tokenizer Sequence without 'pretokenizers'");
            for (element x : items) pre_tokenizer(x);
        } else if (type == "ByteLevel") {
            spec.byte_level = true;
            if (get_bool(p, "add_prefix_space", false)) spec.prefix = SpacePrefix::EveryFragment;
            if (get_bool(p, "use_regex", true)) set_split(SplitPattern::Gpt2);
        } else if (type == "Split") {
            const std::string_view regex = get_str(p["pattern"], "Regex");
            auto pattern = pattern_from_regex(regex);
            if (!pattern) fail(file, "unsupported pre_tokenizer Split regex: " + std::string(regex));
            if (get_str(p, "behavior") != "Isolated" || get_bool(p, "invert", false))
                fail(file, "pre_tokenizer Split supports only behavior Isolated, invert false");
            set_split(*pattern);
        } else if (type == "Metaspace") {
            if (get_str(p, "replacement", kMetaspace) != kMetaspace) fail(file, "Metaspace replacement must be \\u2581");
            if (get_bool(p, "split", false)) fail(file, "Metaspace with split=true is not supported");
            spec.escape_spaces = true;
            const std::string_view scheme = get_str(p, "prepend_scheme", "always");
            spec.prefix = scheme == "never" ? SpacePrefix::None
                          : scheme == "first" ? SpacePrefix::FirstAndAfterSpecial : SpacePrefix::EveryFragment;
            spec.strip_leading_space = spec.prefix != SpacePrefix::None;
        } else {
            fail(file, "unsupported pre_tokenizer '" + std::string(type) + "'");
        }
    }

    void set_split(SplitPattern p) {
        if (spec.split != SplitPattern::None && spec.split != p) fail(file, "more than one split pattern");
        spec.split = p;
    }

    void decoder(element d) {
        if (d.is_null()) return;
        const std::string_view type = get_str(d, "type");
        if (type == "Sequence") {
            array items;
            if (d["decoders"].get(items)) fail(file, "decoder Sequence without 'decoders'");
            for (element x : items) decoder(x);
        } else if (type == "Strip") {
            int64_t start = 0;
            if (d["start"].get(start) == simdjson::SUCCESS && start > 0 && get_str(d, "content") == " ")
                spec.strip_leading_space = true;
        } else if (type == "Metaspace") {
            if (get_str(d, "prepend_scheme", "always") != "never") spec.strip_leading_space = true;
        } else if (type == "ByteLevel" || type == "Replace" || type == "ByteFallback" || type == "Fuse") {
            // Implied by the per-token byte table (byte-level map, "▁" -> " ", <0xXX>).
        } else {
            fail(file, "unsupported decoder '" + std::string(type) + "'");
        }
    }

    void model(element m) {
        if (get_str(m, "type", "BPE") != "BPE") fail(file, "unsupported model '" + std::string(get_str(m, "type")) + "'");
        if (!get_str(m, "continuing_subword_prefix").empty() || !get_str(m, "end_of_word_suffix").empty())
            fail(file, "BPE continuing_subword_prefix / end_of_word_suffix are not supported");
        spec.byte_fallback = get_bool(m, "byte_fallback", false);
        spec.fuse_unk = get_bool(m, "fuse_unk", false);
        spec.ignore_merges = get_bool(m, "ignore_merges", false);

        object vocab;
        if (m["vocab"].get(vocab)) fail(file, "model has no 'vocab' object");
        for (auto [key, value] : vocab) {
            int64_t id;
            if (value.get(id) || id < 0 || id > (1 << 24)) fail(file, "vocab entry '" + std::string(key) + "' has a bad id");
            put_token(static_cast<int32_t>(id), key, TokenType::Normal);
        }

        array merges;
        if (m["merges"].get(merges)) fail(file, "model has no 'merges' array");
        spec.merges.reserve(merges.size());
        for (element x : merges) {
            std::string_view s;
            array pair;
            if (x.get(s) == simdjson::SUCCESS) {
                const size_t sp = s.find(' ', 1);
                if (sp == std::string_view::npos) fail(file, "merge '" + std::string(s) + "' has no space");
                spec.merges.emplace_back(std::string(s.substr(0, sp)), std::string(s.substr(sp + 1)));
            } else if (x.get(pair) == simdjson::SUCCESS && pair.size() == 2) {
                std::string_view a, b;
                if (pair.at(0).get(a) || pair.at(1).get(b)) fail(file, "merge pair is not two strings");
                spec.merges.emplace_back(std::string(a), std::string(b));
            } else {
                fail(file, "merge is neither \"a b\" nor [\"a\", \"b\"]");
            }
        }
        if (std::string_view unk = get_str(m, "unk_token"); !unk.empty()) unk_text = unk;
    }

    void added_tokens(element a) {
        array items;
        if (a.get(items)) return;
        for (element x : items) {
            int64_t id;
            std::string_view content;
            if (x["id"].get(id) || x["content"].get(content) || id < 0 || id > (1 << 24))
                fail(file, "added_tokens entry without id/content");
            AddedToken t;
            t.text = std::string(content);
            t.id = static_cast<int32_t>(id);
            t.special = get_bool(x, "special", false);
            t.lstrip = get_bool(x, "lstrip", false);
            t.rstrip = get_bool(x, "rstrip", false);
            put_token(t.id, content, t.special ? TokenType::Control : TokenType::UserDefined);
            spec.added.push_back(std::move(t));
        }
    }

    void put_token(int32_t id, std::string_view text, TokenType type) {
        if (static_cast<size_t>(id) >= spec.tokens.size()) {
            spec.tokens.resize(id + 1);
            spec.types.resize(id + 1, TokenType::Unused);
        }
        spec.tokens[id] = std::string(text);
        spec.types[id] = type;
    }

    // BOS when the post-processor puts a special token before the sequence.
    void post_processor(element p) {
        if (p.is_null() || get_str(p, "type") != "TemplateProcessing") return;
        array single;
        if (p["single"].get(single) || single.size() == 0) return;
        std::string_view first;
        if (single.at(0)["SpecialToken"]["id"].get(first) == simdjson::SUCCESS) {
            template_bos = std::string(first);
        }
        std::string_view last;
        if (single.at(single.size() - 1)["SpecialToken"]["id"].get(last) == simdjson::SUCCESS && single.size() > 1)
            template_eos = std::string(last);
    }

    std::string unk_text;
    std::string template_bos, template_eos;
};

// Values we read from tokenizer_config.json. On-demand parsing touches only
// these fields; the file may carry numbers simdjson's DOM refuses (gpt-oss
// has model_max_length = 1e30 written as an integer).
struct HfConfig {
    std::optional<std::string> bos, eos, pad, unk;
    std::optional<bool> add_bos, add_eos;
    std::string chat_template;
};

std::optional<std::string> token_field(simdjson::ondemand::value v) {
    std::string_view s;
    if (v.type() == simdjson::ondemand::json_type::string) {
        if (v.get_string().get(s) == simdjson::SUCCESS) return std::string(s);
        return std::nullopt;
    }
    if (v.type() == simdjson::ondemand::json_type::object) {
        for (auto f : v.get_object()) {
            std::string_view k;
            if (f.unescaped_key().get(k) == simdjson::SUCCESS && k == "content" &&
                f.value().get_string().get(s) == simdjson::SUCCESS)
                return std::string(s);
        }
    }
    return std::nullopt;
}

HfConfig read_config(const fs::path& file) {
    HfConfig c;
    if (!fs::exists(file)) return c;
    simdjson::padded_string json;
    if (simdjson::padded_string::load(file.string()).get(json)) fail(file, "cannot read");
    simdjson::ondemand::parser parser;
    simdjson::ondemand::document doc;
    if (parser.iterate(json).get(doc)) fail(file, "invalid JSON");
    simdjson::ondemand::object obj;
    if (doc.get_object().get(obj)) fail(file, "not a JSON object");
    for (auto field : obj) {
        std::string_view key;
        if (field.unescaped_key().get(key)) fail(file, "invalid JSON");
        simdjson::ondemand::value v = field.value();
        if (key == "bos_token") c.bos = token_field(v);
        else if (key == "eos_token") c.eos = token_field(v);
        else if (key == "pad_token") c.pad = token_field(v);
        else if (key == "unk_token") c.unk = token_field(v);
        else if (key == "add_bos_token") { bool b; if (v.get_bool().get(b) == simdjson::SUCCESS) c.add_bos = b; }
        else if (key == "add_eos_token") { bool b; if (v.get_bool().get(b) == simdjson::SUCCESS) c.add_eos = b; }
        else if (key == "chat_template") {
            std::string_view s;
            if (v.type() == simdjson::ondemand::json_type::string) {
                if (v.get_string().get(s) == simdjson::SUCCESS) c.chat_template = std::string(s);
            } else if (v.type() == simdjson::ondemand::json_type::array) {
                // A list of named templates: take "default".
                for (auto item : v.get_array()) {
                    std::string_view name, text;
                    simdjson::ondemand::object o;
                    if (item.get_object().get(o)) continue;
                    for (auto f : o) {
                        std::string_view k;
                        if (f.unescaped_key().get(k)) break;
                        if (k == "name") { if (f.value().get_string().get(name)) name = {}; }
                        else if (k == "template") { if (f.value().get_string().get(text)) text = {}; }
                    }
                    if (name == "default") c.chat_template = std::string(text);
                }
            }
        }
    }
    return c;
}

std::string read_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json(const fs::path& path) {
    const fs::path file = fs::is_directory(path) ? path / "tokenizer.json" : path;
    const fs::path dir = file.parent_path();
    simdjson::padded_string json;
    if (simdjson::padded_string::load(file.string()).get(json)) fail(file, "cannot read");
    simdjson::dom::parser parser;
    element root;
    if (auto err = parser.parse(json).get(root)) fail(file, std::string("invalid JSON: ") + simdjson::error_message(err));

    CoreSpec spec;
    spec.kind = "hf-json";
    spec.model = ModelKind::Bpe;
    Loader l{file, spec, {}, {}, {}};
    element m;
    if (root["model"].get(m)) fail(file, "no 'model'");
    l.model(m);
    if (element a; root["added_tokens"].get(a) == simdjson::SUCCESS) l.added_tokens(a);
    if (element n; root["normalizer"].get(n) == simdjson::SUCCESS) l.normalizer(n);
    if (element p; root["pre_tokenizer"].get(p) == simdjson::SUCCESS) l.pre_tokenizer(p);
    if (element d; root["decoder"].get(d) == simdjson::SUCCESS) l.decoder(d);
    if (element p; root["post_processor"].get(p) == simdjson::SUCCESS) l.post_processor(p);

    const HfConfig cfg = read_config(dir / "tokenizer_config.json");
    TextIndex index;
    for (size_t i = 0; i < spec.tokens.size(); ++i)
        if (!spec.tokens[i].empty()) index.emplace(spec.tokens[i], static_cast<int32_t>(i));
    auto id_of = [&](const std::optional<std::string>& t) -> int32_t {
        if (!t) return -1;
        auto it = index.find(*t);
        return it == index.end() ? -1 : it->second;
    };
    spec.special.bos = id_of(cfg.bos ? cfg.bos : (l.template_bos.empty() ? std::nullopt : std::optional(l.template_bos)));
    spec.special.eos = id_of(cfg.eos);
    spec.special.pad = id_of(cfg.pad);
    spec.special.unk = id_of(cfg.unk ? cfg.unk : (l.unk_text.empty() ? std::nullopt : std::optional(l.unk_text)));
    spec.add_bos = cfg.add_bos.value_or(!l.template_bos.empty());
    spec.add_eos = cfg.add_eos.value_or(!l.template_eos.empty());
    spec.chat_template = cfg.chat_template;
    if (spec.chat_template.empty() && fs::exists(dir / "chat_template.jinja"))
        spec.chat_template = read_text(dir / "chat_template.jinja");
    return std::make_unique<Core>(std::move(spec));
}

std::unique_ptr<Tokenizer> load_tokenizer(const eh_model_view& view, const std::optional<fs::path>& hf_dir) {
    if (hf_dir && fs::exists(*hf_dir / "tokenizer.json")) return Tokenizer::from_hf_json(*hf_dir);
    return Tokenizer::from_view(view);
}

}  // namespace eh::tokenizer
