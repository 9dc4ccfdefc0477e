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

// The same sum with the barrier inside the kernel instead of stream
// events (the custom all-reduce of vLLM and TensorRT-LLM): every block of
// rank `self`'s kernel raises its flag in each rank's signal area, then
// waits until every rank's same block has raised it for this call, then
// sums. Each rank launches it on its own stream, with nout 1; nothing
// orders the ranks' streams but the flags, so the rank kernels must be able
// to run at once (each GPU its own; ranks sharing a GPU: the grid is at
// most kSignalBlocks blocks). The call count lives in the signal areas on
// the device, so a captured graph replays it. The caller keeps the
// partials double-buffered as for the event barrier (tp_group.hpp).
inline constexpr int kSignalBlocks = 32;
// One rank's signal area: zeroed once (cudaMemset), then only the kernel
// writes it. flag[b][r]: rank r's block b reached call epoch[b].
struct AllReduceSignal {
    unsigned int flag[kSignalBlocks][kMaxRanks];
    unsigned int epoch[kSignalBlocks];
};
void allreduce_oneshot_signal(const AllReduceArgs& a, int self, AllReduceSignal* const* signals, cudaStream_t stream);

}  // namespace ehcuda
