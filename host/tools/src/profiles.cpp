#include "eh/tools/profiles.hpp"

#include <array>
#include <span>

#include <fmt/format.h>

#include <engine_host/rope_scaling.hpp>
#include <engine_host/tensor_types.h>

#include "eh/error.hpp"

namespace eh::tools {

namespace {

using model::GgufValue;
using KV = std::pair<std::string, GgufValue>;
using Shape = Profile::Shape;

std::string blk(uint32_t i, const char* what) { return fmt::format("blk.{}.{}", i, what); }

// The source type a converter writes before quantization: F32 for vectors,
// norms and the tensors llama.cpp never quantizes, F16 for the rest.
uint32_t source_type(const std::string& name, const std::vector<uint64_t>& dims) {
    return is_quantizable(name, dims) ? EH_TYPE_F16 : EH_TYPE_F32;
}

struct Builder {
    const Profile& p;
    ModelFacts facts;
    std::vector<TensorSpec> out;

    void add(std::string name, std::vector<uint64_t> dims, Init init = Init::Normal, float scale = 0.02f) {
        const uint32_t src = source_type(name, dims);
        const uint32_t type = choose_type(p.target, facts, name, dims, src);
        out.push_back({std::move(name), std::move(dims), type, init, scale, {}});
    }
    void norm(std::string name, uint64_t n) { add(std::move(name), {n}, Init::Ones); }
};

std::vector<TensorSpec> build(const Profile& p, uint64_t n_vocab) {
    const auto& s = p.shape;
    Builder b{p, {s.n_layer, !s.tied}, {}};
    const uint64_t E = s.n_embd, F = s.n_ff, X = s.n_expert;
    const uint64_t q_dim = uint64_t(s.n_head) * s.head_dim, kv_dim = uint64_t(s.n_head_kv) * s.head_dim;

    b.add("token_embd.weight", {E, n_vocab});
    if (!p.rope_freqs.empty()) {
        b.add("rope_freqs.weight", {p.rope_freqs.size()}, Init::Values);
        b.out.back().values = p.rope_freqs;
    }
    if (p.arch == "gpt2") b.add("position_embd.weight", {E, s.n_ctx}, Init::Normal, 0.01f);
    for (uint32_t i = 0; i < s.n_layer; ++i) {
        b.norm(blk(i, "attn_norm.weight"), E);
        if (p.arch == "gpt2") {
            b.add(blk(i, "attn_norm.bias"), {E});
            b.add(blk(i, "attn_qkv.weight"), {E, 3 * E});
            b.add(blk(i, "attn_qkv.bias"), {3 * E});
            b.add(blk(i, "attn_output.weight"), {E, E});
            b.add(blk(i, "attn_output.bias"), {E});
            b.norm(blk(i, "ffn_norm.weight"), E);
            b.add(blk(i, "ffn_norm.bias"), {E});
            b.add(blk(i, "ffn_up.weight"), {E, F});
            b.add(blk(i, "ffn_up.bias"), {F});
            b.add(blk(i, "ffn_down.weight"), {F, E});
            b.add(blk(i, "ffn_down.bias"), {E});
            continue;
        }
        if (p.arch == "phi3") {
            b.add(blk(i, "attn_qkv.weight"), {E, q_dim + 2 * kv_dim});
            b.add(blk(i, "attn_output.weight"), {q_dim, E});
            b.norm(blk(i, "ffn_norm.weight"), E);
            b.add(blk(i, "ffn_up.weight"), {E, 2 * F});  // gate and up, fused
            b.add(blk(i, "ffn_down.weight"), {F, E});
            continue;
        }
        const bool bias = s.qkv_bias || p.arch == "gpt-oss";
        b.add(blk(i, "attn_q.weight"), {E, q_dim});
        if (bias) b.add(blk(i, "attn_q.bias"), {q_dim});
        b.add(blk(i, "attn_k.weight"), {E, kv_dim});
        if (bias) b.add(blk(i, "attn_k.bias"), {kv_dim});
        b.add(blk(i, "attn_v.weight"), {E, kv_dim});
        if (bias) b.add(blk(i, "attn_v.bias"), {kv_dim});
        if (s.qk_norm) {
            b.norm(blk(i, "attn_q_norm.weight"), s.head_dim);
            b.norm(blk(i, "attn_k_norm.weight"), s.head_dim);
        }
        b.add(blk(i, "attn_output.weight"), {q_dim, E});
        if (p.arch == "gemma3") {  // a norm after attention and after the MLP
            b.norm(blk(i, "post_attention_norm.weight"), E);
            b.norm(blk(i, "ffn_norm.weight"), E);
            b.add(blk(i, "ffn_gate.weight"), {E, F});
            b.add(blk(i, "ffn_up.weight"), {E, F});
            b.add(blk(i, "ffn_down.weight"), {F, E});
            b.norm(blk(i, "post_ffw_norm.weight"), E);
            continue;
        }
        if (p.arch == "gpt-oss") {
            b.add(blk(i, "attn_output.bias"), {E});
            b.add(blk(i, "attn_sinks.weight"), {s.n_head}, Init::Normal, 0.5f);
            b.norm(blk(i, "post_attention_norm.weight"), E);
            b.add(blk(i, "ffn_gate_inp.weight"), {E, X});
            b.add(blk(i, "ffn_gate_inp.bias"), {X});
            b.add(blk(i, "ffn_gate_exps.weight"), {E, F, X});
            b.add(blk(i, "ffn_gate_exps.bias"), {F, X});
            b.add(blk(i, "ffn_up_exps.weight"), {E, F, X});
            b.add(blk(i, "ffn_up_exps.bias"), {F, X});
            b.add(blk(i, "ffn_down_exps.weight"), {F, E, X});
            b.add(blk(i, "ffn_down_exps.bias"), {E, X});
            continue;
        }
        b.norm(blk(i, "ffn_norm.weight"), E);
        if (p.arch == "qwen3moe") {  // router + expert stacks, no shared expert
            b.add(blk(i, "ffn_gate_inp.weight"), {E, X});
            b.add(blk(i, "ffn_gate_exps.weight"), {E, F, X});
            b.add(blk(i, "ffn_up_exps.weight"), {E, F, X});
            b.add(blk(i, "ffn_down_exps.weight"), {F, E, X});
            continue;
        }
        b.add(blk(i, "ffn_gate.weight"), {E, F});
        b.add(blk(i, "ffn_up.weight"), {E, F});
        b.add(blk(i, "ffn_down.weight"), {F, E});
    }
    b.norm("output_norm.weight", E);
    if (p.arch == "gpt2") b.add("output_norm.bias", {E});
    // GPT-2's converter writes the tied head out as output.weight too.
    if (!s.tied || p.arch == "gpt2") b.add("output.weight", {E, n_vocab});
    return std::move(b.out);
}

// ---- metadata per architecture ---------------------------------------------

KV u32(std::string k, uint32_t v) { return {std::move(k), GgufValue::u32(v)}; }
KV f32(std::string k, float v) { return {std::move(k), GgufValue::f32(v)}; }
KV str(std::string k, std::string_view v) { return {std::move(k), GgufValue::string(v)}; }
KV boolean(std::string k, bool v) { return {std::move(k), GgufValue::boolean(v)}; }

// Gemma's turn format (<start_of_turn>role ... <end_of_turn>, the assistant
// named "model", a system message folded into the first user turn), written
// for the forged files: ours, not the published template.
constexpr const char* kGemmaTurnTemplate =
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] + '\n\n' %}{% set rest = messages[1:] %}"
    "{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ first if loop.first else '' }}{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

void general(Profile& p, std::string_view name, std::string_view size_label) {
    p.metadata.push_back(str("general.architecture", p.arch));
    p.metadata.push_back(str("general.type", "model"));
    p.metadata.push_back(str("general.name", name));
    p.metadata.push_back(str("general.size_label", size_label));
}

// size: "tiny", "0.5b", or "vl-7b" (Qwen2.5-VL-7B's text model, before
// qwen2vl() makes it one).
Profile qwen2(std::string name, std::string_view size) {
    Profile p;
    const bool tiny = size == "tiny";
    p.name = std::move(name);
    p.arch = "qwen2";
    p.tiny = tiny;
    p.target = {Recipe::Q4_K_M, EH_TYPE_Q4_K};
    p.n_vocab = 151936;
    auto& s = p.shape;
    if (tiny) s = Shape{.n_layer = 4, .n_embd = 64, .n_ff = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 16,
                        .n_ctx = 32768, .tied = true, .qkv_bias = true};
    else if (size == "vl-7b") {
        s = Shape{.n_layer = 28, .n_embd = 3584, .n_ff = 18944, .n_head = 28, .n_head_kv = 4, .head_dim = 128,
                  .n_ctx = 128000, .tied = false, .qkv_bias = true};
        p.n_vocab = 152064;
    } else s = Shape{.n_layer = 24, .n_embd = 896, .n_ff = 4864, .n_head = 14, .n_head_kv = 2, .head_dim = 64,
                   .n_ctx = 32768, .tied = true, .qkv_bias = true};
    p.description = tiny ? "Qwen2.5 layout at toy size (Q4_K_M recipe, real vocab)"
                    : size == "vl-7b" ? "Qwen2.5-VL-7B-Instruct Q4_K_M"
                                      : "Qwen2.5-0.5B-Instruct Q4_K_M";
    general(p, tiny ? "Tiny Qwen2.5" : size == "vl-7b" ? "Qwen2.5 VL 7B Instruct" : "Qwen2.5 0.5B Instruct",
            tiny ? "8M" : size == "vl-7b" ? "8.3B" : "630M");
    const std::string a = "qwen2.";
    p.metadata.push_back(u32(a + "block_count", s.n_layer));
    p.metadata.push_back(u32(a + "context_length", s.n_ctx));
    p.metadata.push_back(u32(a + "embedding_length", s.n_embd));
    p.metadata.push_back(u32(a + "feed_forward_length", s.n_ff));
    p.metadata.push_back(u32(a + "attention.head_count", s.n_head));
    p.metadata.push_back(u32(a + "attention.head_count_kv", s.n_head_kv));
    p.metadata.push_back(f32(a + "rope.freq_base", 1000000.0f));
    p.metadata.push_back(f32(a + "attention.layer_norm_rms_epsilon", 1e-6f));
    p.vocab.default_source = "tokenizers/qwen2.5/tokenizer.json";
    p.vocab.pre = "qwen2";
    p.vocab.extra.push_back(u32("tokenizer.ggml.eos_token_id", 151645));
    p.vocab.extra.push_back(u32("tokenizer.ggml.padding_token_id", 151643));
    p.vocab.extra.push_back(u32("tokenizer.ggml.bos_token_id", 151643));
    p.vocab.extra.push_back(boolean("tokenizer.ggml.add_bos_token", false));
    return p;
}

// The keys every llama-family converter writes ({a}.block_count ... eps).
void llama_family_keys(Profile& p, float freq_base, float eps) {
    const auto& s = p.shape;
    const std::string a = p.arch + ".";
    p.metadata.push_back(u32(a + "block_count", s.n_layer));
    p.metadata.push_back(u32(a + "context_length", s.n_ctx));
    p.metadata.push_back(u32(a + "embedding_length", s.n_embd));
    p.metadata.push_back(u32(a + "feed_forward_length", s.n_ff));
    p.metadata.push_back(u32(a + "attention.head_count", s.n_head));
    p.metadata.push_back(u32(a + "attention.head_count_kv", s.n_head_kv));
    p.metadata.push_back(f32(a + "rope.freq_base", freq_base));
    p.metadata.push_back(f32(a + "attention.layer_norm_rms_epsilon", eps));
    p.metadata.push_back(u32(a + "attention.key_length", s.head_dim));
    p.metadata.push_back(u32(a + "attention.value_length", s.head_dim));
    p.metadata.push_back(u32(a + "rope.dimension_count", s.head_dim));
    p.metadata.push_back(u32(a + "vocab_size", static_cast<uint32_t>(p.n_vocab)));
}

// Llama-3.1-8B-Instruct Q4_K_M: llama with llama3 rope scaling, stored as
// the rope_freqs tensor (factor 8, low 1, high 4, original context 8192).
// Its tokenizer (tiktoken-style BPE, pre "llama-bpe", 128256 ids) is not in
// the shared test data: the GPT-2 vocabulary padded to 128256 stands in.
// big: Llama-3.3-70B-Instruct's shape (80 layers, hidden 8192, FFN 28672,
// 64 query / 8 KV heads), the same rope and vocabulary: the size tensor
// parallelism over GPUs is for.
Profile llama3(std::string name, bool tiny, bool big = false) {
    Profile p;
    p.name = std::move(name);
    p.arch = "llama";
    p.tiny = tiny;
    p.target = {Recipe::Q4_K_M, EH_TYPE_Q4_K};
    p.n_vocab = 128256;
    auto& s = p.shape;
    if (tiny) s = Shape{.n_layer = 2, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
                        .n_ctx = 131072};
    else if (big) s = Shape{.n_layer = 80, .n_embd = 8192, .n_ff = 28672, .n_head = 64, .n_head_kv = 8,
                            .head_dim = 128, .n_ctx = 131072};
    else s = Shape{.n_layer = 32, .n_embd = 4096, .n_ff = 14336, .n_head = 32, .n_head_kv = 8, .head_dim = 128,
                   .n_ctx = 131072};
    p.description = tiny  ? "Llama 3.1 layout at toy size (Q4_K_M recipe, rope_freqs)"
                    : big ? "Llama-3.3-70B-Instruct Q4_K_M"
                          : "Llama-3.1-8B-Instruct Q4_K_M";
    general(p, tiny ? "Tiny Llama 3.1" : big ? "Llama 3.3 70B Instruct" : "Meta Llama 3.1 8B Instruct",
            tiny ? "70M" : big ? "70B" : "8B");
    llama_family_keys(p, 500000.0f, 1e-5f);
    ehp::Llama3Rope r;  // Llama 3.1's published parameters
    r.factor = 8.0;
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.original_context = 8192.0;
    p.rope_freqs = ehp::llama3_rope_factors(s.head_dim, 500000.0, r);
    p.vocab.default_source = "tokenizers/gpt2/tokenizer.json";
    p.vocab.pre = "gpt-2";
    p.vocab.extra.push_back(u32("tokenizer.ggml.bos_token_id", 50256));
    p.vocab.extra.push_back(u32("tokenizer.ggml.eos_token_id", 50256));
    return p;
}

// Qwen3-8B Q4_K_M: per-head q/k norms, head_dim 128 (4096 hidden / 32
// heads happens to give 128 too; Qwen3-0.6B/4B/14B/32B do not), untied.
Profile qwen3(std::string name, bool tiny) {
    Profile p;
    p.name = std::move(name);
    p.arch = "qwen3";
    p.tiny = tiny;
    p.target = {Recipe::Q4_K_M, EH_TYPE_Q4_K};
    p.n_vocab = 151936;
    auto& s = p.shape;
    if (tiny) s = Shape{.n_layer = 2, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2, .head_dim = 128,
                        .n_ctx = 40960, .qk_norm = true};
    else s = Shape{.n_layer = 36, .n_embd = 4096, .n_ff = 12288, .n_head = 32, .n_head_kv = 8, .head_dim = 128,
                   .n_ctx = 40960, .qk_norm = true};
    p.description = tiny ? "Qwen3 layout at toy size (Q4_K_M recipe, q/k norms, head dim 128)" : "Qwen3-8B Q4_K_M";
    general(p, tiny ? "Tiny Qwen3" : "Qwen3 8B", tiny ? "90M" : "8B");
    llama_family_keys(p, 1000000.0f, 1e-6f);
    p.vocab.default_source = "tokenizers/qwen2.5/tokenizer.json";
    p.vocab.pre = "qwen2";
    p.vocab.extra.push_back(u32("tokenizer.ggml.eos_token_id", 151645));
    p.vocab.extra.push_back(u32("tokenizer.ggml.padding_token_id", 151643));
    p.vocab.extra.push_back(u32("tokenizer.ggml.bos_token_id", 151643));
    p.vocab.extra.push_back(boolean("tokenizer.ggml.add_bos_token", false));
    return p;
}

// Qwen3-30B-A3B Q4_K_M: Qwen3 attention (32 heads, 4 KV, head_dim 128 on
// 2048 hidden), 48 layers of 128 experts (8 active, 768 wide), no shared
// expert. Shape.n_ff is the expert width.
Profile qwen3moe(std::string name, bool tiny) {
    Profile p;
    p.name = std::move(name);
    p.arch = "qwen3moe";
    p.tiny = tiny;
    p.target = {Recipe::Q4_K_M, EH_TYPE_Q4_K};
    p.n_vocab = 151936;
    auto& s = p.shape;
    if (tiny) s = Shape{.n_layer = 2, .n_embd = 256, .n_ff = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 128,
                        .n_ctx = 40960, .n_expert = 8, .n_expert_used = 2, .qk_norm = true};
    else s = Shape{.n_layer = 48, .n_embd = 2048, .n_ff = 768, .n_head = 32, .n_head_kv = 4, .head_dim = 128,
                   .n_ctx = 40960, .n_expert = 128, .n_expert_used = 8, .qk_norm = true};
    p.description = tiny ? "Qwen3-MoE layout at toy size (Q4_K_M recipe, 8 experts)" : "Qwen3-30B-A3B Q4_K_M";
    general(p, tiny ? "Tiny Qwen3 MoE" : "Qwen3 30B A3B", tiny ? "60M" : "30B-A3B");
    llama_family_keys(p, 1000000.0f, 1e-6f);
    p.metadata.push_back(u32("qwen3moe.expert_count", s.n_expert));
    p.metadata.push_back(u32("qwen3moe.expert_used_count", s.n_expert_used));
    p.metadata.push_back(u32("qwen3moe.expert_feed_forward_length", s.n_ff));
    p.vocab = qwen3("", tiny).vocab;
    return p;
}

Profile phi3(std::string name, bool tiny) {
    Profile p;
    p.name = std::move(name);
    p.arch = "phi3";
    p.tiny = tiny;
    p.target = {Recipe::Q4_K_M, EH_TYPE_Q4_K};
    p.n_vocab = 32064;
    auto& s = p.shape;
    if (tiny) s = Shape{.n_layer = 4, .n_embd = 256, .n_ff = 256, .n_head = 4, .n_head_kv = 4, .head_dim = 64,
                        .n_ctx = 4096};
    else s = Shape{.n_layer = 32, .n_embd = 3072, .n_ff = 8192, .n_head = 32, .n_head_kv = 32, .head_dim = 96,
                   .n_ctx = 4096};
    p.description = tiny ? "Phi-3 layout at toy size (Q4_K_M recipe, real vocab)"
                         : "Phi-3-mini-4k-instruct Q4_K_M";
    general(p, tiny ? "Tiny Phi 3" : "Phi 3 Mini 4k Instruct", tiny ? "20M" : "3.8B");
    const std::string a = "phi3.";
    p.metadata.push_back(u32(a + "context_length", s.n_ctx));
    p.metadata.push_back(u32(a + "rope.scaling.original_context_length", s.n_ctx));
    p.metadata.push_back(u32(a + "embedding_length", s.n_embd));
    p.metadata.push_back(u32(a + "feed_forward_length", s.n_ff));
    p.metadata.push_back(u32(a + "block_count", s.n_layer));
    p.metadata.push_back(u32(a + "attention.head_count", s.n_head));
    p.metadata.push_back(u32(a + "attention.head_count_kv", s.n_head_kv));
    p.metadata.push_back(f32(a + "attention.layer_norm_rms_epsilon", 1e-5f));
    p.metadata.push_back(u32(a + "rope.dimension_count", s.head_dim));
    p.metadata.push_back(f32(a + "rope.freq_base", 10000.0f));
    p.metadata.push_back(u32(a + "attention.sliding_window", 2047));
    p.vocab.default_source = "vocab/ggml-vocab-phi-3.gguf";
    return p;
}

Profile gpt2(std::string name, bool tiny, uint32_t type) {
    Profile p;
    p.name = std::move(name);
    p.arch = "gpt2";
    p.tiny = tiny;
    p.target = {Recipe::Plain, type};
    p.n_vocab = 50257;
    auto& s = p.shape;
    if (tiny) s = Shape{.n_layer = 2, .n_embd = 64, .n_ff = 256, .n_head = 4, .n_head_kv = 4, .head_dim = 16,
                        .n_ctx = 128, .tied = true};
    else s = Shape{.n_layer = 12, .n_embd = 768, .n_ff = 3072, .n_head = 12, .n_head_kv = 12, .head_dim = 64,
                   .n_ctx = 1024, .tied = true};
    p.description = fmt::format("GPT-2{} {}", tiny ? " layout at toy size," : " 124M", p.target.name());
    general(p, tiny ? "Tiny GPT-2" : "GPT-2", tiny ? "4M" : "124M");
    const std::string a = "gpt2.";
    p.metadata.push_back(u32(a + "block_count", s.n_layer));
    p.metadata.push_back(u32(a + "context_length", s.n_ctx));
    p.metadata.push_back(u32(a + "embedding_length", s.n_embd));
    p.metadata.push_back(u32(a + "feed_forward_length", s.n_ff));
    p.metadata.push_back(u32(a + "attention.head_count", s.n_head));
    p.metadata.push_back(f32(a + "attention.layer_norm_epsilon", 1e-5f));
    p.vocab.default_source = "vocab/ggml-vocab-gpt-2.gguf";
    return p;
}

// gpt-oss-120b shares gpt-oss-20b's layout: 36 layers of 128 experts (4
// active) instead of 24 of 32, 64 query heads.
Profile gpt_oss(std::string name, bool tiny, bool big = false) {
    Profile p;
    p.name = std::move(name);
    p.arch = "gpt-oss";
    p.tiny = tiny;
    p.target = {Recipe::MXFP4_MOE, EH_TYPE_MXFP4};
    p.n_vocab = 201088;
    auto& s = p.shape;
    if (tiny) s = Shape{.n_layer = 2, .n_embd = 64, .n_ff = 64, .n_head = 4, .n_head_kv = 2, .head_dim = 16,
                        .n_ctx = 131072, .n_expert = 4, .n_expert_used = 2};
    else if (big) s = Shape{.n_layer = 36, .n_embd = 2880, .n_ff = 2880, .n_head = 64, .n_head_kv = 8, .head_dim = 64,
                            .n_ctx = 131072, .n_expert = 128, .n_expert_used = 4};
    else s = Shape{.n_layer = 24, .n_embd = 2880, .n_ff = 2880, .n_head = 64, .n_head_kv = 8, .head_dim = 64,
                   .n_ctx = 131072, .n_expert = 32, .n_expert_used = 4};
    p.description = tiny ? "gpt-oss layout at toy size (MXFP4 experts, real vocab)"
                         : (big ? "gpt-oss-120b MXFP4" : "gpt-oss-20b MXFP4");
    general(p, tiny ? "Tiny Gpt Oss" : (big ? "Gpt Oss 120b" : "Gpt Oss 20b"), tiny ? "30M" : (big ? "120B" : "20B"));
    const std::string a = "gpt-oss.";
    p.metadata.push_back(u32(a + "block_count", s.n_layer));
    p.metadata.push_back(u32(a + "context_length", s.n_ctx));
    p.metadata.push_back(u32(a + "embedding_length", s.n_embd));
    p.metadata.push_back(u32(a + "feed_forward_length", s.n_ff));
    p.metadata.push_back(u32(a + "attention.head_count", s.n_head));
    p.metadata.push_back(u32(a + "attention.head_count_kv", s.n_head_kv));
    p.metadata.push_back(f32(a + "rope.freq_base", 150000.0f));
    p.metadata.push_back(f32(a + "attention.layer_norm_rms_epsilon", 1e-5f));
    p.metadata.push_back(u32(a + "expert_count", s.n_expert));
    p.metadata.push_back(u32(a + "expert_used_count", s.n_expert_used));
    p.metadata.push_back(u32(a + "attention.key_length", s.head_dim));
    p.metadata.push_back(u32(a + "attention.value_length", s.head_dim));
    p.metadata.push_back(u32(a + "attention.sliding_window", 128));
    p.metadata.push_back(u32(a + "expert_feed_forward_length", s.n_ff));
    p.metadata.push_back(str(a + "rope.scaling.type", "yarn"));
    p.metadata.push_back(f32(a + "rope.scaling.factor", 32.0f));
    p.metadata.push_back(u32(a + "rope.scaling.original_context_length", 4096));
    p.vocab.default_source = "tokenizers/gpt-oss-20b/tokenizer.json";
    p.vocab.pre = "gpt-4o";
    p.vocab.extra.push_back(u32("tokenizer.ggml.bos_token_id", 199998));
    p.vocab.extra.push_back(u32("tokenizer.ggml.eos_token_id", 200002));
    p.vocab.extra.push_back(u32("tokenizer.ggml.padding_token_id", 199999));
    return p;
}

// Gemma 3 (1B, 4B, 12B, 27B) Q4_K_M as llama.cpp's converter writes it:
// head size 256 (128 on the 27B) whatever the hidden size, q/k norms, norms
// after attention and after the MLP (stored as 1 + w), GeLU-gated MLP, tied
// head; five sliding-window layers of six (the converter writes the window,
// llama.cpp assumes the period 6), their RoPE base 10000 (llama.cpp's
// default, not written), the global layers' 1e6 with linear x8 on the 4B
// and larger. Its 262,144-entry SentencePiece vocabulary is not in the
// shared test data: the Phi-3 (Llama 2) SentencePiece vocabulary padded to
// 262,144 stands in, with Gemma's add_space_prefix = false, and a turn
// template of ours in Gemma's <start_of_turn> form.
Profile gemma3(std::string name, const char* size) {
    Profile p;
    p.name = std::move(name);
    p.arch = "gemma3";
    p.tiny = std::string_view(size).substr(0, 4) == "tiny";
    p.target = {Recipe::Q4_K_M, EH_TYPE_Q4_K};
    p.n_vocab = 262144;
    auto& s = p.shape;
    uint32_t window = 1024;
    float linear = 8.0f;
    const std::string_view z = size;
    if (z == "tiny") {
        s = Shape{.n_layer = 6, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
                  .n_ctx = 32768, .tied = true, .qk_norm = true};
        window = 16;
    } else if (z == "tiny-hd256") {
        // Gemma's head size of 256 (the 1B to 12B), which takes other
        // attention kernels than 64 does, at toy size.
        s = Shape{.n_layer = 6, .n_embd = 512, .n_ff = 1024, .n_head = 2, .n_head_kv = 1, .head_dim = 256,
                  .n_ctx = 32768, .tied = true, .qk_norm = true};
        window = 32;
    } else if (z == "1b") {
        s = Shape{.n_layer = 26, .n_embd = 1152, .n_ff = 6912, .n_head = 4, .n_head_kv = 1, .head_dim = 256,
                  .n_ctx = 32768, .tied = true, .qk_norm = true};
        window = 512;
        linear = 1.0f;
    } else if (z == "4b") {
        s = Shape{.n_layer = 34, .n_embd = 2560, .n_ff = 10240, .n_head = 8, .n_head_kv = 4, .head_dim = 256,
                  .n_ctx = 131072, .tied = true, .qk_norm = true};
    } else if (z == "12b") {
        s = Shape{.n_layer = 48, .n_embd = 3840, .n_ff = 15360, .n_head = 16, .n_head_kv = 8, .head_dim = 256,
                  .n_ctx = 131072, .tied = true, .qk_norm = true};
    } else {
        s = Shape{.n_layer = 62, .n_embd = 5376, .n_ff = 21504, .n_head = 32, .n_head_kv = 16, .head_dim = 128,
                  .n_ctx = 131072, .tied = true, .qk_norm = true};
    }
    const bool tiny = p.tiny;
    p.description = tiny ? fmt::format("Gemma 3 layout at toy size{} (Q4_K_M recipe, sliding pattern, padded SPM vocab)",
                                       z == "tiny-hd256" ? ", head size 256" : "")
                         : fmt::format("Gemma-3-{}-it Q4_K_M", size == std::string_view("1b") ? "1B"
                                                                 : size == std::string_view("4b") ? "4B"
                                                                 : size == std::string_view("12b") ? "12B" : "27B");
    general(p, tiny ? "Tiny Gemma 3" : "Gemma 3", z == "tiny" ? "80M" : tiny ? "150M" : size);
    const std::string a = "gemma3.";
    p.metadata.push_back(u32(a + "context_length", s.n_ctx));
    p.metadata.push_back(u32(a + "embedding_length", s.n_embd));
    p.metadata.push_back(u32(a + "block_count", s.n_layer));
    p.metadata.push_back(u32(a + "feed_forward_length", s.n_ff));
    p.metadata.push_back(u32(a + "attention.head_count", s.n_head));
    p.metadata.push_back(f32(a + "attention.layer_norm_rms_epsilon", 1e-6f));
    p.metadata.push_back(u32(a + "attention.key_length", s.head_dim));
    p.metadata.push_back(u32(a + "attention.value_length", s.head_dim));
    p.metadata.push_back(f32(a + "rope.freq_base", 1000000.0f));
    p.metadata.push_back(u32(a + "attention.sliding_window", window));
    p.metadata.push_back(u32(a + "attention.head_count_kv", s.n_head_kv));
    if (linear != 1.0f) {
        p.metadata.push_back(str(a + "rope.scaling.type", "linear"));
        p.metadata.push_back(f32(a + "rope.scaling.factor", linear));
    }
    p.vocab.default_source = "tokenizers/phi-3-mini/tokenizer.json";
    p.vocab.extra.push_back(boolean("tokenizer.ggml.add_space_prefix", false));
    p.vocab.extra.push_back(boolean("tokenizer.ggml.add_bos_token", true));
    p.vocab.extra.push_back(str("tokenizer.chat_template", kGemmaTurnTemplate));
    return p;
}

// A Gemma 3 with Gemma's image control tokens (at Gemma's ids, the soft
// token at the last id: Gemma's own, 262144, is past this vocabulary) and a
// vision tower (forge_mmproj.cpp): the toy one for a tiny model, else
// SigLIP-So400m's shape at 896 pixels.
// A Qwen2.5 profile as Qwen2.5-VL's text model: architecture qwen2vl, the
// M-RoPE sections, a vision tower beside it. The Qwen2.5 vocabulary already
// holds <|vision_start|>, <|image_pad|>, <|vision_end|>.
Profile qwen2vl(Profile p, const char* display, std::array<int32_t, 4> sections, const char* description) {
    p.arch = "qwen2vl";
    for (auto& [k, v] : p.metadata) {
        if (k.rfind("qwen2.", 0) == 0) k = "qwen2vl." + k.substr(6);
        if (k == "general.architecture") v = str(k, "qwen2vl").second;
        if (k == "general.name") v = str(k, display).second;
    }
    p.metadata.emplace_back("qwen2vl.rope.dimension_sections",
                            GgufValue::array(std::span<const int32_t>(sections.data(), 4)));
    p.description = description;
    p.vision = true;
    return p;
}

Profile gemma3_vision(Profile p) {
    p.description = p.tiny ? "Gemma 3 layout at toy size with a toy vision tower (--mmproj-out)"
                           : p.description + " with its vision tower's shape (--mmproj-out)";
    p.vision = true;
    p.control_tokens = {{255999, "<start_of_image>"}, {256000, "<end_of_image>"}, {262143, "<image_soft_token>"}};
    return p;
}

// Every profile by name, real sizes first: forge's --like, `forge --list`
// and the error for an unknown name all read this one table.
struct Entry {
    const char* name;
    Profile (*make)(std::string name);
};
const Entry kProfiles[] = {
    {"qwen2.5-0.5b-instruct-q4_k_m", [](std::string n) { return qwen2(std::move(n), "0.5b"); }},
    {"phi-3-mini-4k-instruct-q4_k_m", [](std::string n) { return phi3(std::move(n), false); }},
    {"gpt-oss-20b-mxfp4", [](std::string n) { return gpt_oss(std::move(n), false); }},
    {"gpt-oss-120b-mxfp4", [](std::string n) { return gpt_oss(std::move(n), false, true); }},
    {"llama-3.1-8b-instruct-q4_k_m", [](std::string n) { return llama3(std::move(n), false); }},
    {"llama-3.3-70b-instruct-q4_k_m", [](std::string n) { return llama3(std::move(n), false, true); }},
    {"qwen3-8b-q4_k_m", [](std::string n) { return qwen3(std::move(n), false); }},
    {"qwen3-30b-a3b-q4_k_m", [](std::string n) { return qwen3moe(std::move(n), false); }},
    {"gemma-3-1b-it-q4_k_m", [](std::string n) { return gemma3(std::move(n), "1b"); }},
    {"gemma-3-4b-it-q4_k_m", [](std::string n) { return gemma3(std::move(n), "4b"); }},
    {"gemma-3-12b-it-q4_k_m", [](std::string n) { return gemma3(std::move(n), "12b"); }},
    {"gemma-3-27b-it-q4_k_m", [](std::string n) { return gemma3(std::move(n), "27b"); }},
    {"gpt2-124m-f16", [](std::string n) { return gpt2(std::move(n), false, EH_TYPE_F16); }},
    {"gpt2-124m-q8_0", [](std::string n) { return gpt2(std::move(n), false, EH_TYPE_Q8_0); }},
    {"tiny-qwen2.5-q4_k_m", [](std::string n) { return qwen2(std::move(n), "tiny"); }},
    {"tiny-phi-3-q4_k_m", [](std::string n) { return phi3(std::move(n), true); }},
    {"tiny-gpt-oss-mxfp4", [](std::string n) { return gpt_oss(std::move(n), true); }},
    {"tiny-llama-3.1-q4_k_m", [](std::string n) { return llama3(std::move(n), true); }},
    {"tiny-qwen3-q4_k_m", [](std::string n) { return qwen3(std::move(n), true); }},
    {"tiny-qwen3-moe-q4_k_m", [](std::string n) { return qwen3moe(std::move(n), true); }},
    {"tiny-gemma-3-q4_k_m", [](std::string n) { return gemma3(std::move(n), "tiny"); }},
    {"tiny-gemma-3-hd256-q4_k_m", [](std::string n) { return gemma3(std::move(n), "tiny-hd256"); }},
    {"tiny-gemma-3-vision-q4_k_m", [](std::string n) { return gemma3_vision(gemma3(std::move(n), "tiny")); }},
    {"gemma-3-4b-it-vision-q4_k_m", [](std::string n) { return gemma3_vision(gemma3(std::move(n), "4b")); }},
    {"gemma-3-12b-it-vision-q4_k_m", [](std::string n) { return gemma3_vision(gemma3(std::move(n), "12b")); }},
    {"tiny-qwen2.5-vl-q4_k_m", [](std::string n) {
         // M-RoPE sections 2, 3, 3 of its 8 rotary frequencies, as 16, 24, 24
         // of 64, and a toy vision tower (forge_mmproj.cpp).
         return qwen2vl(qwen2(std::move(n), "tiny"), "Tiny Qwen2.5-VL", {2, 3, 3, 0},
                        "Qwen2.5-VL layout at toy size with a toy vision tower (--mmproj-out)");
     }},
    {"qwen2.5-vl-7b-instruct-q4_k_m", [](std::string n) {
         // The 7B's tower shape beside it (write_qwen25vl_tower: F16, 1.3 GB).
         return qwen2vl(qwen2(std::move(n), "vl-7b"), "Qwen2.5 VL 7B Instruct", {16, 24, 24, 0},
                        "Qwen2.5-VL-7B-Instruct Q4_K_M with its vision tower's shape (--mmproj-out)");
     }},
    {"tiny-gpt2-f16", [](std::string n) { return gpt2(std::move(n), true, EH_TYPE_F16); }},
    {"tiny-gpt2-q8_0", [](std::string n) { return gpt2(std::move(n), true, EH_TYPE_Q8_0); }},
};

}  // namespace

std::vector<TensorSpec> Profile::tensors(uint64_t vocab_rows) const { return build(*this, vocab_rows); }

std::vector<std::string> profile_names() {
    std::vector<std::string> out;
    for (const Entry& e : kProfiles) out.emplace_back(e.name);
    return out;
}

Profile find_profile(const std::string& name) {
    for (const Entry& e : kProfiles)
        if (name == e.name) return e.make(name);
    std::string known;
    for (const Entry& e : kProfiles) known += fmt::format("{}{}", known.empty() ? "" : ", ", e.name);
    throw Error(Code::InvalidRequest, fmt::format("unknown profile '{}' (known: {})", name, known));
}

std::map<std::string, int> census(const std::vector<TensorSpec>& tensors) {
    std::map<std::string, int> out;
    for (const auto& t : tensors) {
        const char* n = eh_tensor_type_traits(t.type).name;
        ++out[n ? n : fmt::format("type#{}", t.type)];
    }
    return out;
}

}  // namespace eh::tools
