// Decode attention for all query heads of a KV head at once, on the tensor
// cores (src/attention_decode_group.cu): each key is read once per KV head
// instead of once per query head, which is what grouped-query models spend
// their decode steps on at depth. Sessions take it past the plan's
// attn_group_min_keys keys; below that the fused single-launch kernels
// (rope_attention_decode, rope_sink_attention_decode) are faster.
#pragma once

#include <cuda_runtime_api.h>

#include "ehcuda/attention_paged.hpp"
#include "ehcuda/kernels.hpp"

namespace ehcuda {

constexpr int kAttentionGroupMaxSplits = 128;

// Whether attention_decode_group serves `a`: one token (ntok 1), head dim
// 64, 96 or 128, 2..16 query heads per KV head, a contiguous FP16 or FP32
// cache (no block table), q rows of at least n_head * head_dim floats.
bool attention_decode_group_takes(const AttnArgs& a);

// The same for a batched step's rows (attention_paged's arguments): any
// number of rows, each one query token, FP16 pools.
bool attention_decode_group_takes(const PagedAttnArgs& a);

// The grid's splits per KV head and row: about two blocks per
// multiprocessor over all rows, at most nsplit_cap (what the caller's
// scratch holds) and 128.
int attention_decode_group_splits(int nsplit_cap, int n_kv, int rows = 1);

// Attention of the token at *a.d_pos0 over keys [0, pos] (or the window's)
// of the cache, whose row pos must already hold the token's K and V (the
// caller's RoPE + store ran before, on `stream`). a.q holds the rotated
// queries, a.sinks (optional) per-head sink logits; a.out gets n_head *
// head_dim floats. scratch (borrowed for the call, stream-ordered): at least
// n_head * nsplit * (head_dim + 2) floats when nsplit > 1. Graph-safe: the
// active splits follow *d_pos0 on the device.
void attention_decode_group(const AttnArgs& a, float* scratch, int nsplit, cudaStream_t stream);

// A batched step's rows, as attention_paged computes them (row t at
// d_pos[t] of its sequence, its K/V already stored in the pools): each
// block serves one row's query group. scratch: ntok * n_head * nsplit *
// (head_dim + 2) floats when nsplit > 1.
void attention_decode_group(const PagedAttnArgs& a, float* scratch, int nsplit, cudaStream_t stream);

}  // namespace ehcuda
