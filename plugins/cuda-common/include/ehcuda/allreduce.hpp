// The tensor-parallel sum: every rank holds a partial result (a row-parallel
// matmul's share) and every rank needs the total. One-shot: each rank's
// kernel reads all ranks' partials (through peer pointers across GPUs,
// plain pointers when the ranks share one GPU) and adds them, in rank order,
// into its own output. One kernel, no host round trip, capturable in a CUDA
// graph; the sum order is fixed, so the result does not depend on timing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace ehcuda {

inline constexpr int kMaxRanks = 8;

struct AllReduceArgs {
    const float* in[kMaxRanks] = {};  // rank r's partial, n floats each
    float* out[kMaxRanks] = {};       // where the sum goes (nout of them)
    int nranks = 0;                   // 1 .. kMaxRanks
    int nout = 0;                     // 1 .. kMaxRanks
    size_t n = 0;
    // out[o][i] += sum (the residual add of the layer) instead of out = sum.
    bool accumulate = false;
};

// Launches one kernel on `stream` writing every out[]: the shard mode (all
// ranks on one GPU) and one rank's share across GPUs (nout 1) alike. The
// caller orders it after every partial's producer (one stream in shard
// mode; events across GPUs). INVALID_ARGUMENT for counts out of range.
void allreduce_oneshot(const AllReduceArgs& a, cudaStream_t stream);

}  // namespace ehcuda
