// The steps of a CUDA plugin's load the same for every engine that shards
// (gpt-cuda, llama-cuda; cuda-common README, "Tensor parallelism"): the
// device's description, the weight plans (the model's and one per rank),
// the free-memory check and allocation of every GPU's arenas, their
// upload, the FP16 mirrors, and the load log's line on how the ranks run.
// Host code only.
//
// The templates take the engine's Model (a sharded_model.hpp
// ShardedModel), each Shard with device, arena, mirror, layers, head0, kv0
// and its Config c (n_head, n_kv).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

#include <ehcuda/check.hpp>
#include <ehcuda/device_set.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/kernel_plan.hpp>
#include <ehcuda/options.hpp>
#include <ehcuda/tp_group.hpp>
#include <ehcuda/tp_split.hpp>
#include <ehcuda/upload.hpp>
#include <ehcuda/upload_devices.hpp>
#include <ehcuda/weight_mirror.hpp>
#include <ehcuda/weight_plan.hpp>

namespace ehcuda {

// The load's device set (device_set.hpp's load_devices, at most
// max_devices): a rank per entry (m.tp), the first the model's GPU
// (m.device).
template <class Model>
std::vector<int> take_devices(Model& m, const eh_load_params& params, uint32_t max_devices) {
    std::vector<int> devices = load_devices(params, max_devices);
    m.tp = int(devices.size());
    m.device = devices[0];
    return devices;
}

// The load params' progress callback as progress(fraction, stage), and
// its cancel poll as cancelled() (false without one).
inline auto load_progress(const eh_load_params& p) {
    return [&p](float f, const char* stage) {
        if (p.progress) p.progress(p.progress_user, f, stage);
    };
}
inline auto load_cancelled(const eh_load_params& p) {
    return [&p]() { return p.cancel && p.cancel(p.cancel_user) != 0; };
}

// The load options every sharding engine reads alike: how the ranks run
// (tp_split.hpp's "tensor_parallel"; peer access enabled between the
// devices when each rank has its own stream), the upload's chunk bytes and
// the FP16 mirrors' policy.
struct ShardLoadOptions {
    bool rank_streams = false;
    size_t chunk_bytes = 0;
    MirrorPolicy mirror_policy = MirrorPolicy::Auto;
};
inline ShardLoadOptions shard_load_options(const Options& opts, const std::vector<int>& devices) {
    ShardLoadOptions o;
    o.rank_streams = tp_streams_option(opts, devices);
    if (o.rank_streams) enable_peer_access(devices);
    o.chunk_bytes = upload_chunk_option(opts);
    o.mirror_policy = mirror_policy_option(opts);
    return o;
}

// The load's GPU (m.device) made current and described into the model
// (name, compute capability, the CUDA runtime's version); its traits for
// the kernel plan.
template <class Model>
DeviceTraits describe_device(Model& m) {
    EHC_CHECK(cudaSetDevice(m.device));
    cudaDeviceProp prop{};
    EHC_CHECK(cudaGetDeviceProperties(&prop, m.device));
    m.device_name = prop.name;
    m.compute_capability = prop.major * 10 + prop.minor;
    EHC_CHECK(cudaRuntimeGetVersion(&m.runtime_version));
    return DeviceTraits{prop.major, prop.minor, prop.multiProcessorCount};
}

// What an engine's weight loader shares with the others: the model's plan
// over its arena and (sharded) one per rank over each shard's, where the
// next tensors go, the view's tensors by name, and the host copies (column
// slices) kept until the upload is done.
class ShardedLoader {
public:
    ShardedLoader(DeviceArena& arena, const ehp::ModelView& view) : plan(arena), view_(view) {}

    // One plan per rank, over its shard's arena (the shards stay where they
    // are from here on).
    template <class Shard>
    void plan_ranks(std::vector<Shard>& shards) {
        for (Shard& s : shards) ranks.push_back(std::make_unique<WeightPlan>(s.arena));
    }

    const eh_tensor* find(const std::string& name) const { return view_.find_tensor(name); }
    // MODEL_LOAD_FAILED "missing tensor '<name>'" where the view lacks it.
    const eh_tensor& need(const std::string& name) const {
        const eh_tensor* t = find(name);
        if (!t) throw ehp::Error(EH_MODEL_LOAD_FAILED, "missing tensor '" + name + "'");
        return *t;
    }
    // A host buffer that lives until the loader goes (after the upload).
    std::vector<uint8_t>& copy_buffer() { return copies_.emplace_back(); }

    WeightPlan plan;  // the model's whole arena (embeddings, output; every layer at tp 1)
    std::vector<std::unique_ptr<WeightPlan>> ranks;  // each shard's
    WeightPlan* at = &plan;                          // where the next tensor goes

private:
    const ehp::ModelView& view_;
    std::deque<std::vector<uint8_t>> copies_;
};

// Rank r of a split by KV head (kv_per_rank of them; tp_split.hpp's
// kv_heads_per_rank) on `device`: the model's config with the rank's own
// n_kv and n_head, its first KV and query head, a slot per layer.
template <class Shard, class Config>
void place_shard_heads(Shard& s, const Config& c, int r, int kv_per_rank, int device) {
    const int group = c.n_head / c.n_kv;
    s.device = device;
    s.c = c;
    s.c.n_kv = kv_per_rank;
    s.c.n_head = kv_per_rank * group;
    s.kv0 = r * kv_per_rank;
    s.head0 = s.kv0 * group;
    s.layers.resize(size_t(c.n_layer));
}

// Each GPU's arenas (the model's on m.device, each shard's on its own;
// ranks sharing a GPU add up there), `headroom` on top of each, checked
// against its free memory (INSUFFICIENT_VRAM naming m.path).
template <class Model>
void require_arena_memory(const Model& m, size_t headroom) {
    std::map<int, size_t> need{{m.device, m.arena.planned_bytes() + headroom}};
    for (const auto& s : m.shards) need[s.device] += s.arena.planned_bytes() + headroom;
    for (const auto& [d, bytes] : need) require_free_memory(d, bytes, m.path);
}

// Every arena allocated on its GPU and its plan's layout finished (`plan`
// the model's, ranks[r] shard r's); m.device current after.
template <class Model>
void allocate_arenas(Model& m, WeightPlan& plan, const std::vector<std::unique_ptr<WeightPlan>>& ranks) {
    m.arena.allocate(&m.ledger);
    plan.finish_layout(m.weight_ptrs);
    for (size_t r = 0; r < m.shards.size(); ++r) {
        EHC_CHECK(cudaSetDevice(m.shards[r].device));
        m.shards[r].arena.allocate(&m.ledger);
        ranks[r]->finish_layout(m.weight_ptrs);
    }
    EHC_CHECK(cudaSetDevice(m.device));
}

// Every arena's upload on a stream of its GPU (upload_devices.hpp), the
// progress shared by bytes over [0.02, 0.99] as "uploading weights";
// m.device current after.
template <class Model>
void upload_arenas(const Model& m, const WeightPlan& plan, const std::vector<std::unique_ptr<WeightPlan>>& ranks,
                   size_t chunk_bytes, const std::function<void(float, const char*)>& progress,
                   const std::function<bool()>& cancelled) {
    DeviceUploads uploads{{m.device, plan.upload_items()}};
    for (size_t r = 0; r < m.shards.size(); ++r) uploads.emplace_back(m.shards[r].device, ranks[r]->upload_items());
    UploadOptions up;
    up.chunk_bytes = chunk_bytes;
    up.progress_lo = 0.02f;
    up.progress_hi = 0.99f;
    up.progress = [&](float f) { progress(f, "uploading weights"); };
    up.cancelled = cancelled;
    upload_on_devices(uploads, up);
    EHC_CHECK(cudaSetDevice(m.device));
}

// The FP16 mirrors (weight_mirror.hpp): the model's of `mats` on `stream`
// (m.device), then each shard's of layer_mats(shard.layers, out) on a
// stream of its GPU. The model's decision, each rank's reason added to its
// line; *all_on (may be null) whether every one keeps its mirror. m.device
// current after.
template <class Model, class LayerMats>
MirrorDecision build_mirrors(Model& m, const std::vector<WeightRef>& mats, const LayerMats& layer_mats,
                             MirrorPolicy policy, cudaStream_t stream, bool* all_on = nullptr) {
    MirrorDecision md = build_mirror(m.mirror, mats, policy, stream, &m.ledger);
    bool on = md.on;
    for (auto& s : m.shards) {
        EHC_CHECK(cudaSetDevice(s.device));
        Stream rank_stream;
        std::vector<WeightRef> rank_mats;
        layer_mats(s.layers, rank_mats);
        const MirrorDecision rd = build_mirror(s.mirror, rank_mats, policy, rank_stream.get(), &m.ledger);
        on = on && rd.on;
        md.why += "; GPU " + std::to_string(s.device) + " rank: " + rd.why;
    }
    EHC_CHECK(cudaSetDevice(m.device));
    if (all_on) *all_on = on;
    return md;
}

// The load log's line on a sharded model: "tensor parallel: <tp> ranks,
// <how they run>" + `scheme` (what is split, ending "per rank:"), then per
// rank its GPU, query and KV heads and what rank_tail(shard) adds (", ...").
template <class Shard, class Tail>
std::string tp_plan_line(int tp, bool rank_streams, const std::string& scheme, const std::vector<Shard>& shards,
                         const Tail& rank_tail) {
    std::string t = "tensor parallel: " + std::to_string(tp) + " ranks, " +
                    (rank_streams ? "each on its own stream" : "one after another on the step's stream (shard mode)") +
                    scheme;
    for (const Shard& s : shards)
        t += " [GPU " + std::to_string(s.device) + ", query heads " + std::to_string(s.head0) + "+" +
             std::to_string(s.c.n_head) + ", KV heads " + std::to_string(s.kv0) + "+" + std::to_string(s.c.n_kv) +
             rank_tail(s) + "]";
    return t;
}

}  // namespace ehcuda
