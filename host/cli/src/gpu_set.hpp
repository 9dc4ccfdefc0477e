// `--tensor-parallel N` and `--gpus LIST`: the GPUs one model spans (ABI 1.6
// eh_load_params.devices), chosen and checked before anything loads.
//
// --gpus names them (rank i on the i-th); a GPU named twice runs two ranks
// on that GPU (the shard mode, which computes what two GPUs would: it is
// there to test sharding on one GPU). Without --gpus, the N GPUs the
// plugin's probe accepts with the most free memory. With more than one rank,
// before the load, each rank's share of the weights (the layers' matrices
// split, the rest whole on every rank) and of the KV cache asked for
// (--kv-cache-size-mb, else one sequence of the context) must fit its GPU's
// free memory; otherwise INSUFFICIENT_VRAM naming the shortfall. One rank
// keeps the plugin's own check.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace eh::cli {

// --tensor-parallel 1..kMaxTensorParallel; --gpus ordinals 0..kMaxGpuOrdinal.
inline constexpr uint32_t kMaxTensorParallel = 8;
inline constexpr int kMaxGpuOrdinal = 63;

inline constexpr const char* kTensorParallelHelp =
    "ranks (GPUs) the model is split over by tensor parallelism, 1-8 (default 1, or the count of --gpus); more "
    "than 1 needs a plugin that spans several devices (llama-cuda and gpt-cuda do; one that serves one device only is "
    "refused by name)";
inline constexpr const char* kGpusHelp =
    "the GPUs the model spans, by ordinal, rank order: e.g. 0,1 (default: the --tensor-parallel GPUs with the most "
    "free memory; with one rank, --gpu-device). A GPU named twice runs two ranks on it (the one-GPU shard mode, "
    "for testing the split)";

// One GPU ordinal as the plugin's probe answered for it.
struct GpuFacts {
    int ordinal = 0;
    bool usable = false;
    std::string reason;  // the probe's (why not, when not usable)
    std::string name;
    uint64_t total_bytes = 0;
    uint64_t free_bytes = 0;
};

// "0,1,3": 1..kMaxTensorParallel ordinals in 0..kMaxGpuOrdinal, comma
// separated, no spaces or empty items; repeats allowed. false with `err`
// naming what is wrong.
bool parse_gpu_list(std::string_view text, std::vector<int>& out, std::string& err);

// The probe's answer for each of `ordinals`, in that order. A CUDA probe
// opens a context on each GPU it accepts, so the host probes only the GPUs
// named, or every ordinal (all_ordinals: one that does not exist answers at
// once) only to choose GPUs for --tensor-parallel without --gpus.
std::vector<GpuFacts> probe_gpus(const eh_plugin_api& api, const std::vector<int>& ordinals);
std::vector<int> all_ordinals();
// The entry of `ordinal`, or null.
const GpuFacts* find_gpu(const std::vector<GpuFacts>& gpus, int ordinal);

// The n usable GPUs with the most free memory (ties: the lower ordinal), in
// ordinal order. Throws Error(INSUFFICIENT_VRAM) naming how many the plugin
// can use when fewer than n.
std::vector<int> pick_gpus(const std::vector<GpuFacts>& gpus, uint32_t n);

// What the model needs: the weights a tensor-parallel plugin splits (the
// layers' matrices), those every rank holds whole (embeddings, LM head,
// norms and other vectors: llama-cuda's scheme), and the KV cache asked for
// (split by KV head).
struct FitNeed {
    uint64_t sharded_bytes = 0;
    uint64_t replicated_bytes = 0;
    uint64_t kv_bytes = 0;
    std::string kv_what;  // "--kv-cache-size-mb 512", "one sequence of 4096 tokens"
};

// One rank's bytes over `ranks`.
uint64_t rank_share(const FitNeed& need, uint64_t ranks);

// "" when every rank's share fits its GPU's free memory (a GPU named k
// times holds k shares); otherwise the shortfall naming the GPU, e.g. "the
// model needs 38.0 GiB of weights split over the ranks + 2.0 GiB on every
// rank (embeddings, LM head, norms) + 1.0 GiB of KV cache (one sequence of
// 4096 tokens), 21.5 GiB a rank over 2 ranks; GPU 1 (NVIDIA H200) has 12.0
// GiB free for 1 rank: 9.5 GiB short. ...". GPUs without a stated free
// memory are not judged.
std::string fit_shortfall(const FitNeed& need, const std::vector<int>& devices, const std::vector<GpuFacts>& gpus);

}  // namespace eh::cli

namespace eh::cli {

// The flags as given: --tensor-parallel (tp_given: on the command line),
// --gpus (empty when absent), --gpu-device named. Fills the ranks and the
// GPUs named; false with `err` for 0 or more than 8 ranks, --gpus beside
// --gpu-device, or a rank count that is not the count of --gpus.
bool check_gpu_flags(uint32_t tp, bool tp_given, const std::string* gpus_text, bool gpu_device_named,
                     uint32_t& tp_out, std::vector<int>& gpus_out, std::string& err);

}  // namespace eh::cli
