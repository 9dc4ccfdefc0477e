#include "eh/tools/convert.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/tools/parallel.hpp"
#include "eh/tools/safetensors.hpp"
#include "eh/tools/vocab.hpp"
#include "row_stream.hpp"

namespace eh::tools {

namespace fs = std::filesystem;
using model::GgufValue;
using nlohmann::json;

namespace {

enum class Op { Copy, Transpose, PermuteHeads };

struct Planned {
    std::string gguf, hf;
    Op op = Op::Copy;
    uint32_t heads = 0;  // PermuteHeads
};

json read_json(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw Error(Code::ModelLoadFailed, fmt::format("cannot read '{}'", p.string()));
    std::ostringstream ss;
    ss << in.rdbuf();
    try {
        return json::parse(ss.str());
    } catch (const json::exception& e) {
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': invalid JSON: {}", p.string(), e.what()));
    }
}

uint32_t cfg_u32(const json& c, std::initializer_list<const char*> keys, const std::string& file) {
    for (const char* k : keys)
        if (c.contains(k) && c[k].is_number_integer()) return c[k].get<uint32_t>();
    throw Error(Code::ModelLoadFailed, fmt::format("'{}': missing integer '{}'", file, *keys.begin()));
}
double cfg_f(const json& c, const char* key, double dflt) {
    return c.contains(key) && c[key].is_number() ? c[key].get<double>() : dflt;
}

std::string arch_of(const json& cfg, const std::string& file) {
    std::string mt = cfg.value("model_type", "");
    if (mt == "llama" || mt == "mistral") return "llama";
    if (mt == "qwen2") return "qwen2";
    if (mt == "phi3") return "phi3";
    if (mt == "gpt2") return "gpt2";
    if (mt == "gpt_oss")
        throw Error(Code::InvalidRequest, fmt::format("'{}': gpt-oss conversion (MXFP4 block repacking) is not implemented yet", file));
    throw Error(Code::InvalidRequest, fmt::format("'{}': model_type '{}' is not supported (llama, qwen2, phi3, gpt2)", file, mt));
}

// new row h*hd + 2j + s  <-  old row h*hd + s*hd/2 + j  (GGUF's rotary pairing)
std::vector<float> permute_heads(const std::vector<float>& w, uint64_t rows, uint64_t cols, uint32_t heads) {
    std::vector<float> out(w.size());
    const uint64_t hd = rows / heads, half = hd / 2;
    for (uint64_t h = 0; h < heads; ++h)
        for (uint64_t s = 0; s < 2; ++s)
            for (uint64_t j = 0; j < half; ++j) {
                const uint64_t dst = h * hd + 2 * j + s, src = h * hd + s * half + j;
                std::copy_n(w.begin() + src * cols, cols, out.begin() + dst * cols);
            }
    return out;
}

}  // namespace

ConvertResult convert_hf(const ConvertOptions& o) {
    const fs::path dir(o.hf_dir);
    const std::string cfg_file = (dir / "config.json").string();
    const json cfg = read_json(cfg_file);
    const std::string arch = arch_of(cfg, cfg_file);
    auto st = read_safetensors_dir(o.hf_dir);
    auto has = [&](const std::string& n) { return st.count(n) != 0; };

    const uint32_t n_layer = cfg_u32(cfg, {"num_hidden_layers", "n_layer"}, cfg_file);
    const uint32_t n_embd = cfg_u32(cfg, {"hidden_size", "n_embd"}, cfg_file);
    const uint32_t n_head = cfg_u32(cfg, {"num_attention_heads", "n_head"}, cfg_file);
    const uint32_t n_head_kv = cfg.contains("num_key_value_heads") ? cfg_u32(cfg, {"num_key_value_heads"}, cfg_file) : n_head;
    const uint32_t n_vocab = cfg_u32(cfg, {"vocab_size"}, cfg_file);

    model::GgufWriter w;
    const std::string a = arch + ".";
    w.set("general.architecture", GgufValue::string(arch));
    w.set("general.type", GgufValue::string("model"));
    w.set("general.name", GgufValue::string(dir.filename().string()));
    if (arch == "gpt2") {
        w.set(a + "block_count", GgufValue::u32(n_layer));
        w.set(a + "context_length", GgufValue::u32(cfg_u32(cfg, {"n_ctx", "n_positions"}, cfg_file)));
        w.set(a + "embedding_length", GgufValue::u32(n_embd));
        w.set(a + "feed_forward_length",
              GgufValue::u32(cfg.contains("n_inner") && cfg["n_inner"].is_number() ? cfg["n_inner"].get<uint32_t>() : 4 * n_embd));
        w.set(a + "attention.head_count", GgufValue::u32(n_head));
        w.set(a + "attention.layer_norm_epsilon", GgufValue::f32(float(cfg_f(cfg, "layer_norm_epsilon", 1e-5))));
    } else {
        const uint32_t ctx = cfg_u32(cfg, {"max_position_embeddings"}, cfg_file);
        if (arch == "phi3") {
            w.set(a + "context_length", GgufValue::u32(ctx));
            w.set(a + "rope.scaling.original_context_length",
                  GgufValue::u32(cfg.contains("original_max_position_embeddings") ? cfg_u32(cfg, {"original_max_position_embeddings"}, cfg_file) : ctx));
            w.set(a + "embedding_length", GgufValue::u32(n_embd));
            w.set(a + "feed_forward_length", GgufValue::u32(cfg_u32(cfg, {"intermediate_size"}, cfg_file)));
            w.set(a + "block_count", GgufValue::u32(n_layer));
        } else {
            w.set(a + "block_count", GgufValue::u32(n_layer));
            w.set(a + "context_length", GgufValue::u32(ctx));
            w.set(a + "embedding_length", GgufValue::u32(n_embd));
            w.set(a + "feed_forward_length", GgufValue::u32(cfg_u32(cfg, {"intermediate_size"}, cfg_file)));
        }
        w.set(a + "attention.head_count", GgufValue::u32(n_head));
        w.set(a + "attention.head_count_kv", GgufValue::u32(n_head_kv));
        if (arch == "phi3") {
            w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(float(cfg_f(cfg, "rms_norm_eps", 1e-5))));
            w.set(a + "rope.dimension_count", GgufValue::u32(n_embd / n_head));
            w.set(a + "rope.freq_base", GgufValue::f32(float(cfg_f(cfg, "rope_theta", 10000))));
            if (cfg.contains("sliding_window") && cfg["sliding_window"].is_number_integer())
                w.set(a + "attention.sliding_window", GgufValue::u32(cfg["sliding_window"].get<uint32_t>()));
        } else {
            w.set(a + "rope.freq_base", GgufValue::f32(float(cfg_f(cfg, "rope_theta", 10000))));
            w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(float(cfg_f(cfg, "rms_norm_eps", 1e-6))));
            if (arch == "llama") w.set(a + "rope.dimension_count", GgufValue::u32(n_embd / n_head));
        }
    }
    w.set("general.file_type", GgufValue::u32(o.target.file_type()));

    // tokenizer
    const std::string tok = (dir / "tokenizer.json").string();
    const std::string pre = arch == "qwen2" ? "qwen2" : arch == "gpt2" ? "gpt-2" : arch == "llama" ? "llama-bpe" : "default";
    std::vector<std::pair<std::string, GgufValue>> extra;
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
        if (cfg.contains(k) && cfg[k].is_number_integer()) {
            std::string gk = std::string("tokenizer.ggml.") + (std::string(k) == "pad_token_id" ? "padding_token_id" : k);
            extra.emplace_back(gk, GgufValue::u32(cfg[k].get<uint32_t>()));
        }
    }
    Vocab vocab = load_vocab(tok, n_vocab, pre, extra);
    for (const auto& [k, v] : vocab.kv) w.set(k, v);
    w.set("general.quantization_version", GgufValue::u32(2));

    // tensor plan, in the order the forge writes them
    std::vector<Planned> plan;
    auto add = [&](std::string g, std::string h, Op op = Op::Copy, uint32_t heads = 0) {
        if (has(h)) plan.push_back({std::move(g), std::move(h), op, heads});
    };
    const bool tied = !has("lm_head.weight") || cfg.value("tie_word_embeddings", false);
    if (arch == "gpt2") {
        const std::string p = has("transformer.wte.weight") ? "transformer." : "";
        add("token_embd.weight", p + "wte.weight");
        add("position_embd.weight", p + "wpe.weight");
        for (uint32_t i = 0; i < n_layer; ++i) {
            const std::string h = fmt::format("{}h.{}.", p, i), g = fmt::format("blk.{}.", i);
            add(g + "attn_norm.weight", h + "ln_1.weight");
            add(g + "attn_norm.bias", h + "ln_1.bias");
            add(g + "attn_qkv.weight", h + "attn.c_attn.weight", Op::Transpose);
            add(g + "attn_qkv.bias", h + "attn.c_attn.bias");
            add(g + "attn_output.weight", h + "attn.c_proj.weight", Op::Transpose);
            add(g + "attn_output.bias", h + "attn.c_proj.bias");
            add(g + "ffn_norm.weight", h + "ln_2.weight");
            add(g + "ffn_norm.bias", h + "ln_2.bias");
            add(g + "ffn_up.weight", h + "mlp.c_fc.weight", Op::Transpose);
            add(g + "ffn_up.bias", h + "mlp.c_fc.bias");
            add(g + "ffn_down.weight", h + "mlp.c_proj.weight", Op::Transpose);
            add(g + "ffn_down.bias", h + "mlp.c_proj.bias");
        }
        add("output_norm.weight", p + "ln_f.weight");
        add("output_norm.bias", p + "ln_f.bias");
        add("output.weight", p + "wte.weight");  // the converter writes the tied head out
    } else {
        add("token_embd.weight", "model.embed_tokens.weight");
        for (uint32_t i = 0; i < n_layer; ++i) {
            const std::string h = fmt::format("model.layers.{}.", i), g = fmt::format("blk.{}.", i);
            add(g + "attn_norm.weight", h + "input_layernorm.weight");
            if (arch == "phi3") {
                add(g + "attn_qkv.weight", h + "self_attn.qkv_proj.weight");
                add(g + "attn_output.weight", h + "self_attn.o_proj.weight");
                add(g + "ffn_norm.weight", h + "post_attention_layernorm.weight");
                add(g + "ffn_up.weight", h + "mlp.gate_up_proj.weight");
                add(g + "ffn_down.weight", h + "mlp.down_proj.weight");
                continue;
            }
            const bool llama = arch == "llama";
            add(g + "attn_q.weight", h + "self_attn.q_proj.weight", llama ? Op::PermuteHeads : Op::Copy, n_head);
            add(g + "attn_q.bias", h + "self_attn.q_proj.bias");
            add(g + "attn_k.weight", h + "self_attn.k_proj.weight", llama ? Op::PermuteHeads : Op::Copy, n_head_kv);
            add(g + "attn_k.bias", h + "self_attn.k_proj.bias");
            add(g + "attn_v.weight", h + "self_attn.v_proj.weight");
            add(g + "attn_v.bias", h + "self_attn.v_proj.bias");
            add(g + "attn_output.weight", h + "self_attn.o_proj.weight");
            add(g + "ffn_norm.weight", h + "post_attention_layernorm.weight");
            add(g + "ffn_gate.weight", h + "mlp.gate_proj.weight");
            add(g + "ffn_up.weight", h + "mlp.up_proj.weight");
            add(g + "ffn_down.weight", h + "mlp.down_proj.weight");
        }
        add("output_norm.weight", "model.norm.weight");
        if (!tied) add("output.weight", "lm_head.weight");
    }

    ModelFacts facts{n_layer, false};
    for (const auto& p : plan) if (p.gguf == "output.weight") facts.has_output = true;

    WorkerPool pool(o.threads);
    ConvertResult r;
    r.architecture = arch;
    for (const auto& p : plan) {
        const SafeTensor& t = st.at(p.hf);
        if (t.shape.empty() || t.shape.size() > 2)
            throw Error(Code::ModelLoadFailed, fmt::format("tensor '{}' has {} dims (1 or 2 expected)", p.hf, t.shape.size()));
        // ggml dims are the reverse of the row-major shape; a Conv1D weight
        // ([in, out]) is transposed so that rows are outputs.
        std::vector<uint64_t> dims(t.shape.rbegin(), t.shape.rend());
        if (p.op == Op::Transpose) std::swap(dims[0], dims[1]);
        const uint32_t src_type = is_quantizable(p.gguf, dims) ? EH_TYPE_F16 : EH_TYPE_F32;
        uint32_t type = choose_type(o.target, facts, p.gguf, dims, src_type);
        if (!is_quantizable(p.gguf, dims)) type = EH_TYPE_F32;
        const char* tn = eh_tensor_type_traits(type).name;
        ++r.census[tn ? tn : "?"];
        w.add_tensor(p.gguf, type, dims, [&pool, &t, p, dims, type, &o](model::ByteSink& sink) {
            if (o.log) o.log(fmt::format("{} <- {}", p.gguf, p.hf));
            std::vector<float> v = read_floats(t);
            const uint64_t ne0 = dims[0], rows = dims.size() > 1 ? dims[1] : 1;
            if (p.op == Op::Transpose) {
                std::vector<float> tr(v.size());
                for (uint64_t rr = 0; rr < rows; ++rr)
                    for (uint64_t c = 0; c < ne0; ++c) tr[rr * ne0 + c] = v[c * rows + rr];
                v.swap(tr);
            } else if (p.op == Op::PermuteHeads) {
                v = permute_heads(v, rows, ne0, p.heads);
            }
            detail::stream_rows(p.gguf, type, ne0, rows, pool, sink, [&](uint64_t first, uint64_t n, float* out) {
                std::copy_n(v.begin() + first * ne0, n * ne0, out);
            });
        });
    }
    const std::string tmp = o.out + ".partial";
    try {
        w.write(tmp);
        fs::rename(tmp, o.out);
    } catch (...) {
        std::error_code ec;
        fs::remove(tmp, ec);
        throw;
    }
    r.n_tensors = plan.size();
    r.out_bytes = fs::file_size(o.out);
    return r;
}

}  // namespace eh::tools
