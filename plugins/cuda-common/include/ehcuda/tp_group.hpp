// The ranks of a tensor-parallel model, each on its own GPU and stream
// (cuda-common README, "Tensor parallelism"): the fork of a step's work
// from the step's stream to every rank's, the join back, and the sum of
// the ranks' partial results (a row-parallel matmul's) into every rank's
// residual.
//
// One host thread issues every rank's work, asynchronously, rank after
// rank: the ranks' streams run side by side on their GPUs, and the only
// waits are on the device (events). Everything here is capturable: a step's
// CUDA graph captured on the step's stream takes the ranks' streams in
// through the fork event and back through the join, one graph over all
// the GPUs.
//
// The all-reduce: every rank writes its partial into partial(r) (two
// buffers per rank, alternating from one all-reduce to the next), then
// all_reduce_add() sums them into each rank's output:
//   - one-shot (decode-sized messages, below the plan's
//     allreduce_nccl_min_floats, or no NCCL): each rank records an event
//     once its partial is written; each rank's stream waits for every
//     other rank's event (the barrier before), then one kernel per rank
//     reads all partials through peer pointers and adds their sum, in rank
//     order, into its output. The barrier after (no rank overwrites a
//     partial before every rank has read it) is the next all-reduce's
//     barrier before: a rank writes partial buffer b again only two
//     all-reduces later, behind a barrier that every rank passed after
//     reading b.
//   - NCCL (larger messages, GPUs all distinct, libnccl.so.2 loaded): an
//     in-place ncclAllReduce of every rank's partial in one group, then
//     each rank adds the sum into its output.
// With `signals` (the plan's allreduce_signals), the one-shot all-reduce
// takes allreduce_oneshot_signal instead: the barrier is flags in each
// rank's signal area, raised and awaited inside the kernel, and no event
// orders the ranks' streams (the barrier after is likewise the next call's).
// The same code runs where ranks share a GPU (the "streams" mode of a
// one-GPU device set): separate streams and the same events; the one-shot
// kernel's peer pointers are then plain ones.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <ehcuda/device_memory.hpp>

namespace ehcuda {

namespace nccl {
class Comms;
}

// Enables peer access between every two distinct GPUs of `devices` (both
// ways). UNSUPPORTED naming the pair when the driver says one cannot reach
// the other's memory; INVALID_ARGUMENT naming a GPU that does not exist.
void enable_peer_access(const std::vector<int>& devices);

class TpGroup {
public:
    // One rank per entry of `devices` (at most kMaxRanks), each with its
    // own stream and events on its GPU, and two partial buffers of
    // `max_floats` floats on it (counted on `ledger`). `main_device` is the
    // GPU of the step's stream (fork / join). NCCL is tried only when
    // `use_nccl` and every GPU is distinct; without it every all-reduce is
    // one-shot (nccl_why() says why).
    TpGroup(const std::vector<int>& devices, int main_device, size_t max_floats, bool use_nccl,
            MemoryLedger* ledger);
    ~TpGroup();
    TpGroup(const TpGroup&) = delete;
    TpGroup& operator=(const TpGroup&) = delete;

    int size() const { return int(ranks_.size()); }
    int device(int r) const { return ranks_[size_t(r)].device; }
    cudaStream_t stream(int r) const { return ranks_[size_t(r)].stream; }
    // Makes rank r's GPU current (before its allocations and launches).
    void use(int r) const;
    bool nccl() const { return comms_ != nullptr; }
    // Every rank on a GPU of its own (what NCCL and the signal barrier need).
    bool distinct_gpus() const { return distinct_; }
    const std::string& nccl_why() const { return nccl_why_; }

    // Every rank's stream waits for the work enqueued on `main` so far; the
    // partial buffers start again from the first.
    void fork(cudaStream_t main);
    // `main` waits for every rank's work so far; the main GPU is current.
    void join(cudaStream_t main);
    // Where rank r writes its partial for the next all_reduce_add().
    float* partial(int r) const { return ranks_[size_t(r)].part[flip_].as<float>(); }
    // out[r][i] += sum over ranks of partial(s)[i], i < n, on every rank's
    // stream; NCCL from nccl_min_floats floats on (when loaded), else the
    // one-shot kernel behind the event barrier or (signals) its own.
    // INVALID_ARGUMENT past max_floats.
    void all_reduce_add(float* const* out, size_t n, size_t nccl_min_floats, bool signals = false);
    // Which path a message of n floats takes ("one-shot" / "NCCL").
    const char* path_for(size_t n, size_t nccl_min_floats) const;

private:
    struct Rank {
        int device = 0;
        cudaStream_t stream = nullptr;
        cudaEvent_t ready = nullptr;  // its partial is written
        cudaEvent_t done = nullptr;   // its work of the step is enqueued up to here (join)
        DeviceBuffer part[2];
        DeviceBuffer signal;  // its AllReduceSignal (allreduce.hpp), zeroed
    };
    void release() noexcept;

    int main_device_ = 0;
    size_t max_floats_ = 0;
    std::vector<Rank> ranks_;
    cudaEvent_t fork_ = nullptr;
    int flip_ = 0;
    bool distinct_ = false;
    std::unique_ptr<nccl::Comms> comms_;
    std::string nccl_why_;
};

}  // namespace ehcuda
