// `--tensor-parallel N` and `--gpus LIST`: the GPUs one model spans (ABI 1.6
// eh_load_params.devices), chosen and checked before anything loads.
//
// --gpus names them (rank i on the i-th); a GPU named twice runs two ranks
// on that GPU (the shard mode, which computes what two GPUs would: it is
// there to test sharding on one GPU). Without --gpus, the N GPUs the plugin's
// probe sees with the most free memory. Before the load, the file's weights
// plus the KV cache asked for (--kv-cache-size-mb, else one sequence of the
// context) must fit: split evenly over the ranks, each GPU's share against
// its free memory; otherwise INSUFFICIENT_VRAM naming the shortfall.
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
    "than 1 needs a plugin that spans several devices (llama-cuda does; one that serves one device only is "
    "refused by name)";
inline constexpr const char* kGpusHelp =
    "the GPUs the model spans, by ordinal, rank order: e.g. 0,1 (default: the --tensor-parallel GPUs with the most "
    "free memory; with one rank, --gpu-device). A GPU named twice runs two ranks on it (the one-GPU shard mode, "
    "for testing the split)";

// One GPU as the plugin's probe sees it.
struct GpuFacts {
    int ordinal = 0;
    std::string name;
    uint64_t total_bytes = 0;
    uint64_t free_bytes = 0;
};

// "0,1,3": 1..kMaxTensorParallel ordinals in 0..kMaxGpuOrdinal, comma
// separated, no spaces or empty items; repeats allowed. false with `err`
// naming what is wrong.
bool parse_gpu_list(std::string_view text, std::vector<int>& out, std::string& err);

// Ordinals 0, 1, ... as long as the probe accepts them (at most
// kMaxGpuOrdinal + 1); `stop_reason` gets the first refusal's reason.
std::vector<GpuFacts> probe_gpus(const eh_plugin_api& api, std::string* stop_reason = nullptr);

// The n GPUs with the most free memory (ties: the lower ordinal), in
// ordinal order. Throws Error(INSUFFICIENT_VRAM) naming how many there are
// when fewer than n.
std::vector<int> pick_gpus(const std::vector<GpuFacts>& gpus, uint32_t n);

// What the model needs: the weights in the file and the KV cache asked for.
struct FitNeed {
    uint64_t weight_bytes = 0;
    uint64_t kv_bytes = 0;
    std::string kv_what;  // "--kv-cache-size-mb 512", "one sequence of 4096 tokens"
};

// "" when every rank's share fits its GPU's free memory (a GPU named k
// times holds k shares); otherwise the shortfall, e.g. "the model needs 40.0
// GiB of weights + 1.0 GiB of KV cache (one sequence of 8192 tokens), 20.5 GiB
// a rank over 2 ranks; GPU 1 (NVIDIA H200) has 12.0 GiB free for 1 rank: 8.5
// GiB short". GPUs whose probe states no free memory are not judged.
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
