// A batched step's logit edits before sampling, one block per row, in the
// ABI's order: the step's biases (in list order, so a token listed twice
// gets both), the repetition penalty over the distinct tokens of the row's
// window, then presence and frequency penalties over the distinct tokens of
// the row's own output (the allowed-token mask, between biases and
// penalties in the ABI, is applied by the sampler: sampler.hpp). The host
// builds the distinct-token lists; every phase touches each token at most
// once, so the result does not depend on thread order. The host launches
// this only for steps where some row has such an edit.
#include <cmath>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/sampler.hpp"

namespace ehcuda {
namespace {

__global__ void adjust_logits_kernel(float* logits, int ld, const RowEdits* rows, const int32_t* tok,
                                     const float* val) {
    pdl_entry();
    const RowEdits e = rows[blockIdx.x];
    float* l = logits + size_t(blockIdx.x) * ld;
    if (threadIdx.x == 0)
        for (int i = e.bias_begin; i < e.bias_end; ++i) l[tok[i]] += val[i];
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
                   const float* d_val, cudaStream_t stream) {
    if (n_rows <= 0 || n_vocab <= 0) return;
    launch("adjust_logits_kernel", adjust_logits_kernel, n_rows, 1024, 0, stream, logits, ld, d_rows, d_tok, d_val);
    EHC_LAUNCHED("adjust_logits_kernel");
}

}  // namespace ehcuda
