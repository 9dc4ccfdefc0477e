// The recorded qwen3moe weights written back as a Hugging Face directory,
// for the tests that read one (cpu-reference's HF path, the converter).
#pragma once

#include <algorithm>
#include <deque>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>

#include "../model/safetensors_test_files.hpp"

namespace eh::reference_test {

// The recorded qwen3moe weights (an F32 GGUF, what the converter wrote from
// the transformers model) written back as a Hugging Face directory: one
// tensor per expert (`mlp.experts.<e>.gate_proj.weight`, the checkpoints on
// the Hub) or fused (`mlp.experts.gate_up_proj` [E, 2F, H] gate rows first,
// `down_proj` [E, H, F]: transformers 5's own layout).
// mistyped_expert >= 0 stores that expert's layer-0 gate_proj as F16.
inline void write_qwen3moe_hf_dir(const ehp::ModelView& v, const std::filesystem::path& out, bool fused,
                           std::deque<std::vector<uint8_t>>& keep, int mistyped_expert = -1) {
    using eh::model::testing::StTensor;
    const std::map<std::string, std::string> layer_names = {
        {"attn_norm.weight", "input_layernorm.weight"},  {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_k.weight", "self_attn.k_proj.weight"},    {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_output.weight", "self_attn.o_proj.weight"}, {"attn_q_norm.weight", "self_attn.q_norm.weight"},
        {"attn_k_norm.weight", "self_attn.k_norm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"ffn_gate_inp.weight", "mlp.gate.weight"}};
    std::vector<StTensor> tensors;
    std::vector<const void*> data;
    auto add = [&](std::string name, std::vector<uint64_t> shape, const void* p, const char* dtype = "F32") {
        tensors.push_back({std::move(name), dtype, std::move(shape)});
        data.push_back(p);
    };
    const eh_model_view& raw = v.raw();
    for (uint64_t i = 0; i < raw.n_tensors; ++i) {
        const eh_tensor& t = raw.tensors[i];
        ASSERT_EQ(t.type, uint32_t(EH_TYPE_F32));
        const std::string name(ehp::to_sv(t.name));
        std::vector<uint64_t> shape;  // PyTorch order
        for (uint32_t d = t.n_dims; d-- > 0;) shape.push_back(t.dims[d]);
        if (name == "token_embd.weight") { add("model.embed_tokens.weight", shape, t.data); continue; }
        if (name == "output_norm.weight") { add("model.norm.weight", shape, t.data); continue; }
        if (name == "output.weight") { add("lm_head.weight", shape, t.data); continue; }
        const size_t dot = name.find('.', 4);
        ASSERT_EQ(name.rfind("blk.", 0), 0u) << name;
        const std::string layer = name.substr(4, dot - 4), what = name.substr(dot + 1);
        const std::string base = "model.layers." + layer + ".";
        if (auto it = layer_names.find(what); it != layer_names.end()) {
            add(base + it->second, shape, t.data);
            continue;
        }
        const uint64_t X = t.dims[2], rows = t.dims[1], cols = t.dims[0];
        const auto* f = static_cast<const float*>(t.data);
        const std::string proj = what == "ffn_gate_exps.weight" ? "gate"
                                 : what == "ffn_up_exps.weight" ? "up"
                                 : what == "ffn_down_exps.weight" ? "down" : "";
        ASSERT_FALSE(proj.empty()) << name;
        if (!fused) {
            for (uint64_t e = 0; e < X; ++e) {
                const std::string n = base + "mlp.experts." + std::to_string(e) + "." + proj + "_proj.weight";
                if (layer == "0" && proj == "gate" && int(e) == mistyped_expert) {
                    std::vector<uint8_t>& h = keep.emplace_back(rows * cols * 2);
                    ehp::quant::quantize_row(EH_TYPE_F16, f + e * rows * cols, h.data(), rows * cols);
                    add(n, {rows, cols}, h.data(), "F16");
                } else {
                    add(n, {rows, cols}, f + e * rows * cols);
                }
            }
        } else if (proj == "down") {
            add(base + "mlp.experts.down_proj", shape, t.data);
        } else if (proj == "gate") {
            // gate_up_proj: each expert's gate rows, then its up rows
            const eh_tensor* up = v.find_tensor("blk." + layer + ".ffn_up_exps.weight");
            ASSERT_NE(up, nullptr);
            const auto* u = static_cast<const float*>(up->data);
            std::vector<uint8_t>& gu = keep.emplace_back(2 * X * rows * cols * sizeof(float));
            auto* g = reinterpret_cast<float*>(gu.data());
            for (uint64_t e = 0; e < X; ++e) {
                std::copy(f + e * rows * cols, f + (e + 1) * rows * cols, g + 2 * e * rows * cols);
                std::copy(u + e * rows * cols, u + (e + 1) * rows * cols, g + (2 * e + 1) * rows * cols);
            }
            add(base + "mlp.experts.gate_up_proj", {X, 2 * rows, cols}, gu.data());
        }
    }
    eh::model::testing::write_st_data(out / "model.safetensors", tensors, data);
    const std::string a = "qwen3moe.";
    auto u = [&](const char* k) { return std::to_string(v.require_uint(a + k)); };
    auto x = [&](const char* k) { return fmt::format("{}", v.require_float(a + k)); };
    const eh_tensor& embd = v.require_tensor("token_embd.weight");
    eh::model::testing::write_text(
        out / "config.json",
        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": " + u("embedding_length") +
            ", \"num_hidden_layers\": " + u("block_count") + ", \"num_attention_heads\": " + u("attention.head_count") +
            ", \"num_key_value_heads\": " + u("attention.head_count_kv") + ", \"head_dim\": " + u("attention.key_length") +
            ", \"moe_intermediate_size\": " + u("expert_feed_forward_length") + ", \"num_experts\": " +
            u("expert_count") + ", \"num_experts_per_tok\": " + u("expert_used_count") +
            ", \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], " +
            "\"max_position_embeddings\": " + u("context_length") + ", \"rms_norm_eps\": " +
            x("attention.layer_norm_rms_epsilon") + ", \"rope_theta\": " + x("rope.freq_base") +
            ", \"vocab_size\": " + std::to_string(embd.dims[1]) +
            ", \"intermediate_size\": " + u("feed_forward_length") +
            ", \"tie_word_embeddings\": false, \"use_sliding_window\": false, \"bos_token_id\": 1, \"eos_token_id\": 2}");
    // make_reference.py's tokenizer: WordLevel "t0".."tN" (the tests feed ids)
    std::string vocab;
    for (uint64_t i = 0; i < embd.dims[1]; ++i) vocab += fmt::format("{}\"t{}\": {}", i ? ", " : "", i, i);
    eh::model::testing::write_text(
        out / "tokenizer.json",
        "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [], \"normalizer\": null, "
        "\"pre_tokenizer\": {\"type\": \"WhitespaceSplit\"}, \"post_processor\": null, \"decoder\": null, "
        "\"model\": {\"type\": \"WordLevel\", \"vocab\": {" + vocab + "}, \"unk_token\": \"t0\"}}");
}

}  // namespace eh::reference_test
