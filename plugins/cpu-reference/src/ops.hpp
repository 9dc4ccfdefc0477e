// The numeric building blocks of the forward pass, each a direct transcription
// of its formula. Exposed for unit tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <engine_host/mrope.hpp>

namespace cpuref {

// out = x / sqrt(mean(x^2) + eps) * w
void rms_norm(const float* x, const float* w, float eps, size_t n, float* out);
// out = (x - mean) / sqrt(var + eps) * w + b   (b may be empty/NULL)
void layer_norm(const float* x, const float* w, const float* b, float eps, size_t n, float* out);

float silu(float x);
float gelu_tanh(float x);
// gpt-oss experts: gate clamped above at `limit`, up clamped to [-limit, limit],
// out = (up + 1) * gate * sigmoid(alpha * gate)
float swiglu_oai(float gate, float up, float alpha, float limit);

// In-place softmax over n values.
void softmax(float* x, size_t n);

// ---------------------------------------------------------------------------
// Rotary position embedding.

enum class RopeStyle {
    None,    // no rotary embedding (learned positions, gpt2)
    Normal,  // rotate pairs (2i, 2i+1): ggml's default, used by GGUF llama
    Neox     // rotate pairs (i, i + n_rot/2): HF rotate_half, qwen2, phi3, gpt-oss
};

struct RopeConfig {
    RopeStyle style = RopeStyle::None;
    uint32_t n_rot = 0;              // rotated dimensions per head (even)
    float freq_base = 10000.0f;
    float linear_factor = 1.0f;      // "linear" scaling: positions / factor
    // YaRN (HF _compute_yarn_parameters)
    bool yarn = false;
    float yarn_factor = 1.0f;
    uint32_t yarn_orig_ctx = 0;
    float yarn_beta_fast = 32.0f;
    float yarn_beta_slow = 1.0f;
    bool yarn_truncate = true;
    std::vector<float> freq_factors; // optional per-pair divisors (rope_freqs)
};

// Precomputed per-pair inverse frequencies and the cos/sin multiplier.
struct RopeTables {
    RopeStyle style = RopeStyle::None;
    uint32_t n_rot = 0;
    std::vector<float> inv_freq;    // n_rot / 2
    float attn_factor = 1.0f;       // YaRN mscale, multiplies cos and sin
};

RopeTables make_rope_tables(const RopeConfig& cfg);

// cos/sin for one position: n_rot/2 each.
void rope_cos_sin(const RopeTables& t, int64_t pos, float* cos_out, float* sin_out);
// M-RoPE: frequency i turns by the component of `pos` its section names.
void mrope_cos_sin(const RopeTables& t, const ehp::mrope::Sections& sections, const ehp::mrope::Position& pos,
                   float* cos_out, float* sin_out);

// Rotates the first n_rot values of one head vector in place.
void rope_apply(const RopeTables& t, const float* cos_v, const float* sin_v, float* head);

// ---------------------------------------------------------------------------
// Attention for one query head over cached keys/values.
//   q: head_dim floats; k, v: rows of head_dim floats, `stride` floats apart,
//   positions first..last inclusive. sink (optional) adds exp(sink) to the
//   softmax denominator, as gpt-oss's per-head sink logit does.
void attend_one(const float* q, const float* k, const float* v, size_t stride, size_t head_dim,
                int64_t first, int64_t last, float scale, const float* sink,
                float* scores_scratch, float* out);

// The same over rows that need not be evenly spaced (a paged KV cache):
// k_rows[j] and v_rows[j] are key j's and value j's head vectors, j < n.
// attend_one is this over its evenly spaced rows, so both give equal bits.
void attend_rows(const float* q, const float* const* k_rows, const float* const* v_rows, size_t n,
                 size_t head_dim, float scale, const float* sink, float* scores_scratch, float* out);

// First visible key position for a query at `pos` with a sliding window of
// `window` tokens (0 = no window): keys in (pos - window, pos] are visible.
int64_t window_start(int64_t pos, uint32_t window);

// ---------------------------------------------------------------------------
// MoE routing: the top-k experts by router logit (ties: lower index first),
// with weights softmax(selected logits).
std::vector<std::pair<int, float>> route_top_k(const float* logits, int n_expert, int k);

}  // namespace cpuref
