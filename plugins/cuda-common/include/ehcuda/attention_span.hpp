// Prefill attention for a chunk that carries an image span whose positions
// attend to each other both ways (ABI 1.6 EH_SPAN_BIDIRECTIONAL, Gemma 3's
// image tokens; src/attention_span.cu). Like attention_paged's rows, each
// query row reads its own sequence's keys through its block table, but row
// t sees keys up to d_pos[t] + d_reach[t]: 0 for a causal row, and for a
// row of such a span the positions up to the span's end (already stored:
// the step stores every token's K/V before any attention). It runs only for
// chunks that carry such a span (once per image), so it is kept simple.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ehcuda {

struct SpanAttnArgs {
    const float* q = nullptr;  // row t: [n_head][head_dim], stride ldq
    int ldq = 0;
    // FP16 pools of one layer, laid out as attention_paged.hpp says.
    const __half* k_pool = nullptr;
    const __half* v_pool = nullptr;
    int n_head = 0, n_kv = 0, head_dim = 0;
    int ntok = 0;
    const int32_t* d_pos = nullptr;    // row t's position
    const int32_t* d_table = nullptr;  // offset of its block ids in tables
    const int32_t* tables = nullptr;
    const int32_t* d_reach = nullptr;  // row t's keys past its own position (>= 0)
    // Keys before d_pos[t] - window + 1 are not seen (window > 0; the
    // window runs from the row's own position, as a causal row's).
    int window = 0;
    float scale = 1.0f;
    float* out = nullptr;  // row t: [n_head][head_dim], stride ldo
    int ldo = 0;
};

// Whether attention_span takes this head dim (even, 2 .. 256).
bool attention_span_takes(int head_dim);
// Throws ehp::Error (EH_UNSUPPORTED) for a head dim it does not take.
void attention_span(const SpanAttnArgs& a, cudaStream_t stream);

}  // namespace ehcuda
