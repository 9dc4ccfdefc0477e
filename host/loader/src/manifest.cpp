#include "eh/loader/manifest.hpp"

#include <simdjson.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cctype>

namespace eh::loader {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

constexpr int kManifestVersion = 1;

const char* type_word(element_type t) {
    switch (t) {
    case element_type::ARRAY: return "an array";
    case element_type::OBJECT: return "an object";
    case element_type::INT64: case element_type::UINT64: return "an integer";
    case element_type::DOUBLE: return "a number";
    case element_type::STRING: return "a string";
    case element_type::BOOL: return "a boolean";
    case element_type::NULL_VALUE: return "null";
    }
    return "unknown";
}

// Small reader that records every problem instead of stopping at the first.
struct Reader {
    simdjson::dom::object root;
    std::vector<std::string>& problems;

    bool field(std::string_view key, element& out, bool required = true) {
        auto r = root.at_key(key);
        if (r.error()) {
            if (required) problems.push_back("missing field \"" + std::string(key) + "\"");
            return false;
        }
        out = r.value_unsafe();
        return true;
    }

    std::string str(std::string_view key, bool non_empty = true) {
        element e;
        if (!field(key, e)) return {};
        if (!e.is_string()) {
            problems.push_back("field \"" + std::string(key) + "\" must be a string, got " +
                               type_word(e.type()));
            return {};
        }
        std::string v(e.get_string().value_unsafe());
        if (non_empty && v.empty()) problems.push_back("field \"" + std::string(key) + "\" is empty");
        return v;
    }

    int64_t integer(element e, std::string_view key, int64_t lo, int64_t hi) {
        if (!e.is_int64()) {
            problems.push_back("field \"" + std::string(key) + "\" must be an integer, got " +
                               type_word(e.type()));
            return 0;
        }
        int64_t v = e.get_int64().value_unsafe();
        if (v < lo || v > hi) {
            problems.push_back("field \"" + std::string(key) + "\" = " + std::to_string(v) +
                               " is out of range [" + std::to_string(lo) + ", " +
                               std::to_string(hi) + "]");
            return 0;
        }
        return v;
    }

    int64_t integer(std::string_view key, int64_t lo, int64_t hi, bool required = true,
                    int64_t dflt = 0) {
        element e;
        if (!field(key, e, required)) return dflt;
        return integer(e, key, lo, hi);
    }

    std::vector<std::string> string_list(std::string_view key) {
        element e;
        std::vector<std::string> out;
        if (!field(key, e)) return out;
        if (!e.is_array()) {
            problems.push_back("field \"" + std::string(key) + "\" must be an array of strings, got " +
                               type_word(e.type()));
            return out;
        }
        simdjson::dom::array items;
        if (e.get_array().get(items)) return out;
        for (element item : items) {
            if (!item.is_string() || item.get_string().value_unsafe().empty()) {
                problems.push_back("field \"" + std::string(key) +
                                   "\" must contain only non-empty strings");
                return {};
            }
            out.emplace_back(item.get_string().value_unsafe());
        }
        if (out.empty()) problems.push_back("field \"" + std::string(key) + "\" is empty");
        return out;
    }
};

bool is_hex64(const std::string& s) {
    return s.size() == 64 && std::all_of(s.begin(), s.end(), [](unsigned char c) {
               return std::isdigit(c) || (c >= 'a' && c <= 'f');
           });
}

}  // namespace

std::string host_platform() {
    struct utsname u {};
    std::string machine = uname(&u) == 0 ? u.machine : "unknown";
    return "linux-" + machine;
}

Manifest parse_manifest(std::string_view json, std::vector<std::string>& problems) {
    Manifest m;
    simdjson::dom::parser parser;
    simdjson::padded_string padded(json);
    element doc;
    if (auto err = parser.parse(padded).get(doc)) {
        problems.push_back(std::string("manifest is not valid JSON: ") + simdjson::error_message(err));
        return m;
    }
    if (!doc.is_object()) {
        problems.push_back(std::string("manifest must be a JSON object, got ") + type_word(doc.type()));
        return m;
    }
    Reader r{doc.get_object().value_unsafe(), problems};

    m.manifest_version = static_cast<int>(r.integer("manifest_version", 1, 1000000));
    if (m.manifest_version && m.manifest_version != kManifestVersion)
        problems.push_back("manifest_version " + std::to_string(m.manifest_version) +
                           " is not supported (this host reads version " +
                           std::to_string(kManifestVersion) + ")");
    m.caps.name = r.str("name");
    m.caps.version = r.str("version");
    m.caps.engine = r.str("engine");
    m.library = r.str("library");
    if (m.library.find('/') != std::string::npos || m.library == "." || m.library == "..")
        problems.push_back("field \"library\" must be a plain file name beside the manifest, got \"" +
                           m.library + "\"");
    m.sha256 = r.str("sha256");
    if (!m.sha256.empty() && !is_hex64(m.sha256))
        problems.push_back("field \"sha256\" must be 64 lower-case hex digits");
    m.platform = r.str("platform");

    element abi;
    if (r.field("abi", abi)) {
        if (!abi.is_object()) {
            problems.push_back(std::string("field \"abi\" must be an object, got ") + type_word(abi.type()));
        } else {
            Reader ar{abi.get_object().value_unsafe(), problems};
            m.abi_major = static_cast<uint32_t>(ar.integer("major", 0, 65535));
            m.abi_minor = static_cast<uint32_t>(ar.integer("minor", 0, 65535));
        }
    }
    m.caps.formats = r.string_list("formats");
    for (const auto& f : m.caps.formats)
        if (f != "gguf" && f != "safetensors")
            problems.push_back("field \"formats\" has unknown format \"" + f +
                               "\" (known: gguf, safetensors)");
    m.caps.architectures = r.string_list("architectures");
    m.caps.quant_kinds = r.string_list("quant_kinds");

    element dev;
    if (r.field("device", dev)) {
        if (!dev.is_object()) {
            problems.push_back(std::string("field \"device\" must be an object, got ") + type_word(dev.type()));
        } else {
            Reader dr{dev.get_object().value_unsafe(), problems};
            m.caps.device_kind = dr.str("kind");
            if (!m.caps.device_kind.empty() && m.caps.device_kind != "cpu" && m.caps.device_kind != "cuda")
                problems.push_back("field \"device.kind\" must be \"cpu\" or \"cuda\", got \"" +
                                   m.caps.device_kind + "\"");
            m.caps.min_compute_capability =
                static_cast<uint32_t>(dr.integer("min_compute_capability", 0, 1000, false, 0));
        }
    }
    m.caps.priority = static_cast<int32_t>(r.integer("priority", -1000000, 1000000, false, 0));
    return m;
}

}  // namespace eh::loader
