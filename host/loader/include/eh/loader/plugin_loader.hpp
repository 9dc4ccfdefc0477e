// Plugin discovery and loading.
//
// For each manifest in a plugin directory, in this order, collecting every
// problem rather than stopping at the first:
//   1. schema (manifest.hpp), platform, ABI version, library file, sha256 —
//      all before the library is opened;
//   2. a pre-flight in a forked child process: dlopen, entry symbol, ABI
//      negotiation, self-description vs manifest, probe. A plugin that
//      crashes or hangs there is rejected and the host carries on;
//   3. the same steps again in this process, keeping the library loaded.
// discover_plugins() runs steps 1-2 for every plugin before step 3 for any:
// a forked child cannot initialise CUDA once the host process has, so a
// CUDA plugin opened early would fail the next one's pre-flight. For the same
// reason, discover once per process (the CLI does): a second discovery after
// a CUDA plugin has run in this process would reject the CUDA plugins.
// Libraries with no manifest are reported too. Nothing here throws for a bad
// plugin: the result is a rejected record with its reasons.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "eh/registry.hpp"

namespace eh::loader {

struct LoaderOptions {
    int32_t device = 0;                         // GPU ordinal passed to probe
    // Lowest minor this host accepts. The host needs nothing newer than 1.0:
    // it reads 1.1's eh_model_info.kv_bytes_per_token only when it is set.
    uint16_t required_abi_minor = 0;
    bool isolate_preflight = true;              // run step 2 in a child process
    // Step 3 too. Off (serve --engine-process): a plugin that passes the
    // pre-flight is accepted without a table (`api` stays null), for a
    // child process to open.
    bool open_in_process = true;
    std::chrono::milliseconds preflight_timeout{30000};
    std::string platform;                       // empty = host_platform()
};

// Bytes of the function table a plugin built for ABI 1.`minor` has: the
// members that minor defines (1.0 and 1.1 end before 1.2's kv_init, 1.2
// before 1.3's step_begin, 1.3 and 1.4 before 1.5's seq_hidden, 1.5
// before 1.6's adapter_load, 1.6 before 1.7's seq_park).
constexpr size_t api_table_size(uint16_t minor) {
    return minor >= 8   ? sizeof(eh_plugin_api)
           : minor == 7 ? offsetof(eh_plugin_api, image_encode_sized)
           : minor == 6 ? offsetof(eh_plugin_api, seq_park)
           : minor == 5 ? offsetof(eh_plugin_api, adapter_load)
           : minor >= 3 ? offsetof(eh_plugin_api, seq_hidden)
           : minor == 2 ? offsetof(eh_plugin_api, step_begin)
                        : offsetof(eh_plugin_api, kv_init);
}

// True when the plugin runs batched steps (ABI 1.2 with its batched members).
inline bool api_has_step(const eh_plugin_api& api) {
    return api.abi_minor >= 2 && api.struct_size >= api_table_size(2) && api.step != nullptr;
}

// True when it has the session calls: always before ABI 1.4; a 1.4 plugin
// with the batched group may leave them out (it is then step-only).
inline bool api_has_sessions(const eh_plugin_api& api) { return api.session_create != nullptr; }

// True when it also runs them in two halves (ABI 1.3's step_begin / step_end).
inline bool api_has_step_halves(const eh_plugin_api& api) {
    return api_has_step(api) && api.abi_minor >= 3 && api.struct_size >= api_table_size(3) &&
           api.step_begin != nullptr && api.step_end != nullptr;
}

// True when its steps also keep final hidden states (ABI 1.5's
// EH_STEP_HIDDEN and seq_hidden): what embeddings and rerank scores need.
inline bool api_has_hidden(const eh_plugin_api& api) {
    return api_has_step(api) && api.abi_minor >= 5 && api.struct_size >= api_table_size(5) && api.seq_hidden != nullptr;
}

// True when it serves LoRA adapters (ABI 1.6's adapter_load,
// adapter_release and seq_set_adapter, beside the batched step).
inline bool api_has_adapters(const eh_plugin_api& api) {
    return api_has_step(api) && api.abi_minor >= 6 && api.struct_size >= api_table_size(6) &&
           api.adapter_load != nullptr && api.adapter_release != nullptr && api.seq_set_adapter != nullptr;
}

// True when it parks sequences in host memory (ABI 1.7's seq_park,
// seq_unpark and parked_release, beside the batched step): the host-memory
// prefix tier (--kv-host-bytes) needs it.
inline bool api_has_park(const eh_plugin_api& api) {
    return api_has_step(api) && api.abi_minor >= 7 && api.struct_size >= api_table_size(7) && api.seq_park != nullptr &&
           api.seq_unpark != nullptr && api.parked_release != nullptr;
}

// True when it takes images at their own size (ABI 1.8's image_encode_sized,
// beside the 1.6 image group): what an encoder with a tile (Qwen2.5-VL) needs.
inline bool api_has_sized_images(const eh_plugin_api& api) {
    return api_has_step(api) && api.abi_minor >= 8 && api.struct_size >= api_table_size(8) &&
           api.image_encoder_load != nullptr && api.image_encode != nullptr && api.seq_embd_spans != nullptr &&
           api.image_encode_sized != nullptr;
}

// Every plugin under `dir` (not recursive), accepted or rejected.
// Throws eh::Error(NoPlugin) only when `dir` itself cannot be read.
Registry discover_plugins(const std::string& dir, const LoaderOptions& options = {});

// Every plugin under each of `dirs`, in that order (plugin_search.hpp gives
// the default order). A plugin whose name an earlier directory already
// provided is rejected, unloaded, with the reason. Throws eh::Error(NoPlugin)
// when one of `dirs` cannot be read.
Registry discover_plugins(const std::vector<std::string>& dirs, const LoaderOptions& options = {});

// One plugin, from its manifest path.
PluginRecord load_plugin(const std::string& manifest_path, const LoaderOptions& options = {});

}  // namespace eh::loader
