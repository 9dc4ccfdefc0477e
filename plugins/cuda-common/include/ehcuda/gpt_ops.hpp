// Kernels the GPT-2 and gpt-oss families need beyond the llama set:
// LayerNorm with bias, GELU (tanh form), learned absolute positions, RoPE
// from a precomputed frequency table (YaRN-blended, with its attention
// factor), and attention with per-head sink logits and any head size up to
// 256. Same conventions as kernels.hpp: FP32 activations [token][feature]
// with explicit leading dimensions, FP16 (or FP32) KV cache [pos][n_kv][head_dim],
// positions read from device memory (*d_pos0) so graphs can be replayed.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ehcuda/kernels.hpp"

namespace ehcuda {

// out[t] = (x[t] - mean) / sqrt(var + eps) * w + b   (b may be NULL)
void layernorm(const float* x, int ldx, const float* w, const float* b, float* out, int ldo, int n,
               int ntok, float eps, cudaStream_t stream);

// x[t*ld + i] = gelu_tanh(x[t*ld + i]) for i < n.
void gelu_tanh_inplace(float* x, int ld, int n, int ntok, cudaStream_t stream);

// h[t] += row d_pos[t] of the table (GPT-2's learned positions of a
// batched step's tokens).
void add_position_rows_at(const WeightRef& table, const int32_t* d_pos, int ntok, float* h, cudaStream_t stream);

// Rotates Q in place (pairs (i, i + n_rot/2) when neox, else (2i, 2i+1))
// with angle pos * inv_freq[i] and both cos and sin multiplied by
// attn_factor, then stores K (rotated) and V into the FP16 cache at
// *d_pos0 + t. n_rot == 0: no rotation, K and V are only stored. With
// k_cache32/v_cache32 set, the cache is FP32 instead (k_cache/v_cache unused).
struct RopeTableArgs {
    float* qkv = nullptr;  // [t][q | k | v], row stride ld
    int ld = 0;
    int n_head = 0, n_kv = 0, head_dim = 0, n_rot = 0;
    bool neox = true;
    const float* inv_freq = nullptr;  // device, n_rot/2
    float attn_factor = 1.0f;
    const int32_t* d_pos0 = nullptr;
    int ntok = 1;
    __half* k_cache = nullptr;
    __half* v_cache = nullptr;
    float* k_cache32 = nullptr;
    float* v_cache32 = nullptr;
    // A batched step (both or neither; rope_table_store_kv only): token t
    // sits at position d_pos[t] (instead of *d_pos0 + t) and its K/V go to
    // cache row d_rows[t] (a paged pool's row).
    const int32_t* d_pos = nullptr;
    const int32_t* d_rows = nullptr;
    // QK-norm (Qwen3), rope_sink_attention_decode only (both or neither):
    // each head's q and k RMS-normalized over head_dim with these weights
    // (head_dim long) before the rotation, as head_rmsnorm would; the qkv
    // row itself is left as it is.
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    float norm_eps = 0.0f;
};
void rope_table_store_kv(const RopeTableArgs& a, cudaStream_t stream);

// Causal GQA attention of ntok queries at *d_pos0 + t over the cache. With
// sinks (device, one logit per query head) the softmax denominator also
// holds exp(sink[head]); window > 0 limits a query to the last `window`
// positions. Any head_dim in 1..256. One block per (query, head); keys are
// split over the block's warps and merged in warp order (deterministic).
// k_cache32/v_cache32 set: the FP32 cache rope_table_store_kv wrote.
struct SinkAttnArgs {
    const float* q = nullptr;
    int ldq = 0;
    const __half* k_cache = nullptr;
    const __half* v_cache = nullptr;
    const float* k_cache32 = nullptr;
    const float* v_cache32 = nullptr;
    int n_head = 0, n_kv = 0, head_dim = 0;
    const int32_t* d_pos0 = nullptr;
    int ntok = 1;
    int window = 0;
    float scale = 1.0f;
    const float* sinks = nullptr;
    float* out = nullptr;
    int ldo = 0;
    // Decode (ntok 1) split over the keys: nsplit (2..128) blocks per head, a
    // scratch of attention_sink_scratch_floats() floats and n_head int
    // counters, zero before the first call (each call leaves them zero).
    // Without them one block per head walks every key.
    int nsplit = 1;
    float* split_scratch = nullptr;
    int* split_counters = nullptr;
    // Split decode only: `out` also as the output projection's integer
    // chunks, as DecodeAttnArgs::out_chunks (head_dim a multiple of 32).
    void* out_chunks = nullptr;
    // Prefill (ntok > 1) only, optional: AttnArgs::split_scratch (the
    // prefill workspace's attention_scratch()).
    float* prefill_scratch = nullptr;
    size_t prefill_scratch_floats = 0;
};
// Splits for decode attention in a session of n_ctx positions (~128 keys
// per split for a full cache; at most 32).
int attention_sink_splits(uint32_t n_ctx);
size_t attention_sink_scratch_floats(int n_head, int head_dim, int nsplit);
void attention_sinks(const SinkAttnArgs& a, cudaStream_t stream);
// The same attention as the generic AttnArgs (queries, caches, heads,
// position, window, scale, sinks, output) for the kernels that take those.
AttnArgs attn_args_of(const SinkAttnArgs& a);
// Decode (one token): rope_table_store_kv then attention_sinks (split form)
// as one kernel, the same results (the cache bytes identical). r and a
// describe the same qkv row, heads and position; a needs the split scratch
// and counters (nsplit >= 1).
void rope_sink_attention_decode(const RopeTableArgs& r, const SinkAttnArgs& a, cudaStream_t stream);

}  // namespace ehcuda
