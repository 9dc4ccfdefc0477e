// Tiny in-memory models for the plugin tests: metadata and tensors built
// here and handed to the plugin as an eh_model_view, the way the host would.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <engine_host/quant_blocks.hpp>

namespace cpuref_test {

// Owns everything a view points at.
class OwnedView {
public:
    explicit OwnedView(std::string arch) : arch_(std::move(arch)) {}
    OwnedView(const OwnedView&) = delete;
    OwnedView& operator=(const OwnedView&) = delete;

    void u32(const std::string& key, uint64_t v) { add(key, EH_VALUE_U32).v.u64 = v; }
    void f32(const std::string& key, double v) { add(key, EH_VALUE_F32).v.f64 = v; }
    void str(const std::string& key, const std::string& v) { add(key, EH_VALUE_STRING).v.str = s(v); }
    void f32s(const std::string& key, const std::vector<float>& v) {
        std::vector<uint8_t>& b = blobs_.emplace_back(v.size() * sizeof(float));
        std::memcpy(b.data(), v.data(), b.size());
        eh_value& x = add(key, EH_VALUE_ARRAY);
        x.elem_type = EH_VALUE_F32;
        x.count = v.size();
        x.v.array = b.data();
    }
    void i64s(const std::string& key, const std::vector<int64_t>& v) {
        std::vector<uint8_t>& b = blobs_.emplace_back(v.size() * sizeof(int64_t));
        std::memcpy(b.data(), v.data(), b.size());
        eh_value& x = add(key, EH_VALUE_ARRAY);
        x.elem_type = EH_VALUE_I64;
        x.count = v.size();
        x.v.array = b.data();
    }
    void i32s(const std::string& key, const std::vector<int32_t>& v) {
        std::vector<uint8_t>& b = blobs_.emplace_back(v.size() * sizeof(int32_t));
        std::memcpy(b.data(), v.data(), b.size());
        eh_value& x = add(key, EH_VALUE_ARRAY);
        x.elem_type = EH_VALUE_I32;
        x.count = v.size();
        x.v.array = b.data();
    }

    // Stores `values` as `type` (quantized when it is a block type).
    void tensor(const std::string& name, uint32_t type, std::vector<uint64_t> dims, const std::vector<float>& values) {
        const uint64_t n = values.size();
        std::vector<uint8_t>& blob = blobs_.emplace_back(ehp::quant::row_bytes(type, n));
        if (!ehp::quant::quantize_row(type, values.data(), blob.data(), n)) throw std::runtime_error("quantize " + name);
        raw(name, type, std::move(dims), blob.data(), blob.size());
    }
    void raw(const std::string& name, uint32_t type, std::vector<uint64_t> dims, const void* data, uint64_t nbytes) {
        eh_tensor t{};
        t.name = s(name);
        t.type = type;
        t.n_dims = static_cast<uint32_t>(dims.size());
        for (int i = 0; i < EH_MAX_DIMS; ++i) t.dims[i] = i < static_cast<int>(dims.size()) ? dims[static_cast<size_t>(i)] : 1;
        t.data = data;
        t.nbytes = nbytes;
        tensors_.push_back(t);
    }
    // A byte buffer owned by the view, for raw tensors.
    std::vector<uint8_t>& bytes() { return blobs_.emplace_back(); }

    eh_tensor* find(const std::string& name) {
        for (auto& t : tensors_)
            if (std::string(t.name.data, t.name.size) == name) return &t;
        return nullptr;
    }
    void remove(const std::string& name) {
        for (size_t i = 0; i < tensors_.size(); ++i)
            if (std::string(tensors_[i].name.data, tensors_[i].name.size) == name) {
                tensors_.erase(tensors_.begin() + static_cast<long>(i));
                return;
            }
    }

    const eh_model_view* view() {
        view_.struct_size = sizeof(eh_model_view);
        view_.format = EH_FORMAT_GGUF;
        view_.architecture = s(arch_);
        view_.n_metadata = kvs_.size();
        view_.metadata = kvs_.data();
        view_.n_tensors = tensors_.size();
        view_.tensors = tensors_.data();
        return &view_;
    }
    const std::string& arch() const { return arch_; }

private:
    eh_string s(const std::string& v) {
        const std::string& stored = strings_.emplace_back(v);
        return eh_string{stored.data(), stored.size()};
    }
    eh_value& add(const std::string& key, uint32_t type) {
        eh_metadata_kv kv{};
        kv.key = s(key);
        kv.value.type = type;
        kv.value.count = 1;
        kvs_.push_back(kv);
        return kvs_.back().value;
    }

    std::string arch_;
    std::deque<std::string> strings_;
    std::deque<std::vector<uint8_t>> blobs_;
    std::vector<eh_metadata_kv> kvs_;
    std::vector<eh_tensor> tensors_;
    eh_model_view view_{};
};

struct TinySpec {
    std::string arch = "llama";
    uint32_t n_embd = 256, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 256, n_vocab = 64, n_ctx = 64;
    uint32_t window = 0;                 // sliding window (phi3, gpt-oss)
    uint32_t n_expert = 4, n_expert_used = 2;
    uint32_t matrix_type = EH_TYPE_F32;  // type of every 2D/3D weight
    uint32_t expert_type = 0;            // gpt-oss experts; 0 = matrix_type
    bool dequantized_copy = false;       // store matrices as F32 holding dequant(quant(w))
    bool safetensors = false;            // llama: HF row order + general.source_format
    // Tensor layouts of the same weights: as llama.cpp's converter writes
    // them (Gguf, or GgufFused for a fused gate_up expert tensor), or as a
    // Hugging Face checkpoint stores them behind the host's name mapping
    // (Hf: GPT-2 Conv1D [in, out], gpt-oss experts [E, in, out] with gate/up
    // interleaved, HF router name; HfMxfp4: gpt-oss experts as HF MXFP4
    // blocks + scales, requires expert_type MXFP4).
    enum class Layout { Gguf, GgufFused, Hf, HfMxfp4 } layout = Layout::Gguf;
    uint64_t seed = 1;
    std::vector<int32_t> mrope_sections;  // qwen2vl: {arch}.rope.dimension_sections
};

inline std::unique_ptr<OwnedView> make_tiny(const TinySpec& sp) {
    auto v = std::make_unique<OwnedView>(sp.arch);
    const std::string a = sp.arch;
    const bool gpt2 = a == "gpt2", oss = a == "gpt-oss", phi3 = a == "phi3", q3moe = a == "qwen3moe";
    const uint32_t hd = sp.n_embd / sp.n_head;
    const uint32_t n_kv = gpt2 ? sp.n_head : sp.n_head_kv;
    const uint64_t E = sp.n_embd, Q = uint64_t(sp.n_head) * hd, KV = uint64_t(n_kv) * hd, F = sp.n_ff;

    const bool hf = sp.layout == TinySpec::Layout::Hf || sp.layout == TinySpec::Layout::HfMxfp4;
    v->str("general.architecture", a);
    if (sp.safetensors || hf) v->str("general.source_format", "safetensors");
    v->u32(a + ".embedding_length", E);
    v->u32(a + ".block_count", sp.n_layer);
    v->u32(a + ".attention.head_count", sp.n_head);
    v->u32(a + ".attention.head_count_kv", n_kv);
    v->u32(a + ".context_length", sp.n_ctx);
    if (gpt2) v->f32(a + ".attention.layer_norm_epsilon", 1e-5);
    else v->f32(a + ".attention.layer_norm_rms_epsilon", 1e-5);
    if (!gpt2) {
        v->f32(a + ".rope.freq_base", oss ? 150000.0 : 10000.0);
        v->u32(a + ".rope.dimension_count", hd);
    }
    if (q3moe) {
        v->u32(a + ".expert_count", sp.n_expert);
        v->u32(a + ".expert_used_count", sp.n_expert_used);
        v->u32(a + ".expert_feed_forward_length", F);
    } else if (oss) {
        v->u32(a + ".expert_count", sp.n_expert);
        v->u32(a + ".expert_used_count", sp.n_expert_used);
        v->u32(a + ".expert_feed_forward_length", F);
        v->str(a + ".rope.scaling.type", "yarn");
        v->f32(a + ".rope.scaling.factor", 32.0);
        v->u32(a + ".rope.scaling.original_context_length", 16);
    } else {
        v->u32(a + ".feed_forward_length", F);
    }
    if (sp.window) v->u32(a + ".attention.sliding_window", sp.window);
    if (!sp.mrope_sections.empty()) v->i32s(a + ".rope.dimension_sections", sp.mrope_sections);

    std::mt19937_64 rng(sp.seed);
    auto rand_vec = [&](size_t n, float scale, float offset) {
        std::uniform_real_distribution<float> d(-scale, scale);
        std::vector<float> x(n);
        for (auto& e : x) e = offset + d(rng);
        return x;
    };
    auto store = [&](const std::string& name, std::vector<uint64_t> dims, std::vector<float> x, uint32_t type) {
        if (sp.dequantized_copy && type != EH_TYPE_F32) {
            std::vector<uint8_t> q(ehp::quant::row_bytes(type, x.size()));
            ehp::quant::quantize_row(type, x.data(), q.data(), x.size());
            ehp::quant::dequantize_row(type, q.data(), x.data(), x.size());
            type = EH_TYPE_F32;
        }
        v->tensor(name, type, std::move(dims), x);
    };
    auto matrix = [&](const std::string& name, uint64_t cols, uint64_t rows) {
        store(name, {cols, rows}, rand_vec(cols * rows, 1.0f / std::sqrt(float(cols)), 0.0f), sp.matrix_type);
    };
    auto vec = [&](const std::string& name, uint64_t n, float scale, float offset) {
        v->tensor(name, EH_TYPE_F32, {n}, rand_vec(n, scale, offset));
    };
    // GPT-2's Conv1D weights: HF keeps them [in, out]
    auto conv1d = [&](const std::string& name, uint64_t cols, uint64_t rows) {
        std::vector<float> w = rand_vec(cols * rows, 1.0f / std::sqrt(float(cols)), 0.0f);
        if (!hf) return store(name, {cols, rows}, w, sp.matrix_type);
        std::vector<float> t(w.size());
        for (uint64_t r = 0; r < rows; ++r)
            for (uint64_t k = 0; k < cols; ++k) t[k * rows + r] = w[r * cols + k];
        v->tensor(name, EH_TYPE_F32, {rows, cols}, t);
    };
    // llama GGUF files carry Q/K rows reordered so that interleaved rope
    // reproduces HF's rotate_half; HF files do not.
    auto qk_matrix = [&](const std::string& name, uint64_t heads) {
        std::vector<float> w = rand_vec(E * heads * hd, 1.0f / std::sqrt(float(E)), 0.0f);
        if (a == "llama" && !sp.safetensors) {
            std::vector<float> p(w.size());
            for (uint64_t h = 0; h < heads; ++h)
                for (uint64_t i = 0; i < hd / 2; ++i) {
                    std::memcpy(&p[(h * hd + 2 * i) * E], &w[(h * hd + i) * E], E * sizeof(float));
                    std::memcpy(&p[(h * hd + 2 * i + 1) * E], &w[(h * hd + hd / 2 + i) * E], E * sizeof(float));
                }
            w.swap(p);
        }
        store(name, {E, heads * hd}, w, sp.matrix_type);
    };

    store("token_embd.weight", {E, sp.n_vocab}, rand_vec(E * sp.n_vocab, 1.0f, 0.0f), sp.matrix_type);
    if (gpt2) store("position_embd.weight", {E, sp.n_ctx}, rand_vec(E * sp.n_ctx, 0.3f, 0.0f), sp.matrix_type);
    for (uint32_t i = 0; i < sp.n_layer; ++i) {
        const std::string b = "blk." + std::to_string(i) + ".";
        vec(b + "attn_norm.weight", E, 0.1f, 1.0f);
        if (gpt2) vec(b + "attn_norm.bias", E, 0.1f, 0.0f);
        if (gpt2) {
            conv1d(b + "attn_qkv.weight", E, Q + 2 * KV);
            vec(b + "attn_qkv.bias", Q + 2 * KV, 0.1f, 0.0f);
        } else if (phi3) {
            matrix(b + "attn_qkv.weight", E, Q + 2 * KV);
            if (gpt2) vec(b + "attn_qkv.bias", Q + 2 * KV, 0.1f, 0.0f);
        } else {
            qk_matrix(b + "attn_q.weight", sp.n_head);
            qk_matrix(b + "attn_k.weight", n_kv);
            matrix(b + "attn_v.weight", E, KV);
            if (a == "qwen3" || q3moe) {  // per-head RMSNorm of q and k before RoPE
                vec(b + "attn_q_norm.weight", hd, 0.1f, 1.0f);
                vec(b + "attn_k_norm.weight", hd, 0.1f, 1.0f);
            }
            if (a == "qwen2" || a == "qwen2vl" || oss) {
                // biases are permuted like their rows would be; qwen2/gpt-oss use neox, no permutation
                vec(b + "attn_q.bias", Q, 0.1f, 0.0f);
                vec(b + "attn_k.bias", KV, 0.1f, 0.0f);
                vec(b + "attn_v.bias", KV, 0.1f, 0.0f);
            }
        }
        if (gpt2) conv1d(b + "attn_output.weight", Q, E);
        else matrix(b + "attn_output.weight", Q, E);
        if (gpt2 || oss) vec(b + "attn_output.bias", E, 0.1f, 0.0f);
        if (oss) vec(b + "attn_sinks.weight", sp.n_head, 1.0f, 0.0f);
        if (oss) {
            vec(b + "post_attention_norm.weight", E, 0.1f, 1.0f);
            const uint32_t et = sp.expert_type ? sp.expert_type : sp.matrix_type;
            const uint64_t X = sp.n_expert;
            const std::string router = hf ? "hf.model.layers." + std::to_string(i) + ".mlp.router" : b + "ffn_gate_inp";
            store(router + ".weight", {E, X}, rand_vec(E * X, 1.0f / std::sqrt(float(E)), 0.0f), sp.matrix_type);
            v->tensor(router + ".bias", EH_TYPE_F32, {X}, rand_vec(X, 0.1f, 0.0f));
            // expert weights in GGUF order: [X][rows][cols]
            std::vector<float> G = rand_vec(E * F * X, 2.0f / std::sqrt(float(E)), 0.0f);
            std::vector<float> U = rand_vec(E * F * X, 2.0f / std::sqrt(float(E)), 0.0f);
            std::vector<float> D = rand_vec(E * F * X, 1.0f / std::sqrt(float(F)), 0.0f);
            std::vector<float> gb = rand_vec(F * X, 0.1f, 0.0f), ub = rand_vec(F * X, 0.1f, 0.0f);
            std::vector<float> db = rand_vec(E * X, 0.1f, 0.0f);
            if (sp.layout == TinySpec::Layout::Gguf) {
                store(b + "ffn_gate_exps.weight", {E, F, X}, G, et);
                store(b + "ffn_up_exps.weight", {E, F, X}, U, et);
                store(b + "ffn_down_exps.weight", {F, E, X}, D, et);
                v->tensor(b + "ffn_gate_exps.bias", EH_TYPE_F32, {F, X}, gb);
                v->tensor(b + "ffn_up_exps.bias", EH_TYPE_F32, {F, X}, ub);
            } else if (sp.layout == TinySpec::Layout::GgufFused) {
                std::vector<float> gu, gub;
                for (uint64_t x = 0; x < X; ++x) {
                    gu.insert(gu.end(), G.begin() + x * F * E, G.begin() + (x + 1) * F * E);
                    gu.insert(gu.end(), U.begin() + x * F * E, U.begin() + (x + 1) * F * E);
                    gub.insert(gub.end(), gb.begin() + x * F, gb.begin() + (x + 1) * F);
                    gub.insert(gub.end(), ub.begin() + x * F, ub.begin() + (x + 1) * F);
                }
                store(b + "ffn_gate_up_exps.weight", {E, 2 * F, X}, gu, et);
                store(b + "ffn_down_exps.weight", {F, E, X}, D, et);
                v->tensor(b + "ffn_gate_up_exps.bias", EH_TYPE_F32, {2 * F, X}, gub);
            } else if (sp.layout == TinySpec::Layout::Hf) {
                // gate_up_proj [X][E][2F] (gate even, up odd), down_proj [X][F][E]
                std::vector<float> gu(2 * F * E * X), dn(E * F * X), gub(2 * F * X);
                for (uint64_t x = 0; x < X; ++x) {
                    for (uint64_t f = 0; f < F; ++f) {
                        for (uint64_t k = 0; k < E; ++k) {
                            gu[x * E * 2 * F + k * 2 * F + 2 * f] = G[(x * F + f) * E + k];
                            gu[x * E * 2 * F + k * 2 * F + 2 * f + 1] = U[(x * F + f) * E + k];
                        }
                        gub[x * 2 * F + 2 * f] = gb[x * F + f];
                        gub[x * 2 * F + 2 * f + 1] = ub[x * F + f];
                    }
                    for (uint64_t h = 0; h < E; ++h)
                        for (uint64_t f = 0; f < F; ++f) dn[x * F * E + f * E + h] = D[(x * E + h) * F + f];
                }
                v->tensor(b + "ffn_gate_up_exps.weight", EH_TYPE_F32, {2 * F, E, X}, gu);
                v->tensor(b + "ffn_down_exps.weight", EH_TYPE_F32, {E, F, X}, dn);
                v->tensor(b + "ffn_gate_up_exps.bias", EH_TYPE_F32, {2 * F, X}, gub);
            } else {
                // HF MXFP4: rows as in GGUF (gate/up interleaved), each 32-value
                // block as a scale byte in `scales` and 16 bytes holding values
                // (2j, 2j+1) in byte j
                auto hf_blocks = [&](const std::vector<float>& w, uint64_t rows, uint64_t cols,
                                     std::vector<uint8_t>& blocks, std::vector<uint8_t>& scales) {
                    for (uint64_t r = 0; r < rows; ++r)
                        for (uint64_t c0 = 0; c0 < cols; c0 += 32) {
                            ehp::quant::block_mxfp4 q;
                            ehp::quant::quantize_block(&w[r * cols + c0], q);
                            uint8_t code[32];
                            for (int j = 0; j < 16; ++j) {
                                code[j] = q.qs[j] & 0x0F;
                                code[j + 16] = q.qs[j] >> 4;
                            }
                            scales.push_back(q.e);
                            for (int j = 0; j < 16; ++j) blocks.push_back(static_cast<uint8_t>(code[2 * j] | (code[2 * j + 1] << 4)));
                        }
                };
                std::vector<float> gu;  // [X][2F][E], rows interleaved
                std::vector<float> gub(2 * F * X);
                for (uint64_t x = 0; x < X; ++x)
                    for (uint64_t f = 0; f < F; ++f) {
                        gu.insert(gu.end(), G.begin() + (x * F + f) * E, G.begin() + (x * F + f + 1) * E);
                        gu.insert(gu.end(), U.begin() + (x * F + f) * E, U.begin() + (x * F + f + 1) * E);
                        gub[x * 2 * F + 2 * f] = gb[x * F + f];
                        gub[x * 2 * F + 2 * f + 1] = ub[x * F + f];
                    }
                auto& gblk = v->bytes(), &gsc = v->bytes(), &dblk = v->bytes(), &dsc = v->bytes();
                hf_blocks(gu, 2 * F * X, E, gblk, gsc);
                hf_blocks(D, E * X, F, dblk, dsc);
                v->raw(b + "ffn_gate_up_exps.blocks", EH_TYPE_U8, {16, E / 32, 2 * F, X}, gblk.data(), gblk.size());
                v->raw(b + "ffn_gate_up_exps.scales", EH_TYPE_U8, {E / 32, 2 * F, X}, gsc.data(), gsc.size());
                v->raw(b + "ffn_down_exps.blocks", EH_TYPE_U8, {16, F / 32, E, X}, dblk.data(), dblk.size());
                v->raw(b + "ffn_down_exps.scales", EH_TYPE_U8, {F / 32, E, X}, dsc.data(), dsc.size());
                v->tensor(b + "ffn_gate_up_exps.bias", EH_TYPE_F32, {2 * F, X}, gub);
            }
            v->tensor(b + "ffn_down_exps.bias", EH_TYPE_F32, {E, X}, db);
        } else if (q3moe) {
            // softmax router without bias, experts gate/up/down, no shared expert
            const uint64_t X = sp.n_expert;
            vec(b + "ffn_norm.weight", E, 0.1f, 1.0f);
            store(b + "ffn_gate_inp.weight", {E, X}, rand_vec(E * X, 1.0f / std::sqrt(float(E)), 0.0f), sp.matrix_type);
            store(b + "ffn_gate_exps.weight", {E, F, X}, rand_vec(E * F * X, 2.0f / std::sqrt(float(E)), 0.0f), sp.matrix_type);
            store(b + "ffn_up_exps.weight", {E, F, X}, rand_vec(E * F * X, 2.0f / std::sqrt(float(E)), 0.0f), sp.matrix_type);
            store(b + "ffn_down_exps.weight", {F, E, X}, rand_vec(E * F * X, 1.0f / std::sqrt(float(F)), 0.0f), sp.matrix_type);
        } else {
            vec(b + "ffn_norm.weight", E, 0.1f, 1.0f);
            if (gpt2) vec(b + "ffn_norm.bias", E, 0.1f, 0.0f);
            if (phi3) {
                matrix(b + "ffn_up.weight", E, 2 * F);
            } else {
                if (!gpt2) matrix(b + "ffn_gate.weight", E, F);
                if (gpt2) conv1d(b + "ffn_up.weight", E, F);
                else matrix(b + "ffn_up.weight", E, F);
                if (gpt2) vec(b + "ffn_up.bias", F, 0.1f, 0.0f);
            }
            if (gpt2) conv1d(b + "ffn_down.weight", F, E);
            else matrix(b + "ffn_down.weight", F, E);
            if (gpt2) vec(b + "ffn_down.bias", E, 0.1f, 0.0f);
        }
    }
    vec("output_norm.weight", E, 0.1f, 1.0f);
    if (gpt2) vec("output_norm.bias", E, 0.1f, 0.0f);
    if (a != "qwen2" && !gpt2) matrix("output.weight", E, sp.n_vocab);  // qwen2, gpt2: tied
    return v;
}

}  // namespace cpuref_test
