// `--device`: which kind of plugin may serve a model, for the commands that
// load one (serve, chat) and for inspect's "which plugin would serve it".
//
// The default, auto, is the worker contract's VRAM-only rule: when a GPU
// plugin serves the model's format, architecture and tensor types, only a GPU
// plugin may serve it; if every such plugin was rejected (no driver, a bad
// GPU ordinal, ...), the command fails with exit 3 and their reasons instead
// of running the model on the CPU engine unasked.
#pragma once

#include <string>

#include "eh/registry.hpp"

namespace eh::cli {

inline constexpr const char* kDeviceHelp =
    "auto, gpu, cpu or any. auto: a GPU plugin when one serves the model's architecture, and exit 3 with its "
    "reasons when it was rejected (never a silent CPU fallback); otherwise a CPU plugin. gpu: only a GPU plugin. "
    "cpu: only a CPU plugin. any: the best accepted plugin of either kind (falls back to the CPU)";

// auto|gpu|cpu|any; false for anything else.
bool parse_device_policy(const std::string& text, DevicePolicy& out);

// The plugin that serves `need` under `policy`; when there is none, throws
// Error(NO_PLUGIN) with no_plugin_message.
const PluginRecord& choose_plugin(const Registry& reg, const ModelRequirements& need, DevicePolicy policy);

// Why `res` (found no plugin) found none, and what to do: when GPU plugins
// that serve the model were rejected and a CPU plugin could serve it, the
// hint to ask for the CPU engine with --device cpu.
std::string no_plugin_message(const Registry& reg, const ModelRequirements& need, const Resolution& res);

}  // namespace eh::cli
