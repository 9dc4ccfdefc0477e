// Mixture-of-experts on the GPU with weights kept in their stored type
// (MXFP4 included): routing, then grouped products that read only the
// selected experts' rows.
//
//   moe_route:   logits [t][n_expert] -> top-k ids (ties: lower index) and
//                softmax over the k selected logits, in rank order.
//   moe_gate_up: act[t*k + s][r] = expert_swiglu(gate_e[r] . x[t] + bg_e[r],
//                                                up_e[r]   . x[t] + bu_e[r])
//                for e = ids[t*k + s]. With alpha > 0 gpt-oss's clamped
//                form: gate = min(gate, limit), up = clamp(up, -limit,
//                limit), out = (up + 1) * gate * sigmoid(alpha * gate).
//                With alpha = kPlainSwiGlu: silu(gate) * up (Qwen3-MoE;
//                limit unused).
//   moe_down:    h[t] += sum_s w[t*k+s] * (down_e . act[t*k+s] + bd_e), the
//                slots summed in rank order (no atomics: reproducible).
//
// Every (token, slot) pair is a column of the grid that varies fastest, so
// blocks running together read the same weight rows of the few experts in
// use: a row comes from device memory once and from L2 for every other
// token routed to that expert.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ehcuda {

class PrefillWorkspace;  // prefill_workspace.hpp

// The `alpha` that selects the plain SwiGLU, silu(gate) * up, in every
// expert kernel below (any alpha > 0 selects the clamped gpt-oss form).
inline constexpr float kPlainSwiGlu = 0.0f;

// Types the MoE and MXFP4 kernels decode (the matmul types plus MXFP4).
bool moe_type_supported(uint32_t type);
// Bytes of a device row of `cols` elements; 0 if unsupported or not whole
// blocks. For MXFP4 the device layout's (mxfp4_layout.hpp), not the file's.
size_t moe_row_bytes(uint32_t type, int64_t cols);

// Expert e's row r lives at data + e * expert_stride + (row0 + r) * row_bytes.
// A fused gate|up tensor is two ExpertMats over the same data with row0 = 0
// and row0 = rows. MXFP4 data is in the device layout (mxfp4.cuh) at a
// 16-byte aligned address (row_bytes is a multiple of 16). The buffer must have 4
// readable bytes past its end for the types whose blocks are read with
// aligned 32-bit loads at 2-byte offsets (Q4_0, Q5_0, Q8_0).
struct ExpertMat {
    const void* data = nullptr;
    uint32_t type = 0;
    int rows = 0;   // per expert
    int cols = 0;
    size_t row_bytes = 0;
    size_t expert_stride = 0;  // bytes
    int row0 = 0;
    const float* bias = nullptr;  // [n_expert][bias_stride] or NULL
    int bias_stride = 0;
};

void moe_route(const float* logits, int ntok, int n_expert, int k, int32_t* ids, float* weights,
               cudaStream_t stream);

// One token's router at decode: logits[e] = router_e . rmsnorm(x) (+ bias)
// for an F32 router [n_expert][cols], one block per expert row
// (moe_router.cu), then, where ids is set, moe_route's top-k ids and
// weights of those logits in the same kernel. `counter` (with ids) is one
// device int, zero before the first launch and left zero by each; launches
// sharing it must not overlap. Pointers x, norm_w and w 16-byte aligned;
// moe_router_decode_supported says which shapes.
struct MoeRouterArgs {
    const float* x = nullptr;       // [cols], the residual before the norm
    const float* norm_w = nullptr;  // [cols] RMSNorm weight
    float norm_eps = 0.0f;
    const float* w = nullptr;       // [n_expert][cols]
    const float* bias = nullptr;    // [n_expert] or NULL
    int n_expert = 0, cols = 0, k = 0;
    float* logits = nullptr;  // [n_expert], written
    int32_t* ids = nullptr;   // [k], written in rank order; NULL: the logits only
    float* weights = nullptr; // [k]
    int* counter = nullptr;
};
bool moe_router_decode_supported(uint32_t type, int n_expert, int cols, int k);
void moe_router_decode(const MoeRouterArgs& a, cudaStream_t stream);

void moe_gate_up(const float* x, int ldx, int ntok, int k, const int32_t* ids, const ExpertMat& gate,
                 const ExpertMat& up, float alpha, float limit, float* act, cudaStream_t stream);

void moe_down(const float* act, int ntok, int k, const int32_t* ids, const float* weights,
              const ExpertMat& down, float* h, int ldh, cudaStream_t stream);

// Prefill form of moe_gate_up followed by moe_down (the same formulas, FP16
// GEMM operands, FP32 accumulation): the routed (token, slot) pairs are
// grouped by expert on the device (a stable counting sort), each expert with
// at least one pair has its matrices dequantized slab by slab into the
// workspace and multiplied with cuBLAS, and h[t] += the slots' weighted
// outputs summed in rank order (no atomics: reproducible). The host learns
// the group sizes through one small device-to-host copy of n_expert + 1
// offsets per call (a stream synchronisation per MoE layer). Returns false,
// having done nothing, when ws is NULL, ntok is below its threshold, the
// stream is being captured, or a shape exceeds the workspace: the caller
// then runs moe_gate_up + moe_down.
bool moe_prefill(PrefillWorkspace* ws, const float* x, int ldx, int ntok, int k, int n_expert, const int32_t* ids,
                 const float* weights, const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, float alpha,
                 float limit, float* h, int ldh, cudaStream_t stream);

// One token's whole expert block (moe_gate_up then moe_down, the same
// formulas): h += sum_s w[s] * (down_e . act_s + bd_e) in rank order, with
// the input optionally RMS-normalised on the fly (norm_w set: x is the
// residual stream and the pre-norm needs no kernel of its own). Integer
// dot products with the input as int16x2 codes (kernels.hpp GemvInput),
// ~2^-24 of each 32-element chunk's largest input from exact. For the
// expert types with an integer path (the quantized matmul types and
// MXFP4; gate and up of one type), n_ff a multiple of 32 and k <= 32:
// moe_decode_supported says; callers use moe_gate_up + moe_down otherwise.
// The decode step's graph captures it (no host synchronisation).
struct MoeDecodeArgs {
    const float* x = nullptr;       // [cols], 16-byte aligned
    const float* norm_w = nullptr;  // RMSNorm weight, or NULL: x as is
    float norm_eps = 0.0f;
    int k = 0;
    const int32_t* ids = nullptr;     // [k] selected experts, rank order
    const float* weights = nullptr;   // [k]
    // Or the routing done inside the expert kernel (one kernel fewer than
    // moe_route + moe_decode, the same ids and weights): the router's
    // logits [n_expert] (then ids and weights are ignored), and where the
    // selection is left ([k] each; the down kernel reads it there).
    const float* logits = nullptr;
    int n_expert = 0;
    int32_t* route_ids = nullptr;
    float* route_weights = nullptr;
    ExpertMat gate, up, down;
    float alpha = kPlainSwiGlu, limit = 0.0f;  // the activation (top of file)
    void* scratch = nullptr;           // moe_decode_scratch_bytes(k, gate.rows)
    size_t scratch_bytes = 0;
    float* h = nullptr;  // [down.rows], accumulated into
};
bool moe_decode_supported(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, int k);
size_t moe_decode_scratch_bytes(int k, int n_ff);
void moe_decode(const MoeDecodeArgs& a, cudaStream_t stream);

// Several tokens' expert blocks at once (moe_gate_up then moe_down, the
// same formulas), for batched steps and prefill: the (token, slot) pairs
// are grouped by expert on the device and each expert's rows are read once
// per pass of the tokens routed to it, not once per token. Experts
// averaging KernelPlan::moe_tile_pass_tokens or more take the tile form
// (128 pairs a pass, any type; not with one_form); else MXFP4, Q4_K and
// Q6_K experts (gate and up of one type, 4-byte aligned data) passes of 8
// to 64 tokens; both on the tensor cores (FP16 inputs and activations,
// FP32 accumulation). The other types, or integer_path set: integer dot
// products with int16x2 inputs as moe_decode (per token and row the same
// sums in the same order, so the same bits). Every form is fixed-order: a
// token's result does not depend on the call's other tokens, as long as
// the call takes the same form (one_form keeps it to one whatever the
// call's size). No host synchronisation: a captured graph takes it. x holds the
// tokens' normalised inputs [ntok][ldx]; ids and weights moe_route's [ntok][k]
// (ids in [0, n_expert)); h [ntok][ldh] is accumulated into. The types and
// shapes moe_decode takes, with down mapping back to gate's columns
// (moe_grouped_supported says). scratch: moe_grouped_scratch_bytes(ntok, ...)
// bytes, 256-byte aligned (a DeviceBuffer's are).
struct MoeGroupedArgs {
    const float* x = nullptr;
    int ldx = 0;
    int ntok = 0;
    int k = 0;
    int n_expert = 0;
    const int32_t* ids = nullptr;
    const float* weights = nullptr;
    ExpertMat gate, up, down;
    float alpha = kPlainSwiGlu, limit = 0.0f;  // the activation (top of file)
    void* scratch = nullptr;
    size_t scratch_bytes = 0;
    float* h = nullptr;
    int ldh = 0;
    bool integer_path = false;
    // Never the tile form: a call of any size takes the same kernels (the
    // tensor-core passes or the integer form), for batch-invariant answers.
    bool one_form = false;
};
bool moe_grouped_supported(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, int k);
// Whether these experts take the tensor-core form (MXFP4, Q4_K, Q6_K), not the integer one.
bool moe_grouped_on_tensor_cores(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down);
// 0 when a size is out of range.
size_t moe_grouped_scratch_bytes(int ntok, int k, int n_expert, int n_embd, int n_ff);
void moe_grouped(const MoeGroupedArgs& a, cudaStream_t stream);

// y[t][r] = W[r] . x[t] (+ bias[r]) for a single matrix in any moe type:
// the dense form of the same decode path (MXFP4 tests, MXFP4 dense weights).
void dense_gemv(const float* x, int ldx, int ntok, const ExpertMat& w, float* y, int ldy,
                bool accumulate, cudaStream_t stream);

}  // namespace ehcuda
