// A batched step's logit edits before sampling, one block per row, in the
// ABI's order: the step's biases (in list order, so a token listed twice
// gets both), the allowed-token mask, the repetition penalty over the
// distinct tokens of the row's window, then presence and frequency
// penalties over the distinct tokens of the row's own output. The host
// builds the distinct-token lists; every phase touches each token at most
// once, so the result does not depend on thread order.
#include <cmath>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/sampler.hpp"

namespace ehcuda {
namespace {

__global__ void adjust_logits_kernel(float* logits, int ld, int V, const RowEdits* rows, const int32_t* tok,
                                     const float* val, const uint32_t* masks) {
    pdl_entry();
    const RowEdits e = rows[blockIdx.x];
    float* l = logits + size_t(blockIdx.x) * ld;
    if (threadIdx.x == 0)
        for (int i = e.bias_begin; i < e.bias_end; ++i) l[tok[i]] += val[i];
    __syncthreads();
    if (e.mask_word >= 0) {
        const uint32_t* m = masks + e.mask_word;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            if (!((m[i >> 5] >> (i & 31)) & 1u)) l[i] = -INFINITY;
    }
    __syncthreads();
    for (int i = e.rep_begin + threadIdx.x; i < e.rep_end; i += blockDim.x) {
        const float v = l[tok[i]];
        l[tok[i]] = v > 0.0f ? v / e.repetition_penalty : v * e.repetition_penalty;
    }
    __syncthreads();
    for (int i = e.pf_begin + threadIdx.x; i < e.pf_end; i += blockDim.x)
        l[tok[i]] -= e.presence + e.frequency * val[i];
}

}  // namespace

void adjust_logits(float* logits, int ld, int n_rows, int n_vocab, const RowEdits* d_rows, const int32_t* d_tok,
                   const float* d_val, const uint32_t* d_masks, cudaStream_t stream) {
    if (n_rows <= 0) return;
    launch("adjust_logits_kernel", adjust_logits_kernel, n_rows, 256, 0, stream, logits, ld, n_vocab, d_rows, d_tok,
           d_val, d_masks);
    EHC_LAUNCHED("adjust_logits_kernel");
}

}  // namespace ehcuda
