#include "eh/model/inspect.hpp"

#include <cinttypes>
#include <cmath>

#include <fmt/format.h>

#include <engine_host/tensor_types.h>

#include "eh/model/descriptor.hpp"

namespace eh::model {

namespace {

// ---- shared helpers ---------------------------------------------------------

std::string human_bytes(uint64_t n) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(n);
    int u = 0;
    while (v >= 1024 && u < 4) { v /= 1024; ++u; }
    return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string human_count(uint64_t n) {
    if (n >= 1000000000) return fmt::format("{:.2f}B", static_cast<double>(n) / 1e9);
    if (n >= 1000000) return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6);
    if (n >= 1000) return fmt::format("{:.1f}K", static_cast<double>(n) / 1e3);
    return std::to_string(n);
}

// Length of the valid UTF-8 sequence at s[i], or 0.
size_t utf8_len(std::string_view s, size_t i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (size_t k = 1; k < n; ++k)
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
    return n;
}

// A JSON string literal; bytes that are not UTF-8 become \u00XX.
std::string json_str(std::string_view s) {
    std::string out = "\"";
    for (size_t i = 0; i < s.size();) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        size_t n = utf8_len(s, i);
        if (c == '"') out += "\\\"";
        else if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (c < 0x20 || n == 0) out += fmt::format("\\u{:04x}", c);
        else { out.append(s.substr(i, n)); i += n; continue; }
        ++i;
    }
    return out + "\"";
}

std::string json_num(double v) {
    if (!std::isfinite(v)) return "null";
    return fmt::format("{}", v);
}

// f32 values print at float precision ("1e-05", not 9.99999974737875e-06).
std::string json_num_f32(float v) {
    if (!std::isfinite(v)) return "null";
    return fmt::format("{}", v);
}

// Text form of a string: quoted, escaped like JSON, cut at `max` bytes.
std::string text_str(std::string_view s, size_t max) {
    if (s.size() <= max) return json_str(s);
    return fmt::format("{}... ({} bytes)", json_str(s.substr(0, max)), s.size());
}

// One scalar element of an array, as text or JSON.
std::string element(uint32_t elem_type, const void* data, uint64_t i, bool json, size_t max_str,
                    size_t max_items, int depth);

std::string array_items(const eh_value& v, bool json, size_t max_str, size_t max_items, int depth) {
    std::string out = "[";
    uint64_t n = std::min<uint64_t>(v.count, max_items);
    for (uint64_t i = 0; i < n; ++i) {
        if (i) out += ", ";
        out += element(v.elem_type, v.v.array, i, json, max_str, max_items, depth);
    }
    if (!json && v.count > n) out += ", ...";
    return out + "]";
}

std::string element(uint32_t t, const void* data, uint64_t i, bool json, size_t max_str, size_t max_items,
                    int depth) {
    switch (t) {
    case EH_VALUE_U8: return std::to_string(static_cast<const uint8_t*>(data)[i]);
    case EH_VALUE_I8: return std::to_string(static_cast<const int8_t*>(data)[i]);
    case EH_VALUE_U16: return std::to_string(static_cast<const uint16_t*>(data)[i]);
    case EH_VALUE_I16: return std::to_string(static_cast<const int16_t*>(data)[i]);
    case EH_VALUE_U32: return std::to_string(static_cast<const uint32_t*>(data)[i]);
    case EH_VALUE_I32: return std::to_string(static_cast<const int32_t*>(data)[i]);
    case EH_VALUE_U64: return std::to_string(static_cast<const uint64_t*>(data)[i]);
    case EH_VALUE_I64: return std::to_string(static_cast<const int64_t*>(data)[i]);
    case EH_VALUE_F32: return json_num_f32(static_cast<const float*>(data)[i]);
    case EH_VALUE_F64: return json_num(static_cast<const double*>(data)[i]);
    case EH_VALUE_BOOL: return static_cast<const uint8_t*>(data)[i] ? "true" : "false";
    case EH_VALUE_STRING: {
        std::string_view s = to_sv(static_cast<const eh_string*>(data)[i]);
        return json ? json_str(s.substr(0, max_str)) : text_str(s, max_str);
    }
    case EH_VALUE_ARRAY: {
        const eh_value& inner = static_cast<const eh_value*>(data)[i];
        if (depth > 3) return json ? "null" : "[...]";
        return array_items(inner, json, max_str, max_items, depth + 1);
    }
    }
    return json ? "null" : "?";
}

std::string scalar(const eh_value& v, bool json, size_t max_str) {
    switch (v.type) {
    case EH_VALUE_U8: case EH_VALUE_U16: case EH_VALUE_U32: case EH_VALUE_U64: return std::to_string(v.v.u64);
    case EH_VALUE_I8: case EH_VALUE_I16: case EH_VALUE_I32: case EH_VALUE_I64: return std::to_string(v.v.i64);
    case EH_VALUE_F32: return json_num_f32(static_cast<float>(v.v.f64));
    case EH_VALUE_F64: return json_num(v.v.f64);
    case EH_VALUE_BOOL: return v.v.u64 ? "true" : "false";
    case EH_VALUE_STRING: {
        std::string_view s = to_sv(v.v.str);
        return json ? json_str(s.substr(0, max_str)) : text_str(s, max_str);
    }
    }
    return json ? "null" : "?";
}

std::string dims_text(const eh_tensor& t) {
    std::string s;
    for (uint32_t i = 0; i < t.n_dims; ++i) s += (i ? ", " : "") + std::to_string(t.dims[i]);
    return s;
}

std::string rope_scaling_text(const RopeScaling& r) {
    std::string s = r.type;
    if (r.factor) s += fmt::format(", factor {}", r.factor);
    if (r.original_context_length) s += fmt::format(", original context {}", r.original_context_length);
    if (r.yarn_beta_fast) s += fmt::format(", beta_fast {}", *r.yarn_beta_fast);
    if (r.yarn_beta_slow) s += fmt::format(", beta_slow {}", *r.yarn_beta_slow);
    return s;
}

}  // namespace

std::string inspect_text(const ModelFile& f, const InspectOptions& o) {
    ModelDescriptor d = describe(f);
    std::string out;
    auto line = [&](std::string_view k, const std::string& v) { out += fmt::format("  {:<26} {}\n", k, v); };
    std::string fmt_desc = d.format == "gguf" ? fmt::format("GGUF v{}", f.gguf_version()) : "safetensors (HF directory)";
    out += fmt::format("Model: {}\n", f.path());
    line("format", fmt_desc);
    line("file size", human_bytes(f.file_size()));
    if (d.format == "gguf") {
        line("alignment", std::to_string(f.alignment()));
        line("data offset", std::to_string(f.data_offset()));
    } else {
        for (const auto& w : f.weight_files()) line("weights", w);
    }
    line("architecture", d.architecture.empty() ? "(none)" : d.architecture + (d.known_architecture ? "" : " (not a known architecture)"));
    if (!d.name.empty()) line("name", d.name);
    line("quant kind", d.quant_kind.empty() ? "-" : d.quant_kind);
    if (d.file_type) line("file type", fmt::format("{} ({})", *d.file_type, file_type_name(*d.file_type)));
    std::string types;
    for (const auto& t : d.tensor_types)
        types += fmt::format("{}{} x{} ({})", types.empty() ? "" : ", ", t.name, t.count, human_bytes(t.bytes));
    line("tensors", fmt::format("{}{}", d.n_tensors, types.empty() ? "" : ": " + types));
    line("parameters", fmt::format("{} ({})", human_count(d.parameter_count), d.parameter_count));
    line("tensor bytes", fmt::format("{} ({})", human_bytes(d.tensor_bytes), d.tensor_bytes));
    line("context length", std::to_string(d.context_length));
    line("embedding length", std::to_string(d.embedding_length));
    line("blocks", std::to_string(d.block_count));
    line("feed-forward length", std::to_string(d.feed_forward_length));
    line("attention heads", fmt::format("{} (kv {}, head dim {})", d.head_count, d.head_count_kv, d.head_dim));
    if (d.rope_dimension_count) line("rope dimensions", std::to_string(d.rope_dimension_count));
    if (d.rope_freq_base) line("rope freq base", fmt::format("{}", d.rope_freq_base));
    if (d.rope_scaling) line("rope scaling", rope_scaling_text(*d.rope_scaling));
    line(d.norm_is_rms ? "norm (RMS) eps" : "norm (LayerNorm) eps", fmt::format("{:g}", d.norm_eps));
    if (d.expert_count)
        line("experts", fmt::format("{} (used {}, ff length {})", d.expert_count, d.expert_used_count,
                                    d.expert_feed_forward_length));
    if (d.sliding_window) line("sliding window", std::to_string(d.sliding_window));
    line("tied embeddings", d.tied_embeddings ? "yes" : "no");
    line("vocab size", std::to_string(d.vocab_size));

    if (o.list_metadata) {
        out += fmt::format("Metadata ({} keys):\n", f.metadata().size());
        for (const eh_metadata_kv& kv : f.metadata()) {
            const eh_value& v = kv.value;
            if (v.type == EH_VALUE_ARRAY)
                out += fmt::format("  {} = [{} x {}] {}\n", to_sv(kv.key), value_type_name(v.elem_type), v.count,
                                   array_items(v, false, o.max_string_bytes, o.max_array_items, 0));
            else
                out += fmt::format("  {} = {} [{}]\n", to_sv(kv.key), scalar(v, false, o.max_string_bytes),
                                   value_type_name(v.type));
        }
    }
    if (o.list_tensors) {
        out += fmt::format("Tensors ({}):\n", f.tensors().size());
        for (const eh_tensor& t : f.tensors())
            out += fmt::format("  {:<40} {:<8} [{}] {}\n", to_sv(t.name), tensor_type_name(t.type), dims_text(t),
                               human_bytes(t.nbytes));
    }
    for (const auto& s : o.extra_sections) {
        out += s.title + ":\n";
        for (const auto& [k, v] : s.facts) line(k, v);
    }
    return out;
}

std::string inspect_json(const ModelFile& f, const InspectOptions& o) {
    ModelDescriptor d = describe(f);
    std::string j = "{";
    auto field = [&](std::string_view k, const std::string& v) {
        if (j.size() > 1 && j.back() != '{' && j.back() != '[') j += ",";
        j += json_str(k) + ":" + v;
    };
    auto str_list = [](const std::vector<std::string>& v) {
        std::string s = "[";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + json_str(v[i]);
        return s + "]";
    };
    field("path", json_str(f.path()));
    field("format", json_str(d.format));
    field("gguf_version", std::to_string(f.gguf_version()));
    field("alignment", std::to_string(f.alignment()));
    field("data_offset", std::to_string(f.data_offset()));
    field("file_size", std::to_string(f.file_size()));
    field("weight_files", str_list(f.weight_files()));

    std::string m = "{";
    auto mf = [&](std::string_view k, const std::string& v) {
        if (m.size() > 1) m += ",";
        m += json_str(k) + ":" + v;
    };
    mf("architecture", json_str(d.architecture));
    mf("known_architecture", d.known_architecture ? "true" : "false");
    mf("name", json_str(d.name));
    mf("context_length", std::to_string(d.context_length));
    mf("embedding_length", std::to_string(d.embedding_length));
    mf("block_count", std::to_string(d.block_count));
    mf("feed_forward_length", std::to_string(d.feed_forward_length));
    mf("head_count", std::to_string(d.head_count));
    mf("head_count_kv", std::to_string(d.head_count_kv));
    mf("head_dim", std::to_string(d.head_dim));
    mf("rope_dimension_count", std::to_string(d.rope_dimension_count));
    mf("rope_freq_base", json_num(d.rope_freq_base));
    if (d.rope_scaling) {
        const auto& r = *d.rope_scaling;
        mf("rope_scaling", fmt::format("{{\"type\":{},\"factor\":{},\"original_context_length\":{},"
                                       "\"yarn_beta_fast\":{},\"yarn_beta_slow\":{}}}",
                                       json_str(r.type), json_num(r.factor), r.original_context_length,
                                       r.yarn_beta_fast ? json_num(*r.yarn_beta_fast) : "null",
                                       r.yarn_beta_slow ? json_num(*r.yarn_beta_slow) : "null"));
    } else {
        mf("rope_scaling", "null");
    }
    mf("norm_eps", json_num(d.norm_eps));
    mf("norm", json_str(d.norm_is_rms ? "rms" : "layer"));
    mf("expert_count", std::to_string(d.expert_count));
    mf("expert_used_count", std::to_string(d.expert_used_count));
    mf("expert_feed_forward_length", std::to_string(d.expert_feed_forward_length));
    mf("sliding_window", std::to_string(d.sliding_window));
    mf("tied_embeddings", d.tied_embeddings ? "true" : "false");
    mf("vocab_size", std::to_string(d.vocab_size));
    mf("file_type", d.file_type ? std::to_string(*d.file_type) : "null");
    mf("quant_kind", json_str(d.quant_kind));
    std::string tt = "[";
    for (const auto& t : d.tensor_types)
        tt += fmt::format("{}{{\"type\":{},\"id\":{},\"count\":{},\"elements\":{},\"bytes\":{}}}", tt.size() > 1 ? "," : "",
                          json_str(t.name), t.type, t.count, t.elements, t.bytes);
    mf("tensor_types", tt + "]");
    mf("n_tensors", std::to_string(d.n_tensors));
    mf("parameter_count", std::to_string(d.parameter_count));
    mf("tensor_bytes", std::to_string(d.tensor_bytes));
    field("model", m + "}");

    auto req = d.requirements();
    field("requirements", fmt::format("{{\"format\":{},\"architecture\":{},\"tensor_types\":{}}}", json_str(req.format),
                                      json_str(req.architecture), str_list(req.tensor_types)));

    if (o.list_metadata) {
        std::string md = "[";
        for (const eh_metadata_kv& kv : f.metadata()) {
            if (md.size() > 1) md += ",";
            const eh_value& v = kv.value;
            if (v.type == EH_VALUE_ARRAY)
                md += fmt::format("{{\"key\":{},\"type\":\"array\",\"elem_type\":\"{}\",\"count\":{},\"value\":{}}}",
                                  json_str(to_sv(kv.key)), value_type_name(v.elem_type), v.count,
                                  array_items(v, true, o.max_string_bytes, o.max_array_items, 0));
            else
                md += fmt::format("{{\"key\":{},\"type\":\"{}\",\"value\":{}}}", json_str(to_sv(kv.key)),
                                  value_type_name(v.type), scalar(v, true, o.max_string_bytes));
        }
        field("metadata", md + "]");
    }
    if (o.list_tensors) {
        std::string ts = "[";
        for (const eh_tensor& t : f.tensors()) {
            if (ts.size() > 1) ts += ",";
            std::string dims = "[";
            for (uint32_t i = 0; i < t.n_dims; ++i) dims += (i ? "," : "") + std::to_string(t.dims[i]);
            ts += fmt::format("{{\"name\":{},\"type\":{},\"dims\":{}],\"bytes\":{}}}", json_str(to_sv(t.name)),
                              json_str(tensor_type_name(t.type)), dims, t.nbytes);
        }
        field("tensors", ts + "]");
    }
    if (!o.extra_sections.empty()) {
        std::string ex = "{";
        for (const auto& s : o.extra_sections) {
            if (ex.size() > 1) ex += ",";
            std::string body = s.raw_json;
            if (body.empty()) {
                body = "{";
                for (const auto& [k, v] : s.facts) body += (body.size() > 1 ? "," : "") + json_str(k) + ":" + json_str(v);
                body += "}";
            }
            ex += json_str(s.title) + ":" + body;
        }
        field("extra", ex + "}");
    }
    return j + "}";
}

}  // namespace eh::model
