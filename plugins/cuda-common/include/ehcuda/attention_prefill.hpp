// Prefill attention (src/attention_prefill.cu): head dims 64, 96 and 128 on
// the tensor cores (mma.sync, FP16 x FP16 -> FP32; an FP32 cache is split
// into FP16 hi + lo parts so its precision survives), other dims on the
// CUDA-core kernel. kernels.hpp's attention_prefill(a, stream) is the same
// call without split scratch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "ehcuda/kernels.hpp"
#include "ehcuda/prefill_workspace.hpp"

namespace ehcuda {

// Scratch that lets the tensor-core kernel split each query tile's key
// range over more blocks when too few (query tile, head) blocks would fill
// the GPU (a 256-token chunk of Qwen2.5-0.5B is 4 x 14 blocks on 132
// multiprocessors). Empty: one split.
struct AttnSplitScratch {
    float* data = nullptr;
    size_t floats = 0;
};

// A session's split scratch is its prefill workspace's weight slab: the
// attention runs between matmuls on the same stream, when the slab holds
// nothing live, so splitting costs no memory.
inline AttnSplitScratch attention_split_scratch(const PrefillWorkspace& w) {
    return {reinterpret_cast<float*>(w.slab()), w.slab_halves() * sizeof(__half) / sizeof(float)};
}

void attention_prefill(const AttnArgs& a, AttnSplitScratch split, cudaStream_t stream);

// The CUDA-core tiled kernel (online softmax, 8 queries per block): head
// dim 256 (other dims through attention_generic), and the tests' second
// opinion on the tensor-core one.
void attention_prefill_simt(const AttnArgs& a, cudaStream_t stream);

// Whether attention_prefill runs head_dim on the tensor cores.
bool attention_prefill_mma_takes(int head_dim);
// Scratch (floats) with which attention_prefill may split any call of this
// head dim as far as it wants on GPUs of up to 170 multiprocessors (512
// blocks' partial rows: about 8.6 MB at head dim 64, 17 MB at 128).
size_t attention_prefill_scratch_floats(int head_dim);
// Key-range splits attention_prefill uses for ntok queries of n_head heads
// with this much scratch: enough for about three blocks per multiprocessor,
// at most 16; 1 without scratch, when it is too small, or when the grid is
// already full.
int attention_prefill_splits(int ntok, int n_head, size_t scratch_floats, int head_dim);

}  // namespace ehcuda
