#include "eh/tools/profiles.hpp"

#include <array>
#include <optional>
#include <span>
#include <stdexcept>
#include <string_view>

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

// ---- the profiles: one row each, over an architecture's family ------------

KV str(std::string k, std::string_view v) { return {std::move(k), GgufValue::string(v)}; }

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

struct RopeScaling {
    const char* type = nullptr;     // rope.scaling.type and .factor are written only with a type
    float factor = 0.0f;
    uint32_t original_context = 0;  // rope.scaling.original_context_length
};

// What every profile of one architecture shares.
struct Family {
    const char* arch;
    // The {arch}.* keys in the order the architecture's converter writes them;
    // key_value() says what each one holds.
    std::vector<std::string_view> keys;
    QuantTarget target;
    uint64_t n_vocab;
    float freq_base, eps;
    uint32_t window = 0;  // attention.sliding_window
    RopeScaling rope = {};
    VocabSpec vocab;
};

std::vector<std::string_view> plus(std::vector<std::string_view> a, std::initializer_list<std::string_view> b) {
    a.insert(a.end(), b);
    return a;
}

const std::vector<std::string_view> kQwen2Keys{
    "block_count",          "context_length",          "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "rope.freq_base",   "attention.layer_norm_rms_epsilon"};
// What every llama-family converter writes.
const auto kLlamaKeys =
    plus(kQwen2Keys, {"attention.key_length", "attention.value_length", "rope.dimension_count", "vocab_size"});

// The Qwen2.5 vocabulary (Qwen3's too); it already holds Qwen2.5-VL's
// <|vision_start|>, <|image_pad|>, <|vision_end|>.
const VocabSpec kQwenVocab{"tokenizers/qwen2.5/tokenizer.json", "qwen2",
                           {{"tokenizer.ggml.eos_token_id", GgufValue::u32(151645)},
                            {"tokenizer.ggml.padding_token_id", GgufValue::u32(151643)},
                            {"tokenizer.ggml.bos_token_id", GgufValue::u32(151643)},
                            {"tokenizer.ggml.add_bos_token", GgufValue::boolean(false)}}};

const Family kQwen2{.arch = "qwen2", .keys = kQwen2Keys, .target = {Recipe::Q4_K_M, EH_TYPE_Q4_K},
                    .n_vocab = 151936, .freq_base = 1000000.0f, .eps = 1e-6f, .vocab = kQwenVocab};
// Qwen2.5-VL's text model: Qwen2.5 under architecture qwen2vl with the M-RoPE
// sections.
const Family kQwen2vl{.arch = "qwen2vl", .keys = plus(kQwen2Keys, {"rope.dimension_sections"}),
                      .target = {Recipe::Q4_K_M, EH_TYPE_Q4_K}, .n_vocab = 151936, .freq_base = 1000000.0f,
                      .eps = 1e-6f, .vocab = kQwenVocab};
// Llama 3.1's tokenizer (tiktoken-style BPE, pre "llama-bpe", 128256 ids) is
// not in the shared test data: the GPT-2 vocabulary padded to 128256 stands in.
const Family kLlama{.arch = "llama", .keys = kLlamaKeys, .target = {Recipe::Q4_K_M, EH_TYPE_Q4_K},
                    .n_vocab = 128256, .freq_base = 500000.0f, .eps = 1e-5f,
                    .vocab = {"tokenizers/gpt2/tokenizer.json", "gpt-2",
                              {{"tokenizer.ggml.bos_token_id", GgufValue::u32(50256)},
                               {"tokenizer.ggml.eos_token_id", GgufValue::u32(50256)}}}};
const Family kQwen3{.arch = "qwen3", .keys = kLlamaKeys, .target = {Recipe::Q4_K_M, EH_TYPE_Q4_K},
                    .n_vocab = 151936, .freq_base = 1000000.0f, .eps = 1e-6f, .vocab = kQwenVocab};
// Shape.n_ff is the expert width; no shared expert.
const Family kQwen3moe{.arch = "qwen3moe",
                       .keys = plus(kLlamaKeys, {"expert_count", "expert_used_count", "expert_feed_forward_length"}),
                       .target = {Recipe::Q4_K_M, EH_TYPE_Q4_K}, .n_vocab = 151936, .freq_base = 1000000.0f,
                       .eps = 1e-6f, .vocab = kQwenVocab};
const Family kPhi3{.arch = "phi3",
                   .keys = {"context_length", "rope.scaling.original_context_length", "embedding_length",
                            "feed_forward_length", "block_count", "attention.head_count", "attention.head_count_kv",
                            "attention.layer_norm_rms_epsilon", "rope.dimension_count", "rope.freq_base",
                            "attention.sliding_window"},
                   .target = {Recipe::Q4_K_M, EH_TYPE_Q4_K}, .n_vocab = 32064, .freq_base = 10000.0f, .eps = 1e-5f,
                   .window = 2047, .rope = {.original_context = 4096},
                   .vocab = {"vocab/ggml-vocab-phi-3.gguf", "", {}}};
const Family kGpt2{.arch = "gpt2",
                   .keys = {"block_count", "context_length", "embedding_length", "feed_forward_length",
                            "attention.head_count", "attention.layer_norm_epsilon"},
                   .target = {Recipe::Plain, EH_TYPE_F16}, .n_vocab = 50257, .freq_base = 0.0f, .eps = 1e-5f,
                   .vocab = {"vocab/ggml-vocab-gpt-2.gguf", "", {}}};
const Family kGptOss{.arch = "gpt-oss",
                     .keys = plus(kQwen2Keys, {"expert_count", "expert_used_count", "attention.key_length",
                                               "attention.value_length", "attention.sliding_window",
                                               "expert_feed_forward_length", "rope.scaling.type",
                                               "rope.scaling.factor", "rope.scaling.original_context_length"}),
                     .target = {Recipe::MXFP4_MOE, EH_TYPE_MXFP4}, .n_vocab = 201088, .freq_base = 150000.0f,
                     .eps = 1e-5f, .window = 128, .rope = {"yarn", 32.0f, 4096},
                     .vocab = {"tokenizers/gpt-oss-20b/tokenizer.json", "gpt-4o",
                               {{"tokenizer.ggml.bos_token_id", GgufValue::u32(199998)},
                                {"tokenizer.ggml.eos_token_id", GgufValue::u32(200002)},
                                {"tokenizer.ggml.padding_token_id", GgufValue::u32(199999)}}}};
// Gemma 3 as llama.cpp's converter writes it: q/k norms, norms after
// attention and after the MLP (stored as 1 + w), GeLU-gated MLP, tied head;
// five sliding-window layers of six (the converter writes the window,
// llama.cpp assumes the period 6), their RoPE base 10000 (llama.cpp's
// default, not written), the global layers' 1e6 with linear x8 on the 4B and
// larger. Its 262,144-entry SentencePiece vocabulary is not in the shared
// test data: the Phi-3 (Llama 2) SentencePiece vocabulary padded to 262,144
// stands in, with Gemma's add_space_prefix = false, and a turn template of
// ours in Gemma's <start_of_turn> form.
const Family kGemma3{.arch = "gemma3",
                     .keys = {"context_length", "embedding_length", "block_count", "feed_forward_length",
                              "attention.head_count", "attention.layer_norm_rms_epsilon", "attention.key_length",
                              "attention.value_length", "rope.freq_base", "attention.sliding_window",
                              "attention.head_count_kv", "rope.scaling.type", "rope.scaling.factor"},
                     .target = {Recipe::Q4_K_M, EH_TYPE_Q4_K}, .n_vocab = 262144, .freq_base = 1000000.0f,
                     .eps = 1e-6f, .window = 1024, .rope = {"linear", 8.0f},
                     .vocab = {"tokenizers/phi-3-mini/tokenizer.json", "",
                               {{"tokenizer.ggml.add_space_prefix", GgufValue::boolean(false)},
                                {"tokenizer.ggml.add_bos_token", GgufValue::boolean(true)},
                                str("tokenizer.chat_template", kGemmaTurnTemplate)}}};
const RopeScaling kUnscaled{};

// One profile. A name that starts with "tiny-" is small enough for CI.
struct Row {
    const char* name;         // forge's --like
    const Family* family;
    const char* description;  // forge --list
    const char* display;      // general.name
    const char* size_label;   // general.size_label
    Shape shape;
    // What differs from the family, where it does:
    std::optional<QuantTarget> target = std::nullopt;
    uint64_t n_vocab = 0;
    uint32_t window = 0;
    const RopeScaling* rope = nullptr;
    bool llama31_rope = false;                 // Llama 3.1's rope scaling as the rope_freqs tensor
    std::array<int32_t, 4> mrope_sections{};  // qwen2vl's rope.dimension_sections
    bool vision = false;                       // a vision tower beside it (forge's --mmproj-out)
};

// The value of one of a family's keys (the part after "{arch}.") for this
// profile; nothing for rope.scaling.type and .factor where the rope is not
// scaled.
std::optional<GgufValue> key_value(const Row& r, std::string_view k) {
    const Shape& s = r.shape;
    const Family& f = *r.family;
    const RopeScaling& rope = r.rope ? *r.rope : f.rope;
    if (k == "block_count") return GgufValue::u32(s.n_layer);
    if (k == "context_length") return GgufValue::u32(s.n_ctx);
    if (k == "embedding_length") return GgufValue::u32(s.n_embd);
    if (k == "feed_forward_length" || k == "expert_feed_forward_length") return GgufValue::u32(s.n_ff);
    if (k == "attention.head_count") return GgufValue::u32(s.n_head);
    if (k == "attention.head_count_kv") return GgufValue::u32(s.n_head_kv);
    if (k == "attention.key_length" || k == "attention.value_length" || k == "rope.dimension_count")
        return GgufValue::u32(s.head_dim);
    if (k == "expert_count") return GgufValue::u32(s.n_expert);
    if (k == "expert_used_count") return GgufValue::u32(s.n_expert_used);
    if (k == "vocab_size") return GgufValue::u32(static_cast<uint32_t>(r.n_vocab ? r.n_vocab : f.n_vocab));
    if (k == "rope.freq_base") return GgufValue::f32(f.freq_base);
    if (k == "attention.layer_norm_rms_epsilon" || k == "attention.layer_norm_epsilon") return GgufValue::f32(f.eps);
    if (k == "attention.sliding_window") return GgufValue::u32(r.window ? r.window : f.window);
    if (k == "rope.scaling.type") return rope.type ? std::optional(GgufValue::string(rope.type)) : std::nullopt;
    if (k == "rope.scaling.factor") return rope.type ? std::optional(GgufValue::f32(rope.factor)) : std::nullopt;
    if (k == "rope.scaling.original_context_length") return GgufValue::u32(rope.original_context);
    if (k == "rope.dimension_sections") return GgufValue::array(std::span<const int32_t>(r.mrope_sections));
    throw std::logic_error(fmt::format("profiles: no value for key '{}'", k));
}

Profile make(const Row& r) {
    const Family& f = *r.family;
    Profile p;
    p.name = r.name;
    p.arch = f.arch;
    p.description = r.description;
    p.tiny = std::string_view(r.name).starts_with("tiny-");
    p.n_vocab = r.n_vocab ? r.n_vocab : f.n_vocab;
    p.target = r.target.value_or(f.target);
    p.metadata = {str("general.architecture", p.arch), str("general.type", "model"), str("general.name", r.display),
                  str("general.size_label", r.size_label)};
    for (std::string_view k : f.keys)
        if (auto v = key_value(r, k)) p.metadata.emplace_back(fmt::format("{}.{}", p.arch, k), std::move(*v));
    p.vocab = f.vocab;
    p.shape = r.shape;
    if (r.llama31_rope) p.rope_freqs = ehp::llama3_rope_factors(r.shape.head_dim, f.freq_base, ehp::Llama3Rope{});
    p.vision = r.vision;
    // Gemma's image control tokens at Gemma's ids, the soft token at the last
    // id (Gemma's own, 262144, is past this vocabulary).
    if (r.vision && &f == &kGemma3)
        p.control_tokens = {{255999, "<start_of_image>"}, {256000, "<end_of_image>"}, {262143, "<image_soft_token>"}};
    return p;
}

constexpr QuantTarget kQ8_0{Recipe::Plain, EH_TYPE_Q8_0};

// Gemma 3's shapes: head size 256 (128 on the 27B) whatever the hidden size.
constexpr Shape kGemma3_4b{.n_layer = 34, .n_embd = 2560, .n_ff = 10240, .n_head = 8, .n_head_kv = 4,
                           .head_dim = 256, .n_ctx = 131072, .tied = true, .qk_norm = true};
constexpr Shape kGemma3_12b{.n_layer = 48, .n_embd = 3840, .n_ff = 15360, .n_head = 16, .n_head_kv = 8,
                            .head_dim = 256, .n_ctx = 131072, .tied = true, .qk_norm = true};
constexpr Shape kGemma3Tiny{.n_layer = 6, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
                            .n_ctx = 32768, .tied = true, .qk_norm = true};
constexpr Shape kQwen2Tiny{.n_layer = 4, .n_embd = 64, .n_ff = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 16,
                           .n_ctx = 32768, .tied = true, .qkv_bias = true};
constexpr Shape kGpt2_124m{.n_layer = 12, .n_embd = 768, .n_ff = 3072, .n_head = 12, .n_head_kv = 12,
                           .head_dim = 64, .n_ctx = 1024, .tied = true};
constexpr Shape kGpt2Tiny{.n_layer = 2, .n_embd = 64, .n_ff = 256, .n_head = 4, .n_head_kv = 4, .head_dim = 16,
                          .n_ctx = 128, .tied = true};

// Every profile by name, real sizes first: forge's --like, `forge --list`
// and the error for an unknown name all read this one table.
const Row kProfiles[] = {
    {.name = "qwen2.5-0.5b-instruct-q4_k_m", .family = &kQwen2, .description = "Qwen2.5-0.5B-Instruct Q4_K_M",
     .display = "Qwen2.5 0.5B Instruct", .size_label = "630M",
     .shape = {.n_layer = 24, .n_embd = 896, .n_ff = 4864, .n_head = 14, .n_head_kv = 2, .head_dim = 64,
               .n_ctx = 32768, .tied = true, .qkv_bias = true}},
    {.name = "phi-3-mini-4k-instruct-q4_k_m", .family = &kPhi3, .description = "Phi-3-mini-4k-instruct Q4_K_M",
     .display = "Phi 3 Mini 4k Instruct", .size_label = "3.8B",
     .shape = {.n_layer = 32, .n_embd = 3072, .n_ff = 8192, .n_head = 32, .n_head_kv = 32, .head_dim = 96,
               .n_ctx = 4096}},
    {.name = "gpt-oss-20b-mxfp4", .family = &kGptOss, .description = "gpt-oss-20b MXFP4", .display = "Gpt Oss 20b",
     .size_label = "20B",
     .shape = {.n_layer = 24, .n_embd = 2880, .n_ff = 2880, .n_head = 64, .n_head_kv = 8, .head_dim = 64,
               .n_ctx = 131072, .n_expert = 32, .n_expert_used = 4}},
    // gpt-oss-20b's layout: 36 layers of 128 experts (4 active) instead of
    // 24 of 32.
    {.name = "gpt-oss-120b-mxfp4", .family = &kGptOss, .description = "gpt-oss-120b MXFP4",
     .display = "Gpt Oss 120b", .size_label = "120B",
     .shape = {.n_layer = 36, .n_embd = 2880, .n_ff = 2880, .n_head = 64, .n_head_kv = 8, .head_dim = 64,
               .n_ctx = 131072, .n_expert = 128, .n_expert_used = 4}},
    {.name = "llama-3.1-8b-instruct-q4_k_m", .family = &kLlama, .description = "Llama-3.1-8B-Instruct Q4_K_M",
     .display = "Meta Llama 3.1 8B Instruct", .size_label = "8B",
     .shape = {.n_layer = 32, .n_embd = 4096, .n_ff = 14336, .n_head = 32, .n_head_kv = 8, .head_dim = 128,
               .n_ctx = 131072},
     .llama31_rope = true},
    // The size tensor parallelism over GPUs is for; Llama 3.1's rope and
    // vocabulary.
    {.name = "llama-3.3-70b-instruct-q4_k_m", .family = &kLlama, .description = "Llama-3.3-70B-Instruct Q4_K_M",
     .display = "Llama 3.3 70B Instruct", .size_label = "70B",
     .shape = {.n_layer = 80, .n_embd = 8192, .n_ff = 28672, .n_head = 64, .n_head_kv = 8, .head_dim = 128,
               .n_ctx = 131072},
     .llama31_rope = true},
    // head_dim 128 (4096 hidden / 32 heads happens to give 128 too; Qwen3-0.6B,
    // 4B, 14B and 32B do not), untied.
    {.name = "qwen3-8b-q4_k_m", .family = &kQwen3, .description = "Qwen3-8B Q4_K_M", .display = "Qwen3 8B",
     .size_label = "8B",
     .shape = {.n_layer = 36, .n_embd = 4096, .n_ff = 12288, .n_head = 32, .n_head_kv = 8, .head_dim = 128,
               .n_ctx = 40960, .qk_norm = true}},
    {.name = "qwen3-30b-a3b-q4_k_m", .family = &kQwen3moe, .description = "Qwen3-30B-A3B Q4_K_M",
     .display = "Qwen3 30B A3B", .size_label = "30B-A3B",
     .shape = {.n_layer = 48, .n_embd = 2048, .n_ff = 768, .n_head = 32, .n_head_kv = 4, .head_dim = 128,
               .n_ctx = 40960, .n_expert = 128, .n_expert_used = 8, .qk_norm = true}},
    {.name = "gemma-3-1b-it-q4_k_m", .family = &kGemma3, .description = "Gemma-3-1B-it Q4_K_M", .display = "Gemma 3",
     .size_label = "1b",
     .shape = {.n_layer = 26, .n_embd = 1152, .n_ff = 6912, .n_head = 4, .n_head_kv = 1, .head_dim = 256,
               .n_ctx = 32768, .tied = true, .qk_norm = true},
     .window = 512, .rope = &kUnscaled},
    {.name = "gemma-3-4b-it-q4_k_m", .family = &kGemma3, .description = "Gemma-3-4B-it Q4_K_M", .display = "Gemma 3",
     .size_label = "4b", .shape = kGemma3_4b},
    {.name = "gemma-3-12b-it-q4_k_m", .family = &kGemma3, .description = "Gemma-3-12B-it Q4_K_M",
     .display = "Gemma 3", .size_label = "12b", .shape = kGemma3_12b},
    {.name = "gemma-3-27b-it-q4_k_m", .family = &kGemma3, .description = "Gemma-3-27B-it Q4_K_M",
     .display = "Gemma 3", .size_label = "27b",
     .shape = {.n_layer = 62, .n_embd = 5376, .n_ff = 21504, .n_head = 32, .n_head_kv = 16, .head_dim = 128,
               .n_ctx = 131072, .tied = true, .qk_norm = true}},
    {.name = "gpt2-124m-f16", .family = &kGpt2, .description = "GPT-2 124M F16", .display = "GPT-2",
     .size_label = "124M", .shape = kGpt2_124m},
    {.name = "gpt2-124m-q8_0", .family = &kGpt2, .description = "GPT-2 124M Q8_0", .display = "GPT-2",
     .size_label = "124M", .shape = kGpt2_124m, .target = kQ8_0},
    {.name = "tiny-qwen2.5-q4_k_m", .family = &kQwen2,
     .description = "Qwen2.5 layout at toy size (Q4_K_M recipe, real vocab)", .display = "Tiny Qwen2.5",
     .size_label = "8M", .shape = kQwen2Tiny},
    {.name = "tiny-phi-3-q4_k_m", .family = &kPhi3,
     .description = "Phi-3 layout at toy size (Q4_K_M recipe, real vocab)", .display = "Tiny Phi 3", .size_label = "20M",
     .shape = {.n_layer = 4, .n_embd = 256, .n_ff = 256, .n_head = 4, .n_head_kv = 4, .head_dim = 64, .n_ctx = 4096}},
    {.name = "tiny-gpt-oss-mxfp4", .family = &kGptOss,
     .description = "gpt-oss layout at toy size (MXFP4 experts, real vocab)", .display = "Tiny Gpt Oss",
     .size_label = "30M",
     .shape = {.n_layer = 2, .n_embd = 64, .n_ff = 64, .n_head = 4, .n_head_kv = 2, .head_dim = 16, .n_ctx = 131072,
               .n_expert = 4, .n_expert_used = 2}},
    {.name = "tiny-llama-3.1-q4_k_m", .family = &kLlama,
     .description = "Llama 3.1 layout at toy size (Q4_K_M recipe, rope_freqs)", .display = "Tiny Llama 3.1",
     .size_label = "70M",
     .shape = {.n_layer = 2, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
               .n_ctx = 131072},
     .llama31_rope = true},
    {.name = "tiny-qwen3-q4_k_m", .family = &kQwen3,
     .description = "Qwen3 layout at toy size (Q4_K_M recipe, q/k norms, head dim 128)", .display = "Tiny Qwen3",
     .size_label = "90M",
     .shape = {.n_layer = 2, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2, .head_dim = 128,
               .n_ctx = 40960, .qk_norm = true}},
    {.name = "tiny-qwen3-moe-q4_k_m", .family = &kQwen3moe,
     .description = "Qwen3-MoE layout at toy size (Q4_K_M recipe, 8 experts)", .display = "Tiny Qwen3 MoE",
     .size_label = "60M",
     .shape = {.n_layer = 2, .n_embd = 256, .n_ff = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 128,
               .n_ctx = 40960, .n_expert = 8, .n_expert_used = 2, .qk_norm = true}},
    {.name = "tiny-gemma-3-q4_k_m", .family = &kGemma3,
     .description = "Gemma 3 layout at toy size (Q4_K_M recipe, sliding pattern, padded SPM vocab)",
     .display = "Tiny Gemma 3", .size_label = "80M", .shape = kGemma3Tiny, .window = 16},
    // Gemma's head size of 256 (the 1B to 12B), which takes other attention
    // kernels than 64 does, at toy size.
    {.name = "tiny-gemma-3-hd256-q4_k_m", .family = &kGemma3,
     .description = "Gemma 3 layout at toy size, head size 256 (Q4_K_M recipe, sliding pattern, padded SPM vocab)",
     .display = "Tiny Gemma 3", .size_label = "150M",
     .shape = {.n_layer = 6, .n_embd = 512, .n_ff = 1024, .n_head = 2, .n_head_kv = 1, .head_dim = 256,
               .n_ctx = 32768, .tied = true, .qk_norm = true},
     .window = 32},
    // The Gemma 3 vision profiles: the toy tower (forge_mmproj.cpp) beside a
    // tiny model, SigLIP-So400m's shape at 896 pixels beside a real size.
    {.name = "tiny-gemma-3-vision-q4_k_m", .family = &kGemma3,
     .description = "Gemma 3 layout at toy size with a toy vision tower (--mmproj-out)", .display = "Tiny Gemma 3",
     .size_label = "80M", .shape = kGemma3Tiny, .window = 16, .vision = true},
    {.name = "gemma-3-4b-it-vision-q4_k_m", .family = &kGemma3,
     .description = "Gemma-3-4B-it Q4_K_M with its vision tower's shape (--mmproj-out)", .display = "Gemma 3",
     .size_label = "4b", .shape = kGemma3_4b, .vision = true},
    {.name = "gemma-3-12b-it-vision-q4_k_m", .family = &kGemma3,
     .description = "Gemma-3-12B-it Q4_K_M with its vision tower's shape (--mmproj-out)", .display = "Gemma 3",
     .size_label = "12b", .shape = kGemma3_12b, .vision = true},
    // M-RoPE sections 2, 3, 3 of its 8 rotary frequencies, as 16, 24, 24 of
    // 64, and a toy vision tower (forge_mmproj.cpp).
    {.name = "tiny-qwen2.5-vl-q4_k_m", .family = &kQwen2vl,
     .description = "Qwen2.5-VL layout at toy size with a toy vision tower (--mmproj-out)",
     .display = "Tiny Qwen2.5-VL", .size_label = "8M", .shape = kQwen2Tiny, .mrope_sections = {2, 3, 3, 0},
     .vision = true},
    // The 7B's tower shape beside it (write_qwen25vl_tower: F16, 1.3 GB).
    {.name = "qwen2.5-vl-7b-instruct-q4_k_m", .family = &kQwen2vl,
     .description = "Qwen2.5-VL-7B-Instruct Q4_K_M with its vision tower's shape (--mmproj-out)",
     .display = "Qwen2.5 VL 7B Instruct", .size_label = "8.3B",
     .shape = {.n_layer = 28, .n_embd = 3584, .n_ff = 18944, .n_head = 28, .n_head_kv = 4, .head_dim = 128,
               .n_ctx = 128000, .tied = false, .qkv_bias = true},
     .n_vocab = 152064, .mrope_sections = {16, 24, 24, 0}, .vision = true},
    {.name = "tiny-gpt2-f16", .family = &kGpt2, .description = "GPT-2 layout at toy size, F16",
     .display = "Tiny GPT-2", .size_label = "4M", .shape = kGpt2Tiny},
    {.name = "tiny-gpt2-q8_0", .family = &kGpt2, .description = "GPT-2 layout at toy size, Q8_0",
     .display = "Tiny GPT-2", .size_label = "4M", .shape = kGpt2Tiny, .target = kQ8_0},
};

}  // namespace

std::vector<TensorSpec> Profile::tensors(uint64_t vocab_rows) const { return build(*this, vocab_rows); }

std::vector<std::string> profile_names() {
    std::vector<std::string> out;
    for (const Row& r : kProfiles) out.emplace_back(r.name);
    return out;
}

Profile find_profile(const std::string& name) {
    for (const Row& r : kProfiles)
        if (name == r.name) return make(r);
    std::string known;
    for (const Row& r : kProfiles) known += fmt::format("{}{}", known.empty() ? "" : ", ", r.name);
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
