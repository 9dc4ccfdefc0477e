// A tensor-parallel step's residual rows, for every CUDA plugin that shards
// (cuda-common README, "Tensor parallelism"): where each rank writes its
// share of a row-parallel piece (attn_output, ffn_down, an MoE layer's
// experts), the all-reduce that adds the shares into the residual, and the
// start of a step whose ranks run on streams of their own. Two modes:
//   - shard mode (group null): the ranks run one after another on the
//     step's stream over one residual, h[0]; rank r writes part[r], and one
//     kernel adds the shares, in rank order, into h[0];
//   - streams (group set): each rank has its own residual h[r] (rank 0's
//     the step's), writes the group's partial(r), and the group's
//     all-reduce adds the sum into every h[r] (tp_group.hpp).
// At one rank the share is the residual itself (the caller accumulates into
// it) and the all-reduce does nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <ehcuda/allreduce.hpp>
#include <ehcuda/check.hpp>
#include <ehcuda/device_set.hpp>
#include <ehcuda/tp_group.hpp>

namespace ehcuda {

struct TpRows {
    TpGroup* group = nullptr;
    int tp = 1;
    float* h[kMaxRanks] = {};     // each rank's residual rows (shard mode: h[0] only)
    float* part[kMaxRanks] = {};  // shard mode: each rank's share, before the all-reduce

    // From a plugin's ranks (each with its residual `h` and its shard-mode
    // share buffer `part`, a DeviceBuffer) and the streams mode's group.
    template <class Rank>
    void bind(TpGroup* g, const std::vector<Rank>& ranks) {
        group = g;
        tp = int(ranks.size());
        for (int r = 0; r < tp; ++r) {
            h[r] = ranks[size_t(r)].h;
            part[r] = ranks[size_t(r)].part.template as<float>();
        }
    }

    // Where rank r writes its share.
    float* target(int r) const { return tp == 1 ? h[r] : group ? group->partial(r) : part[r]; }

    // Streams: every rank's stream starts after the work on `step` so far,
    // and the ranks with rows of their own copy the first n floats of h[0]
    // (over NVLink across GPUs). Nothing in the shard mode.
    void fork(cudaStream_t step, size_t n) const {
        if (!group) return;
        group->fork(step);
        for (int r = 1; r < tp; ++r)
            if (h[r] != h[0]) {
                group->use(r);
                EHC_CHECK(cudaMemcpyAsync(h[r], h[0], n * 4, cudaMemcpyDefault, group->stream(r)));
            }
    }

    // The shares' sum (n floats each), in rank order, added into the
    // residual: every rank's (streams; NCCL from nccl_min_floats where
    // loaded, `signals` the one-shot's in-kernel barrier), or h[0] by one
    // kernel on `step` (shard mode).
    void all_reduce(cudaStream_t step, size_t n, size_t nccl_min_floats, bool signals) const {
        if (tp == 1) return;
        if (group) {
            group->all_reduce_add(h, n, nccl_min_floats, signals);
            return;
        }
        AllReduceArgs a;
        for (int r = 0; r < tp; ++r) a.in[r] = part[r];
        a.nranks = tp;
        a.out[0] = h[0];
        a.nout = 1;
        a.n = n;
        a.accumulate = true;
        allreduce_oneshot(a, step);
    }
};

// The streams mode's group: a rank per entry of `devices` (NCCL tried),
// partials of max_floats; *signals says whether its one-shot all-reduce
// takes the in-kernel barrier (`plan_signals`, the plan's
// allreduce_signals, and only where every rank has a GPU of its own).
// Which all-reduce a size takes depends on this machine's NCCL: said once,
// here, on stderr under the engine's name.
inline std::unique_ptr<TpGroup> make_rank_group(const char* engine, const std::vector<int>& devices, int main_device,
                                                size_t max_floats, bool plan_signals, int nccl_min_floats,
                                                MemoryLedger* ledger, bool* signals) {
    auto group = std::make_unique<TpGroup>(devices, main_device, max_floats, true, ledger);
    *signals = plan_signals && group->distinct_gpus();
    std::fprintf(stderr, "[%s] tensor parallel: %d ranks on their own streams, GPUs %s; all-reduce one-shot "
                 "(peer reads, %s barrier)%s%s\n", engine, group->size(), device_list(devices).c_str(),
                 *signals ? "in-kernel signal" : "event",
                 group->nccl() ? (", NCCL from " + std::to_string(nccl_min_floats) + " floats (").c_str()
                               : " for every size (",
                 (group->nccl_why() + ")").c_str());
    return group;
}

}  // namespace ehcuda
