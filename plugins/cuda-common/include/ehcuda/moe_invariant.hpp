// The pieces of a batch-invariant MoE block: a token's router logits, its
// normalised expert input and its experts' sums come out the same bits
// whatever else its step holds, one token or hundreds.
//
//   moe_router_rows: the RMS pre-norm, the router's logits and the
//     normalised rows for any number of tokens. Per (token, expert) the
//     arithmetic of moe_router_decode (moe.hpp), whatever the call's size
//     or how its blocks share the work, so a step of one token and a step
//     of many give a token the same logits (and so moe_route the same ids
//     and weights), and the same normalised input.
//   moe_decode_mma: one token's experts (routing included) on the tensor
//     cores with the grouped form's arithmetic (moe_grouped's 8- to
//     48-token passes: FP16 input and activations, FP32 sums in the same
//     order), so a token decoded alone gets the bits it gets in a batched
//     step. Three kernels with the router, as moe_router_decode +
//     moe_decode, and no grouping: block (64 rows, slot).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ehcuda/moe.hpp"

namespace ehcuda {

// logits[t][e] = (router_e . (x_t * norm_w)) / rms(x_t) (+ bias[e]) and,
// where asked, xn[t] = x_t / rms(x_t) * norm_w (FP32, [ntok][cols]) and
// the same rounded to FP16 (xn16, [ntok][cols]). An F32 router
// [n_expert][cols]; x, norm_w and w 16-byte aligned, ldx a multiple of 4.
struct MoeRouterRowsArgs {
    const float* x = nullptr;  // [ntok][ldx] the residual stream
    int ldx = 0;
    int ntok = 0;
    const float* norm_w = nullptr;
    float norm_eps = 0.0f;
    const float* w = nullptr;
    const float* bias = nullptr;  // [n_expert] or NULL
    int n_expert = 0, cols = 0;
    float* logits = nullptr;  // [ntok][n_expert]
    float* xn = nullptr;      // or NULL
    void* xn16 = nullptr;     // __half [ntok][cols], 16-byte aligned, or NULL
};
bool moe_router_rows_supported(uint32_t type, int n_expert, int cols);
void moe_router_rows(const MoeRouterRowsArgs& a, cudaStream_t stream);

// One token: h += sum_s w[s] * (down_e . act_s + bd_e) in rank order, act_s
// = expert_swiglu(gate_e . x + bg_e, up_e . x + bu_e) as FP16 (moe.hpp),
// e = the slot's expert: moe_grouped's tensor-core form token for token.
// With logits the routing is done inside (moe_route's top-k and weights,
// left in ids and weights); without, ids and weights are read. counters:
// moe_decode_mma_counters ints, zero before the first launch and left zero
// by each; launches sharing them must not overlap (one stream).
struct MoeDecodeMmaArgs {
    const void* x16 = nullptr;  // __half [gate.cols], the normalised input (moe_router_rows' xn16)
    int k = 0, n_expert = 0;
    const float* logits = nullptr;  // [n_expert] or NULL
    int32_t* ids = nullptr;         // [k]
    float* weights = nullptr;       // [k]
    ExpertMat gate, up, down;
    float alpha = kPlainSwiGlu, limit = 0.0f;
    void* scratch = nullptr;  // moe_decode_mma_scratch_bytes, 256-byte aligned
    size_t scratch_bytes = 0;
    int* counters = nullptr;
    float* h = nullptr;  // [down.rows]
};
// The experts moe_grouped takes on the tensor cores (moe_grouped_on_tensor_cores).
bool moe_decode_mma_supported(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, int k, int n_expert);
size_t moe_decode_mma_scratch_bytes(int k, int n_embd, int n_ff);
int moe_decode_mma_counters(int n_embd);
void moe_decode_mma(const MoeDecodeMmaArgs& a, cudaStream_t stream);

}  // namespace ehcuda
