// A batched step's attention over one layer's paged pools, once RoPE has run
// and every token's K/V is stored (src/step_attention.cpp), for every CUDA
// engine: each entry's span goes where it runs best.
//   - An entry whose span is bidirectional (an image's tokens, llama-cuda):
//     attention_span, the span's rows seeing each other.
//   - A span of kStepTensorCoreChunk tokens or more (a prefill chunk), where
//     attention_prefill_mma_takes the head dim: attention_prefill on the
//     tensor cores, query tiles against the keys read through the chunk's
//     block table.
//   - The rows between (decode rows, short chunks), one launch per run of
//     them: attention_decode_group where `group` holds and it takes them
//     (each row's query group in one block on the tensor cores, split over
//     the keys as far as the scratch holds), else attention_paged.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "ehcuda/batch.hpp"
#include "ehcuda/prefill_workspace.hpp"

namespace ehcuda {

// Prefill chunks of at least this many tokens (one query tile) take the
// tensor-core attention.
constexpr int kStepTensorCoreChunk = 64;

struct StepAttnArgs {
    // The step's rotated query rows (row t at q + t * ldq) and output rows.
    const float* q = nullptr;
    int ldq = 0;
    float* out = nullptr;
    int ldo = 0;
    // The layer's pools (a tensor-parallel rank's: its own heads), of
    // PagedAttnArgs::kv_type's element type.
    const __half* k_pool = nullptr;
    const __half* v_pool = nullptr;
    uint32_t kv_type = 0;
    int n_head = 0, n_kv = 0, head_dim = 0;
    int window = 0;
    float scale = 1.0f;
    const float* sinks = nullptr;  // gpt-oss: one logit per query head
    // Whether rows may take attention_decode_group (llama-cuda: deep decode
    // steps only), and its split scratch (none: one split).
    bool group = true;
    float* group_scratch = nullptr;
    size_t group_scratch_floats = 0;
    // attention_prefill's split scratch (attention_split_scratch); required.
    const PrefillWorkspace* pw = nullptr;
    // Whether entry i's span is bidirectional (empty: none is), and each
    // step token's reach past its own position (SpanAttnArgs::d_reach).
    std::function<bool(int)> bidirectional;
    const int32_t* d_reach = nullptr;
};

void step_attention(const StepAttnArgs& a, const StepView& v, cudaStream_t stream);

}  // namespace ehcuda
