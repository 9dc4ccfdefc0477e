// M-RoPE's shift of a step's Q and K heads (qwen2vl; mrope_positions.hpp
// says why and what): each token's NEOX rotation pairs turned by its shift
// from its KV index, the time, row or column component by the pair's
// M-RoPE section, at the frequencies the plain rotation uses. The kernels
// after it (the fused decode attention, rope_store_kv) turn by the KV
// index, and two turns of one pair add up to the token's M-RoPE angle.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace llama_cuda {

struct MropeShiftArgs {
    float* qkv = nullptr;  // rows of [q | k | v], ld floats apart
    int ld = 0;
    int n_head = 0, n_kv = 0, head_dim = 0, n_rot = 0;
    float freq_base = 10000.0f;
    int sections[2] = {0, 0};  // pairs i < sections[0] turn by the time component, i < sections[1] by the row, the rest by the column
    const int32_t* d_shift = nullptr;  // device, 3 per token (MropePositions::Shift)
    int ntok = 0;
};

// One launch; a token whose shift is 0 keeps its bits.
void mrope_shift(const MropeShiftArgs& a, cudaStream_t stream);

}  // namespace llama_cuda
