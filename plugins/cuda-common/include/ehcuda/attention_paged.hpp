// Attention of a batched step (src/attention_paged.cu): every query row of
// the step attends its own sequence's keys through that sequence's block
// table into the paged KV pool, so decode tokens of many sequences and
// prefill chunks share one launch. Optional per-head sink logits and a
// sliding window cover gpt-oss.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ehcuda {

// Positions per KV block in the pools of the CUDA plugins.
constexpr int kPagedBlockTokens = 16;

struct PagedAttnArgs {
    const float* q = nullptr;  // row t: [n_head][head_dim], stride ldq
    int ldq = 0;
    // Pools of one layer: row (block * kPagedBlockTokens + pos % kPagedBlockTokens)
    // holds [n_kv][head_dim].
    const __half* k_pool = nullptr;
    const __half* v_pool = nullptr;
    int n_head = 0, n_kv = 0, head_dim = 0;
    int ntok = 0;
    // The pools' element type: 0 or EH_TYPE_F16 (halves), or EH_TYPE_Q8_0 /
    // EH_TYPE_FP8_E4M3, whose rows are bytes laid out as kv_quant.hpp says
    // (k_pool / v_pool then point at those bytes; head dims multiples of 32).
    uint32_t kv_type = 0;
    // Row t is at position d_pos[t] of the sequence whose block ids start at
    // tables + d_table[t]; it attends that sequence's keys 0 .. d_pos[t]
    // (already stored), the last `window` of them when window > 0.
    const int32_t* d_pos = nullptr;
    const int32_t* d_table = nullptr;
    const int32_t* tables = nullptr;
    int window = 0;
    float scale = 1.0f;
    // Optional (gpt-oss): one logit per query head that joins every row's
    // softmax denominator (exp(sink - max)) but adds no value row.
    const float* sinks = nullptr;
    float* out = nullptr;  // row t: [n_head][head_dim], stride ldo
    int ldo = 0;
};
// Head dims 1 .. kAttentionMaxHeadDim (kernels.hpp), even.
void attention_paged(const PagedAttnArgs& a, cudaStream_t stream);

}  // namespace ehcuda
