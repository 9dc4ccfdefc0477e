// kv_init's check of a KV cache type other than F16 (BatchBase's
// accept_kv_type) for an engine whose attention kernels read the quantized
// pools (kv_quant.hpp: Q8_0, FP8_E4M3): K/V rows of whole 32-value blocks,
// heads up to 256 (a head dim that is not a multiple of 32 takes the paged
// kernel only, whose blocks may span heads). Host code only.
#pragma once

#include <cstdint>
#include <string>

#include <engine_host/kv_blocks.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/kv_quant.hpp>

namespace ehcuda {

// Throws ehp::refuse_kv_type's error naming why, `engine` in the first
// refusal. (A tensor-parallel rank's row, kv_dim / ranks, is BatchBase's
// check.)
inline void accept_quantized_kv(const char* engine, uint32_t type, int n_kv, int head_dim) {
    if (!kv_type_quantized(type))
        ehp::refuse_kv_type(type, std::string(engine) + " stores F16 (its default), Q8_0 or FP8_E4M3");
    const int kv_dim = n_kv * head_dim;
    if (kv_dim % kKvQuantBlock != 0 || head_dim > kAttentionMaxHeadDim)
        ehp::refuse_kv_type(type, "a K/V row of " + std::to_string(kv_dim) + " values (" + std::to_string(n_kv) +
                                      " heads of " + std::to_string(head_dim) +
                                      ") is not a whole number of 32-value blocks, or its heads are over 256");
}

}  // namespace ehcuda
