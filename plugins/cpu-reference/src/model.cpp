#include "model.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <map>
#include <string>
#include <thread>

#include <engine_host/gemma3.hpp>
#include <engine_host/model_source.hpp>
#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>
#include <engine_host/rope_scaling.hpp>

namespace cpuref {

namespace {

using ehp::Error;

std::string blk(uint32_t i, const char* what) { return "blk." + std::to_string(i) + "." + what; }

// Binds tensors of the view to Matrix / float vectors, checking type, shape
// and size so that no later read can run past the mapping.
class Binder {
public:
    explicit Binder(const ehp::ModelView& v) : v_(v) {}

    bool has(const std::string& name) const { return v_.find_tensor(name) != nullptr; }

    // A matrix with dims {cols, rows} or, for experts, {cols, rows, n_expert}.
    Matrix matrix(const std::string& name, uint64_t cols, uint64_t rows, uint64_t n_expert, bool required) {
        Matrix m;
        const eh_tensor* t = v_.find_tensor(name);
        if (!t) {
            if (required) throw Error(EH_MODEL_LOAD_FAILED, "missing tensor '" + name + "'");
            return m;
        }
        check_type(*t, name);
        const uint64_t want[EH_MAX_DIMS] = {cols, rows, n_expert, 1};
        check_dims(*t, name, want);
        m.name = name;
        m.type = t->type;
        m.cols = cols;
        m.rows = rows;
        m.phys_rows = rows;
        m.n_expert = n_expert;
        m.row_bytes = ehp::quant::row_bytes(t->type, cols);
        if (m.row_bytes == 0)
            throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + name + "': row of " + std::to_string(cols) +
                                                  " values is not a whole number of " + ehp::type_name(t->type) + " blocks");
        uint64_t total = 0;
        if (__builtin_mul_overflow(m.row_bytes, rows, &total) || __builtin_mul_overflow(total, n_expert, &total))
            throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + name + "': size overflows");
        check_bytes(*t, name, total);
        m.data = static_cast<const uint8_t*>(t->data);
        bytes_by_type_[t->type] += m.row_bytes * rows * n_expert;
        return m;
    }

    // Experts kept one tensor each (an HF Qwen3-MoE checkpoint's
    // mlp.experts.<e>.<what>_proj, which the host names "<base>.<e>.weight"),
    // each {cols, rows}, all of one type: one expert matrix.
    Matrix expert_set(const std::string& base, uint64_t cols, uint64_t rows, uint64_t n_expert) {
        Matrix m;
        for (uint64_t e = 0; e < n_expert; ++e) {
            const std::string name = base + "." + std::to_string(e) + ".weight";
            Matrix one = matrix(name, cols, rows, 1, true);
            if (e == 0) m = one;
            else if (one.type != m.type)
                throw Error(EH_UNSUPPORTED, "tensor '" + name + "' has type " + ehp::type_name(one.type) + ", expert 0 " +
                                                ehp::type_name(m.type) + ": the experts of a matrix must share a type");
            m.expert_data.push_back(one.data);
        }
        m.name = base + ".*";
        m.n_expert = n_expert;
        return m;
    }

    // A column-major float matrix as HF stores GPT-2 Conv1D weights and
    // gpt-oss dense experts: dims {phys_rows, cols, n_expert}; logical row r
    // is stored column r*step + offset.
    Matrix transposed(const std::string& name, uint64_t cols, uint64_t rows, uint64_t n_expert,
                      uint64_t step, uint64_t offset, uint64_t phys_rows) {
        const eh_tensor* t = v_.find_tensor(name);
        if (!t) throw Error(EH_MODEL_LOAD_FAILED, "missing tensor '" + name + "'");
        if (t->type != EH_TYPE_F32 && t->type != EH_TYPE_F16 && t->type != EH_TYPE_BF16)
            throw Error(EH_UNSUPPORTED, "tensor '" + name + "' has type " + ehp::type_name(t->type) +
                                            "; a transposed (Hugging Face layout) matrix must be F32, F16 or BF16");
        const uint64_t want[EH_MAX_DIMS] = {phys_rows, cols, n_expert, 1};
        check_dims(*t, name, want);
        Matrix m;
        m.name = name;
        m.type = t->type;
        m.layout = Layout::Transposed;
        m.cols = cols;
        m.rows = rows;
        m.n_expert = n_expert;
        m.phys_rows = phys_rows;
        m.row_step = step;
        m.row_offset = offset;
        check_bytes(*t, name, checked_product({phys_rows, cols, n_expert, ehp::quant::row_bytes(t->type, 1)}, name));
        m.data = static_cast<const uint8_t*>(t->data);
        bytes_by_type_[t->type] += t->nbytes;
        return m;
    }

    // HF gpt-oss MXFP4 experts: `<base>.blocks` U8 {16, cols/32, phys_rows,
    // n_expert} and `<base>.scales` U8 {cols/32, phys_rows, n_expert}.
    Matrix hf_mxfp4(const std::string& base, uint64_t cols, uint64_t rows, uint64_t n_expert,
                    uint64_t step, uint64_t offset, uint64_t phys_rows) {
        const std::string bn = base + ".blocks", sn = base + ".scales";
        const eh_tensor* bt = v_.find_tensor(bn);
        const eh_tensor* st = v_.find_tensor(sn);
        if (!bt || !st) throw Error(EH_MODEL_LOAD_FAILED, "missing tensor '" + (bt ? sn : bn) + "'");
        if (bt->type != EH_TYPE_U8 || st->type != EH_TYPE_U8)
            throw Error(EH_MODEL_LOAD_FAILED, "MXFP4 tensors '" + bn + "' / '" + sn + "' must be U8");
        if (cols % 32 != 0) throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + bn + "': row length not a multiple of 32");
        const uint64_t wb[EH_MAX_DIMS] = {16, cols / 32, phys_rows, n_expert};
        const uint64_t ws[EH_MAX_DIMS] = {cols / 32, phys_rows, n_expert, 1};
        check_dims(*bt, bn, wb);
        check_dims(*st, sn, ws);
        check_bytes(*bt, bn, checked_product({16, cols / 32, phys_rows, n_expert}, bn));
        check_bytes(*st, sn, checked_product({cols / 32, phys_rows, n_expert}, sn));
        Matrix m;
        m.name = base;
        m.type = EH_TYPE_MXFP4;
        m.layout = Layout::HfMxfp4;
        m.cols = cols;
        m.rows = rows;
        m.n_expert = n_expert;
        m.phys_rows = phys_rows;
        m.row_step = step;
        m.row_offset = offset;
        m.data = static_cast<const uint8_t*>(bt->data);
        m.scales = static_cast<const uint8_t*>(st->data);
        bytes_by_type_[EH_TYPE_MXFP4] += bt->nbytes + st->nbytes;
        return m;
    }

    // A vector of n values (any shape with n elements), converted to float.
    std::vector<float> vec(const std::string& name, uint64_t n, bool required) {
        const eh_tensor* t = v_.find_tensor(name);
        if (!t) {
            if (required) throw Error(EH_MODEL_LOAD_FAILED, "missing tensor '" + name + "'");
            return {};
        }
        check_type(*t, name);
        uint64_t count = 1;
        for (uint32_t d = 0; d < t->n_dims && d < EH_MAX_DIMS; ++d)
            if (__builtin_mul_overflow(count, t->dims[d], &count))
                throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + name + "': element count overflows");
        if (count != n)
            throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + name + "' has " + std::to_string(count) +
                                                  " elements, expected " + std::to_string(n));
        const uint64_t bytes = ehp::quant::row_bytes(t->type, n);
        if (bytes == 0)
            throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + name + "' is not a whole number of blocks");
        check_bytes(*t, name, bytes);
        std::vector<float> out(n);
        ehp::quant::dequantize_row(t->type, t->data, out.data(), n);
        host_bytes_ += n * sizeof(float);
        return out;
    }

    std::string dominant_type() const {
        uint32_t best = EH_TYPE_F32;
        uint64_t most = 0;
        for (const auto& [type, bytes] : bytes_by_type_)
            if (bytes > most) { most = bytes; best = type; }
        return ehp::type_name(best);
    }
    uint64_t host_bytes() const { return host_bytes_; }

private:
    static uint64_t checked_product(std::initializer_list<uint64_t> xs, const std::string& name) {
        uint64_t p = 1;
        for (uint64_t x : xs)
            if (__builtin_mul_overflow(p, x, &p)) throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + name + "': size overflows");
        return p;
    }
    static void check_type(const eh_tensor& t, const std::string& name) {
        if (!ehp::quant::can_dequantize(t.type))
            throw Error(EH_UNSUPPORTED, "tensor '" + name + "' has type " + ehp::type_name(t.type) +
                                            ", which the cpu-reference plugin does not support (supported: F32 F16 "
                                            "BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS "
                                            "MXFP4)");
    }
    static void check_dims(const eh_tensor& t, const std::string& name, const uint64_t want[EH_MAX_DIMS]) {
        bool ok = t.n_dims >= 1 && t.n_dims <= EH_MAX_DIMS;
        for (uint32_t d = 0; ok && d < EH_MAX_DIMS; ++d) {
            const uint64_t have = d < t.n_dims ? t.dims[d] : 1;
            ok = have == want[d];
        }
        if (!ok) {
            std::string have, exp;
            for (uint32_t d = 0; d < t.n_dims && d < EH_MAX_DIMS; ++d) have += (d ? ", " : "") + std::to_string(t.dims[d]);
            for (uint32_t d = 0; d < EH_MAX_DIMS; ++d) {
                if (d >= 2 && want[d] == 1) break;
                exp += (d ? ", " : "") + std::to_string(want[d]);
            }
            throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + name + "' has dims {" + have + "}, expected {" + exp + "}");
        }
    }
    static void check_bytes(const eh_tensor& t, const std::string& name, uint64_t need) {
        if (!t.data) throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + name + "' has no data");
        if (t.nbytes < need)
            throw Error(EH_MODEL_LOAD_FAILED, "tensor '" + name + "' holds " + std::to_string(t.nbytes) +
                                                  " bytes, its shape needs " + std::to_string(need));
    }

    const ehp::ModelView& v_;
    std::map<uint32_t, uint64_t> bytes_by_type_;
    uint64_t host_bytes_ = 0;
};

// Rows [offset, offset + rows) (step 1) or every step-th row from offset of
// each expert of a fused matrix.
Matrix part(const Matrix& fused, uint64_t rows, uint64_t step, uint64_t offset) {
    Matrix m = fused;
    m.rows = rows;
    m.row_step = step;
    m.row_offset = offset;
    return m;
}

// Even (offset 0) or odd (offset 1) entries of an interleaved vector.
std::vector<float> every_other(const std::vector<float>& v, size_t offset) {
    std::vector<float> out;
    for (size_t i = offset; i < v.size(); i += 2) out.push_back(v[i]);
    return out;
}

uint32_t to_u32(uint64_t v, const std::string& key) {
    if (v > 0x7FFFFFFFu) throw Error(EH_MODEL_LOAD_FAILED, "metadata '" + key + "' is out of range");
    return static_cast<uint32_t>(v);
}

Config read_config(const ehp::ModelView& v) {
    Config c;
    c.arch_name = std::string(v.architecture());
    if (c.arch_name == "llama") c.arch = Arch::Llama;
    else if (c.arch_name == "qwen2") c.arch = Arch::Qwen2;
    else if (c.arch_name == "qwen2vl") c.arch = Arch::Qwen2;  // Qwen2-VL / Qwen2.5-VL: qwen2's tensors, M-RoPE
    else if (c.arch_name == "qwen3") c.arch = Arch::Qwen3;
    else if (c.arch_name == "qwen3moe") c.arch = Arch::Qwen3Moe;
    else if (c.arch_name == "phi3") c.arch = Arch::Phi3;
    else if (c.arch_name == "gpt2") c.arch = Arch::Gpt2;
    else if (c.arch_name == "gpt-oss") c.arch = Arch::GptOss;
    else if (c.arch_name == "gemma3") c.arch = Arch::Gemma3;
    else throw Error(EH_UNSUPPORTED, "architecture '" + c.arch_name + "' is not supported by cpu-reference "
                                     "(llama, qwen2, qwen2vl, qwen3, qwen3moe, phi3, gpt2, gpt-oss, gemma3)");

    auto key = [&](const char* s) { return v.arch_key(s); };
    auto req = [&](const char* s) { return to_u32(v.require_uint(key(s)), key(s)); };
    auto opt = [&](const char* s, uint32_t dflt) {
        auto x = v.get_uint(key(s));
        return x ? to_u32(*x, key(s)) : dflt;
    };

    c.from_safetensors = ehp::from_safetensors(v);

    if (c.arch == Arch::Qwen3Moe)
        if (const std::string why = ehp::qwen3moe_unsupported(v); !why.empty())
            throw Error(EH_UNSUPPORTED, "qwen3moe: " + why + " by cpu-reference");
    if (c.arch == Arch::Gemma3)
        if (const std::string why = ehp::gemma3::unsupported(v); !why.empty())
            throw Error(EH_UNSUPPORTED, "gemma3: " + why + " by cpu-reference");
    c.n_embd = req("embedding_length");
    c.n_layer = req("block_count");
    c.n_head = req("attention.head_count");
    c.n_head_kv = opt("attention.head_count_kv", c.n_head);
    if (c.n_embd == 0 || c.n_layer == 0 || c.n_head == 0 || c.n_head_kv == 0)
        throw Error(EH_MODEL_LOAD_FAILED, "embedding_length, block_count and head counts must be > 0");
    const uint32_t kMax = 1u << 20;  // far above any real model; keeps every product in range
    if (c.n_embd > kMax || c.n_layer > 4096 || c.n_head > 4096 || c.n_head_kv > c.n_head)
        throw Error(EH_MODEL_LOAD_FAILED, "hyperparameters out of range (embedding_length " + std::to_string(c.n_embd) +
                                              ", block_count " + std::to_string(c.n_layer) + ", head_count " +
                                              std::to_string(c.n_head) + ", head_count_kv " +
                                              std::to_string(c.n_head_kv) + ")");
    if (c.n_head % c.n_head_kv != 0)
        throw Error(EH_MODEL_LOAD_FAILED, key("attention.head_count") + " (" + std::to_string(c.n_head) +
                                              ") is not a multiple of head_count_kv (" + std::to_string(c.n_head_kv) + ")");
    c.head_dim = opt("attention.key_length", c.n_embd / c.n_head);
    const uint32_t vlen = opt("attention.value_length", c.head_dim);
    if (c.head_dim == 0 || c.head_dim > 65536 || vlen != c.head_dim)
        throw Error(EH_UNSUPPORTED, "attention key_length/value_length must be equal and > 0");
    c.n_ctx_train = opt("context_length", 0);

    if (c.arch == Arch::Gpt2) {
        c.layer_norm = true;
        c.norm_eps = static_cast<float>(v.get_float(key("attention.layer_norm_epsilon")).value_or(1e-5));
    } else {
        c.norm_eps = static_cast<float>(v.get_float(key("attention.layer_norm_rms_epsilon")).value_or(1e-5));
    }

    switch (c.arch) {
    case Arch::Llama: c.ffn = FfnKind::SwiGlu; break;
    case Arch::Qwen2: c.ffn = FfnKind::SwiGlu; break;
    case Arch::Qwen3: c.ffn = FfnKind::SwiGlu; break;
    // Qwen3-MoE: softmax router, top-k renormalised (llama.cpp always
    // renormalises for qwen3moe, as Qwen3-30B-A3B's norm_topk_prob says),
    // no shared expert, no biases.
    case Arch::Qwen3Moe: c.ffn = FfnKind::MoeSwiGlu; break;
    case Arch::Phi3: c.ffn = FfnKind::SwiGluFused; break;  // refined when tensors are bound
    case Arch::Gpt2: c.ffn = FfnKind::Gelu; break;
    case Arch::GptOss: c.ffn = FfnKind::MoeOai; break;
    case Arch::Gemma3: c.ffn = FfnKind::GeluGated; break;
    }
    if (is_moe(c.ffn)) {
        c.n_expert = req("expert_count");
        c.n_expert_used = req("expert_used_count");
        c.n_ff_exp = opt("expert_feed_forward_length", opt("feed_forward_length", 0));
        if (c.n_expert == 0 || c.n_expert_used == 0 || c.n_expert_used > c.n_expert || c.n_ff_exp == 0)
            throw Error(EH_MODEL_LOAD_FAILED, "expert_count / expert_used_count / expert_feed_forward_length invalid");
    } else {
        c.n_ff = req("feed_forward_length");
    }
    if (c.n_ff > (1u << 24) || c.n_ff_exp > (1u << 24) || c.n_expert > 65536)
        throw Error(EH_MODEL_LOAD_FAILED, "feed_forward_length / expert_count out of range");

    // Rotary embedding. GGUF llama files have Q/K rows permuted by the
    // converter so that the interleaved (Normal) rotation reproduces HF's
    // rotate_half; straight from safetensors they are not permuted, and
    // rotate_half itself is the Neox rotation.
    RopeConfig& r = c.rope;
    switch (c.arch) {
    case Arch::Llama: r.style = c.from_safetensors ? RopeStyle::Neox : RopeStyle::Normal; break;
    case Arch::Gpt2: r.style = RopeStyle::None; break;
    default: r.style = RopeStyle::Neox; break;
    }
    if (r.style != RopeStyle::None) {
        r.n_rot = opt("rope.dimension_count", c.head_dim);
        if (r.n_rot == 0 || r.n_rot > c.head_dim || r.n_rot % 2 != 0)
            throw Error(EH_MODEL_LOAD_FAILED, key("rope.dimension_count") + " must be even and <= head dim");
        // GGUF keys first; then an HF directory's rope_parameters /
        // rope_scaling objects, which the host passes through as hf.*.
        auto num = [&](const char* gguf_suffix, const char* hf_key, double dflt) {
            return ehp::rope_param(v, gguf_suffix, hf_key).value_or(dflt);
        };
        r.freq_base = static_cast<float>(num("rope.freq_base", "rope_theta", 10000.0));
        std::string scaling = ehp::rope_scaling_type(v);
        const float factor = static_cast<float>(num("rope.scaling.factor", "factor", 1.0));
        if (auto legacy = v.get_float(key("rope.scale_linear")); legacy && scaling == "none") {
            scaling = "linear";
            r.linear_factor = static_cast<float>(*legacy);
        }
        if (scaling == "linear") {
            if (factor != 1.0f) r.linear_factor = factor;
        } else if (scaling == "yarn") {
            r.yarn = true;
            r.yarn_factor = factor;
            r.yarn_orig_ctx = static_cast<uint32_t>(num("rope.scaling.original_context_length",
                                                        "original_max_position_embeddings", c.n_ctx_train));
            r.yarn_beta_fast = static_cast<float>(num("rope.scaling.yarn_beta_fast", "beta_fast", 32.0));
            r.yarn_beta_slow = static_cast<float>(num("rope.scaling.yarn_beta_slow", "beta_slow", 1.0));
            // gpt-oss's HF config sets truncate = false (no rounding of the
            // correction range); HF's default is true.
            r.yarn_truncate = c.arch != Arch::GptOss;
            for (const char* k : {"hf.rope_scaling.truncate", "hf.rope_parameters.truncate"})
                if (const eh_value* t = v.find(k); t && t->type == EH_VALUE_BOOL) r.yarn_truncate = t->v.u64 != 0;
        } else if (scaling != "none" && scaling != "llama3") {  // llama3: per-pair divisors, bound with the tensors
            throw Error(EH_UNSUPPORTED, key("rope.scaling.type") + " '" + scaling +
                                            "' is not supported by cpu-reference (none, linear, yarn, llama3)");
        }
    }

    if (r.style == RopeStyle::Neox) c.mrope = ehp::mrope::read_sections(v, r.n_rot);
    c.sliding_window = opt("attention.sliding_window", 0);
    c.swa_alternating = c.arch == Arch::GptOss;
    if (c.arch == Arch::Gemma3) {
        // HF scales the embedding by sqrt(hidden) in the model's dtype; F32 here.
        c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
        c.attn_scale = ehp::gemma3::attention_scale(v, c.n_layer, c.n_embd, c.n_head, c.head_dim);
        c.logit_softcap = ehp::gemma3::final_logit_softcap(v);
        c.rope_swa = RopeConfig{};
        c.rope_swa.style = r.style;
        c.rope_swa.n_rot = r.n_rot;
        c.rope_swa.freq_base = static_cast<float>(ehp::gemma3::local_rope_base(v));
        if (!(c.rope_swa.freq_base > 1.0f))
            throw Error(EH_MODEL_LOAD_FAILED, key("rope.freq_base_swa") + " must be > 1");
    }
    return c;
}

}  // namespace

void apply_qk_norm(const Config& c, const Layer& L, float* q, float* k, size_t T) {
    const size_t hd = c.head_dim;
    std::vector<float> tmp(hd);
    auto norm_heads = [&](const std::vector<float>& w, float* x, size_t n_heads) {
        if (w.empty()) return;
        for (size_t h = 0; h < T * n_heads; ++h) {
            rms_norm(x + h * hd, w.data(), c.norm_eps, hd, tmp.data());
            std::copy(tmp.begin(), tmp.end(), x + h * hd);
        }
    };
    norm_heads(L.q_norm, q, c.n_head);
    norm_heads(L.k_norm, k, c.n_head_kv);
}

float expert_activation(const Config& c, float gate, float up) {
    if (c.ffn == FfnKind::MoeOai) return swiglu_oai(gate, up, c.swiglu_alpha, c.swiglu_limit);
    return silu(gate) * up;
}

std::string cpu_device_name(unsigned n_threads) {
    return "CPU (" + std::to_string(n_threads) + " threads)";
}

std::string Model::device_name() const { return cpu_device_name(pool_->size()); }

Model::Model(const eh_load_params& params) : view_(params.view) {
    const ehp::ModelView v(params.view);
    auto progress = [&](float f, const char* stage) {
        if (params.progress) params.progress(params.progress_user, f, stage);
    };
    auto check_cancel = [&] {
        if (params.cancel && params.cancel(params.cancel_user))
            throw Error(EH_CANCELLED, "model load cancelled");
    };
    progress(0.0f, "reading metadata");
    cfg_ = read_config(v);
    Config& c = cfg_;
    Binder b(v);

    const uint64_t E = c.n_embd;
    const uint64_t q_dim = static_cast<uint64_t>(c.n_head) * c.head_dim;
    const uint64_t kv_dim = static_cast<uint64_t>(c.n_head_kv) * c.head_dim;

    const eh_tensor* te = v.find_tensor("token_embd.weight");
    if (!te) throw Error(EH_MODEL_LOAD_FAILED, "missing tensor 'token_embd.weight'");
    if (te->n_dims < 2 || te->dims[1] == 0 || te->dims[1] > 0x7FFFFFFFu)
        throw Error(EH_MODEL_LOAD_FAILED, "tensor 'token_embd.weight' must have dims {n_embd, n_vocab}");
    c.n_vocab = static_cast<uint32_t>(te->dims[1]);
    token_embd_ = b.matrix("token_embd.weight", E, c.n_vocab, 1, true);
    if (c.arch == Arch::Gpt2) {
        const eh_tensor* pe = v.find_tensor("position_embd.weight");
        if (!pe || pe->n_dims < 2) throw Error(EH_MODEL_LOAD_FAILED, "missing tensor 'position_embd.weight'");
        position_embd_ = b.matrix("position_embd.weight", E, pe->dims[1], 1, true);
        if (c.n_ctx_train == 0 || c.n_ctx_train > pe->dims[1]) c.n_ctx_train = static_cast<uint32_t>(pe->dims[1]);
    }
    if (b.has("rope_factors_long.weight") || b.has("rope_factors_short.weight"))
        throw Error(EH_UNSUPPORTED, "LongRoPE (rope_factors_long/short, e.g. Phi-3 128k) is not supported by "
                                    "cpu-reference");
    // Llama 3.x: the converter's rope_freqs tensor, or the same divisors
    // computed from an HF directory's "llama3" rope parameters.
    if (c.rope.style != RopeStyle::None) c.rope.freq_factors = ehp::rope_freqs(v, c.rope.n_rot, c.rope.freq_base);
    rope_ = make_rope_tables(c.rope);

    const std::vector<bool> sliding =
        c.arch == Arch::Gemma3 ? ehp::gemma3::sliding_layers(v, c.n_layer) : std::vector<bool>(c.n_layer, false);
    if (c.arch == Arch::Gemma3) rope_swa_ = make_rope_tables(c.rope_swa);
    layers_.resize(c.n_layer);
    for (uint32_t i = 0; i < c.n_layer; ++i) {
        check_cancel();
        Layer& L = layers_[i];
        L.attn_norm = b.vec(blk(i, "attn_norm.weight"), E, true);
        L.attn_norm_b = b.vec(blk(i, "attn_norm.bias"), E, c.layer_norm);
        // HF GPT-2 keeps Conv1D weights as [in, out]: column-major for us.
        const bool conv1d = c.arch == Arch::Gpt2 && c.from_safetensors;
        auto lin = [&](const char* what, uint64_t cols, uint64_t rows) {
            return conv1d ? b.transposed(blk(i, what), cols, rows, 1, 1, 0, rows) : b.matrix(blk(i, what), cols, rows, 1, true);
        };
        if (b.has(blk(i, "attn_qkv.weight"))) {
            L.wqkv = lin("attn_qkv.weight", E, q_dim + 2 * kv_dim);
            L.bqkv = b.vec(blk(i, "attn_qkv.bias"), q_dim + 2 * kv_dim, false);
        } else {
            L.wq = b.matrix(blk(i, "attn_q.weight"), E, q_dim, 1, true);
            L.wk = b.matrix(blk(i, "attn_k.weight"), E, kv_dim, 1, true);
            L.wv = b.matrix(blk(i, "attn_v.weight"), E, kv_dim, 1, true);
            L.bq = b.vec(blk(i, "attn_q.bias"), q_dim, false);
            L.bk = b.vec(blk(i, "attn_k.bias"), kv_dim, false);
            L.bv = b.vec(blk(i, "attn_v.bias"), kv_dim, false);
        }
        const bool qk_norm = c.arch == Arch::Qwen3 || c.arch == Arch::Qwen3Moe || c.arch == Arch::Gemma3;
        L.q_norm = b.vec(blk(i, "attn_q_norm.weight"), c.head_dim, qk_norm);
        L.k_norm = b.vec(blk(i, "attn_k_norm.weight"), c.head_dim, qk_norm);
        L.wo = lin("attn_output.weight", q_dim, E);
        L.bo = b.vec(blk(i, "attn_output.bias"), E, false);
        if (b.has(blk(i, "attn_sinks.weight"))) L.sinks = b.vec(blk(i, "attn_sinks.weight"), c.n_head, true);
        else if (b.has(blk(i, "attn_sinks"))) L.sinks = b.vec(blk(i, "attn_sinks"), c.n_head, true);

        const std::string ffn_norm = b.has(blk(i, "ffn_norm.weight")) ? "ffn_norm" : "post_attention_norm";
        L.ffn_norm = b.vec(blk(i, (ffn_norm + ".weight").c_str()), E, true);
        L.ffn_norm_b = b.vec(blk(i, (ffn_norm + ".bias").c_str()), E, c.layer_norm);
        if (c.arch == Arch::Gemma3) {
            L.attn_post_norm = b.vec(blk(i, "post_attention_norm.weight"), E, true);
            L.ffn_post_norm = b.vec(blk(i, "post_ffw_norm.weight"), E, true);
        }

        if (is_moe(c.ffn)) {
            const uint64_t F = c.n_ff_exp, X = c.n_expert;
            // the host names the HF router "hf.model.layers.N.mlp.router.*" when it has no GGUF name for it
            const std::string hf_router = "hf.model.layers." + std::to_string(i) + ".mlp.router";
            const bool gguf_router = b.has(blk(i, "ffn_gate_inp.weight"));
            L.router = b.matrix(gguf_router ? blk(i, "ffn_gate_inp.weight") : hf_router + ".weight", E, X, 1, true);
            L.router_b = b.vec(gguf_router ? blk(i, "ffn_gate_inp.bias") : hf_router + ".bias", X, false);
            if (c.from_safetensors && c.arch == Arch::GptOss) {
                // HF gpt-oss: one gate_up tensor with gate/up interleaved (even/odd
                // output rows), MXFP4 blocks+scales or dense [E, in, out]
                if (b.has(blk(i, "ffn_gate_up_exps.blocks"))) {
                    L.gate_exps = b.hf_mxfp4(blk(i, "ffn_gate_up_exps"), E, F, X, 2, 0, 2 * F);
                    L.up_exps = part(L.gate_exps, F, 2, 1);
                    L.down_exps = b.hf_mxfp4(blk(i, "ffn_down_exps"), F, E, X, 1, 0, E);
                } else {
                    L.gate_exps = b.transposed(blk(i, "ffn_gate_up_exps.weight"), E, F, X, 2, 0, 2 * F);
                    L.up_exps = part(L.gate_exps, F, 2, 1);
                    L.down_exps = b.transposed(blk(i, "ffn_down_exps.weight"), F, E, X, 1, 0, E);
                }
                const std::vector<float> gub = b.vec(blk(i, "ffn_gate_up_exps.bias"), 2 * F * X, false);
                if (!gub.empty()) {
                    L.gate_exps_b = every_other(gub, 0);
                    L.up_exps_b = every_other(gub, 1);
                }
            } else if (b.has(blk(i, "ffn_gate.0.weight"))) {
                // HF Qwen3-MoE, one tensor per expert
                L.gate_exps = b.expert_set(blk(i, "ffn_gate"), E, F, X);
                L.up_exps = b.expert_set(blk(i, "ffn_up"), E, F, X);
                L.down_exps = b.expert_set(blk(i, "ffn_down"), F, E, X);
            } else if (b.has(blk(i, "ffn_gate_up_exps.weight"))) {
                // GGUF fused (and HF Qwen3-MoE's fused gate_up_proj, the
                // same layout): each expert's gate rows, then its up rows
                const Matrix gu = b.matrix(blk(i, "ffn_gate_up_exps.weight"), E, 2 * F, X, true);
                L.gate_exps = part(gu, F, 1, 0);
                L.up_exps = part(gu, F, 1, F);
                const std::vector<float> gub = b.vec(blk(i, "ffn_gate_up_exps.bias"), 2 * F * X, false);
                for (size_t e = 0; e < gub.size() / (2 * F); ++e) {
                    L.gate_exps_b.insert(L.gate_exps_b.end(), gub.begin() + e * 2 * F, gub.begin() + e * 2 * F + F);
                    L.up_exps_b.insert(L.up_exps_b.end(), gub.begin() + e * 2 * F + F, gub.begin() + (e + 1) * 2 * F);
                }
            } else {
                L.gate_exps = b.matrix(blk(i, "ffn_gate_exps.weight"), E, F, X, true);
                L.up_exps = b.matrix(blk(i, "ffn_up_exps.weight"), E, F, X, true);
                L.gate_exps_b = b.vec(blk(i, "ffn_gate_exps.bias"), F * X, false);
                L.up_exps_b = b.vec(blk(i, "ffn_up_exps.bias"), F * X, false);
            }
            if (!L.down_exps) L.down_exps = b.matrix(blk(i, "ffn_down_exps.weight"), F, E, X, true);
            L.down_exps_b = b.vec(blk(i, "ffn_down_exps.bias"), E * X, false);
        } else {
            const uint64_t F = c.n_ff;
            if (c.ffn == FfnKind::SwiGluFused && b.has(blk(i, "ffn_gate.weight"))) c.ffn = FfnKind::SwiGlu;
            if (c.ffn == FfnKind::SwiGluFused) {
                L.w_up = b.matrix(blk(i, "ffn_up.weight"), E, 2 * F, 1, true);
            } else {
                if (c.ffn == FfnKind::SwiGlu || c.ffn == FfnKind::GeluGated) {
                    L.w_gate = b.matrix(blk(i, "ffn_gate.weight"), E, F, 1, true);
                    L.b_gate = b.vec(blk(i, "ffn_gate.bias"), F, false);
                }
                L.w_up = lin("ffn_up.weight", E, F);
                L.b_up = b.vec(blk(i, "ffn_up.bias"), F, false);
            }
            L.w_down = lin("ffn_down.weight", F, E);
            L.b_down = b.vec(blk(i, "ffn_down.bias"), E, false);
        }
        if (c.arch == Arch::Gemma3) {
            L.local_rope = sliding[i];
            L.window = sliding[i] ? c.sliding_window : 0;
        } else if (c.sliding_window > 0) {
            L.window = (!c.swa_alternating || i % 2 == 0) ? c.sliding_window : 0;
        }
        progress(0.05f + 0.9f * static_cast<float>(i + 1) / static_cast<float>(c.n_layer), "binding layers");
    }

    output_norm_ = b.vec("output_norm.weight", E, true);
    output_norm_b_ = b.vec("output_norm.bias", E, c.layer_norm);
    // Gemma's RMSNorm multiplies by (1 + w). llama.cpp's converter stores
    // w + 1; an HF checkpoint stores w.
    if (c.arch == Arch::Gemma3 && c.from_safetensors) {
        auto shift = [](std::vector<float>& w) {
            for (float& x : w) x += 1.0f;
        };
        for (Layer& L : layers_) {
            for (auto* w : {&L.attn_norm, &L.q_norm, &L.k_norm, &L.attn_post_norm, &L.ffn_norm, &L.ffn_post_norm})
                shift(*w);
        }
        shift(output_norm_);
    }
    // no output.weight: the embedding is tied (qwen2 small models, gpt2)
    output_ = b.has("output.weight") ? b.matrix("output.weight", E, c.n_vocab, 1, true) : token_embd_;
    check_cancel();

    dominant_type_ = b.dominant_type();
    host_bytes_ = b.host_bytes();

    unsigned n_threads = params.n_threads;
    if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
    pool_ = std::make_unique<ThreadPool>(n_threads);
    progress(1.0f, "ready");
}

}  // namespace cpuref
