// What a loaded model of every CUDA engine that shards (gpt-cuda,
// llama-cuda) holds besides its configuration and weights: its GPU and
// tensor-parallel ranks, what the load found (device, runtime, dominant
// weight type), its device memory (the ledger, the arenas, the FP16
// mirrors), the kernel plan and the LoRA adapters' table. An engine's Model
// derives from it, Shard its rank type (its GPU, arena, mirror, layers).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernel_plan.hpp>
#include <ehcuda/lora.hpp>
#include <ehcuda/weight_mirror.hpp>

namespace ehcuda {

template <class Shard>
struct ShardedModel {
    int device = 0;
    // Tensor parallelism (eh_load_params.devices): the rank count, and the
    // shards when it is above 1 (the engine's layers are then empty; the
    // embeddings, output norm and LM head stay on `device`, rank 0's GPU).
    // Ranks run one after another on the step's stream (the shard mode: one
    // GPU named once per rank), or each on its own stream and GPU
    // (rank_streams: distinct GPUs, or the load option "tensor_parallel":
    // "streams" on one GPU, the same code path).
    int tp = 1;
    bool rank_streams = false;
    std::string path;
    std::string device_name;
    int compute_capability = 0;
    int runtime_version = 0;
    std::string quant_kind;

    MemoryLedger ledger;       // every device byte of the model and its KV pool
    std::vector<Shard> shards;  // (after the ledger: their arenas count on it)
    DeviceArena arena;         // weights
    std::vector<std::pair<const void*, std::string>> weight_ptrs;  // residency check
    // FP16 copies of the dense matrices for multi-token GEMMs (prefill,
    // batched steps), when the load's policy keeps them (the load's last
    // progress stage says why).
    WeightMirror mirror;
    // Every tuning choice of the kernels (kernel_plan.hpp), chosen at load;
    // plugin_glue.hpp installs it around each call that runs kernels.
    KernelPlan plan;
    // The load's view (host-owned, valid until model_release): adapter_load
    // checks adapters against it. And the loaded adapters' table (lora.hpp).
    const eh_model_view* view = nullptr;
    LoraSet lora;
};

}  // namespace ehcuda
