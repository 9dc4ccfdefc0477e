// Expert parallelism's routing filter: a rank that holds experts
// [first, first + count) whole (tp_split.hpp's ExpertRange) takes the
// routing every rank computed alike and keeps its own pairs. A pair routed
// to one of its experts gets that expert's local index (id - first); any
// other pair gets weight 0 and the local index of the token's first pair
// that is the rank's (local expert 0 where the token has none), so the
// expert kernels (moe.hpp, whose ids must lie in [0, n_expert)) add exactly
// nothing for it (w * y with w = 0) and read no expert's rows for it that
// the token does not read anyway (where it has a pair of the rank's); the
// ranks' partial sums, added by the all-reduce, give each pair's term
// once. Launched only by a sharded model: a one-rank load never calls it,
// so its kernels and bits are untouched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ehcuda {

// ids and weights: ntok tokens' k pairs each, rewritten in place on `stream`.
void moe_keep_expert_range(int32_t* ids, float* weights, int ntok, int k, int first, int count, cudaStream_t stream);

}  // namespace ehcuda
