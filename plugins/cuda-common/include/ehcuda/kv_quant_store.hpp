// The K/V stores into a quantized pool (kv_quant.hpp) for the RoPE of a
// table (gpt-cuda); llama-cuda's rope_store_kv dispatches to its own form by
// RopeArgs::kv_type (kernels.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ehcuda/gpt_ops.hpp"

namespace ehcuda {

// rope_table_store_kv (a batched step's rows: d_pos and d_rows set) into a
// Q8_0 / FP8_E4M3 pool of kv_type: Q rotated in place, K and V quantized
// into the rows (k_cache / v_cache point at the pools' bytes). n_rot 0
// rotates nothing (GPT-2). Head dims multiples of 32 up to 256.
void rope_table_store_kv_quant(const RopeTableArgs& a, uint32_t kv_type, cudaStream_t stream);

}  // namespace ehcuda
