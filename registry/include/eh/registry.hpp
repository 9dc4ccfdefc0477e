// The plugin registry: every plugin the host has seen, accepted or rejected
// (with every reason), and the choice of plugin for a model.
//
// It depends on plugin-abi only. Loading (manifests, sha256, dlopen) is the
// host loader's job; the registry receives finished records.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace eh {

// What a plugin says it serves (from its manifest, checked against info()).
struct PluginCapabilities {
    std::string name;
    std::string version;
    std::string engine;
    std::vector<std::string> formats;
    std::vector<std::string> architectures;
    std::vector<std::string> quant_kinds;
    std::string device_kind;            // "cpu" or "cuda"
    uint32_t min_compute_capability = 0;
    int32_t priority = 0;
};

struct PluginRecord {
    std::string library_path;           // the .so (may be empty if unknown)
    std::string manifest_path;          // the manifest (may be empty)
    bool accepted = false;
    std::vector<std::string> reasons;   // why rejected; empty when accepted
    PluginCapabilities caps;            // as much as is known
    std::optional<eh_probe_result> probe;
    // Keeps the library loaded for as long as anyone holds the table.
    std::shared_ptr<const eh_plugin_api> api;
};

// What a model needs from a plugin.
struct ModelRequirements {
    std::string format;                     // "gguf" or "safetensors"
    std::string architecture;               // "qwen2"
    std::vector<std::string> tensor_types;  // every type the file stores, "Q4_K", ...
};

// Which devices a resolution may pick from (the worker contract's VRAM-only
// rule: a GPU worker never falls back to the CPU engine unasked).
enum class DevicePolicy {
    Auto,    // as Device when any device plugin, accepted or rejected, serves
             // the model's format, architecture and tensor types; otherwise
             // as Any (serve's and chat's default)
    Any,     // every accepted plugin: the explicit opt-in to a CPU fallback
             // (`--device any`; tools: inspect, bench)
    Device,  // only plugins whose device_kind is not "cpu" (`--device gpu`)
    Cpu,     // only "cpu" plugins (`--device cpu`)
};

struct Resolution {
    const PluginRecord* plugin = nullptr;   // null when none fits
    std::string explanation;                // why this one, or why none
    // When none fits under a policy other than Any: the rejected plugins of
    // the candidate kind that serve the model, each with its reasons in
    // `reasons` (e.g. a CUDA plugin whose probe found no driver).
    std::vector<const PluginRecord*> rejected_claimants;
};

class Registry {
public:
    void add(PluginRecord record);

    const std::vector<PluginRecord>& records() const { return records_; }
    std::vector<const PluginRecord*> accepted() const;
    std::vector<const PluginRecord*> rejected() const;

    // Picks the accepted plugin that serves the format, the architecture and
    // every tensor type; among several, the highest priority, then the name
    // (so the choice never depends on discovery order). When none fits, the
    // explanation states what the model needs and what each plugin offers.
    //
    // With a policy other than Any, only plugins of that kind are candidates;
    // when none fits, the explanation also names every rejected plugin of
    // that kind that would have served the model, with its reasons (a CUDA
    // plugin rejected for "no driver" says so instead of being skipped).
    // Auto decides between Device and Any by whether a device plugin claims
    // the model at all, so a rejected GPU plugin is never silently replaced
    // by the CPU engine.
    Resolution resolve(const ModelRequirements& need, DevicePolicy policy = DevicePolicy::Any) const;

    // The ways `caps` falls short of `need` (empty = it can serve the model).
    static std::vector<std::string> shortfalls(const PluginCapabilities& caps,
                                               const ModelRequirements& need);

private:
    std::vector<PluginRecord> records_;
};

}  // namespace eh
