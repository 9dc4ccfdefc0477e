// Expert parallelism's routing filter: a rank that holds experts
// [first, first + count) whole (tp_split.hpp's ExpertRange) takes the
// routing every rank computed alike and keeps its own pairs. A pair routed
// to one of its experts gets that expert's local index (id - first) and
// keeps its weight; any other pair (a foreign one) gets id -1 and weight 0.
// The expert kernels (moe.hpp) skip a pair whose id is negative: no block
// reads its expert's rows, and it adds nothing, not even a product with 0,
// to the token's sum (a token with no pair of the rank's adds exactly 0 to
// the rank's partial). So a rank's expert arithmetic is its own pairs',
// about 1 / ranks of the step's, and the ranks' partials, summed by the
// all-reduce, give each pair's term once. Launched only by a sharded model:
// a one-rank load never calls it, and its ids are never negative, so its
// launches and bits are untouched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ehcuda {

// ids and weights: ntok tokens' k pairs each, rewritten in place on `stream`.
void moe_keep_expert_range(int32_t* ids, float* weights, int ntok, int k, int first, int count, cudaStream_t stream);

}  // namespace ehcuda
