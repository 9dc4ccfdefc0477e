// The small per-step kernels Gemma 3's forward pass adds to a llama-family
// decoder (src/gemma_ops.cu). Activations are FP32 row-major, as in
// kernels.hpp; every launch goes on the given stream and is checked.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "ehcuda/kernels.hpp"

namespace ehcuda {

// x[i] *= s for n floats (Gemma's embedding times sqrt(hidden)).
void scale_floats(float* x, size_t n, float s, cudaStream_t stream);

// x[t][k] = gelu_tanh(x[t][k]) * x[t][k + n_ff] for k < n_ff, in place, in
// each of ntok rows of stride ld (a gate|up buffer): the GeLU-gated MLP's
// activation, left in the gate half for the down projection.
void geglu_tanh(float* x, int ld, int n_ff, int ntok, cudaStream_t stream);

// h[t] += rmsnorm(d[t]) * w over n features, for ntok rows of stride n:
// Gemma's norm after attention and after the MLP, then the residual add.
void rmsnorm_add(float* h, const float* d, const float* w, int n, int ntok, float eps, cudaStream_t stream);

// A decode step's gate and up with Gemma's activation, gelu_tanh(gate) *
// up, in between: gate_up_swiglu (kernels.hpp) with that activation, the
// same arguments, conditions (gate_up_swiglu_supported) and output form,
// which the down projection reads with XMode::Chunks (src/ffn_decode.cu).
void gate_up_geglu(const GateUpArgs& a, cudaStream_t stream);

// x[i] = cap * tanh(x[i] / cap) for n floats (final logit soft-capping).
void softcap_floats(float* x, size_t n, float cap, cudaStream_t stream);

}  // namespace ehcuda
