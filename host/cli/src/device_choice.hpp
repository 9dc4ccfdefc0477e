// `--device`: which kind of plugin may serve a model, for the commands that
// load one (serve, chat) and for inspect's "which plugin would serve it".
//
// The default, auto, is the worker contract's VRAM-only rule: when a GPU
// plugin serves the model's format, architecture and tensor types, only a GPU
// plugin may serve it; if every such plugin was rejected (no driver, a bad
// GPU ordinal, ...), the command fails with exit 3 and their reasons instead
// of running the model on the CPU engine unasked.
//
// A GPU named on the command line (`--gpu-device N`, chat's and inspect's
// `--gpu N`) is a request for that GPU under every policy but cpu (which
// never looks at it): when no GPU plugin accepted GPU N (it does not exist,
// no driver, ...), the command fails with exit 3 naming N and each GPU
// plugin's probe reason (the CUDA plugins' says how many GPUs there are),
// even with --device any. Only the default GPU 0, not named, lets `any`
// fall back to the CPU.
#pragma once

#include <optional>
#include <string>

#include "eh/registry.hpp"

namespace eh::cli {

inline constexpr const char* kDeviceHelp =
    "auto, gpu, cpu or any. auto: a GPU plugin when one serves the model's architecture, and exit 3 with its "
    "reasons when it was rejected (never a silent CPU fallback); otherwise a CPU plugin. gpu: only a GPU plugin. "
    "cpu: only a CPU plugin. any: the best accepted plugin of either kind (falls back to the CPU, unless a GPU was "
    "named with the GPU option). A GPU named on the command line that no GPU plugin accepts is an error (exit 3) "
    "under every policy but cpu, which ignores it";

// The GPU option's help, for serve's --gpu-device and chat's and inspect's --gpu.
inline constexpr const char* kGpuHelp =
    "GPU ordinal (default 0). Named on the command line, it must be a GPU a GPU plugin accepts, else exit 3 "
    "(its probe says why, e.g. \"CUDA device 9 does not exist (2 present)\"); --device cpu ignores it";

// auto|gpu|cpu|any; false for anything else.
bool parse_device_policy(const std::string& text, DevicePolicy& out);

// Why GPU `gpu`, named on the command line, cannot be used: "" when policy
// is Cpu or a GPU plugin accepted it; otherwise a message naming the GPU and
// every GPU plugin with its reasons (or saying there is none).
std::string named_gpu_problem(const Registry& reg, int gpu, DevicePolicy policy);

// The plugin that serves `need` under `policy`; when there is none, or
// `named_gpu` (a GPU given on the command line) has a named_gpu_problem,
// throws Error(NO_PLUGIN) with the message.
const PluginRecord& choose_plugin(const Registry& reg, const ModelRequirements& need, DevicePolicy policy,
                                  std::optional<int> named_gpu);

// Why `res` (found no plugin) found none, and what to do: when GPU plugins
// that serve the model were rejected and a CPU plugin could serve it, the
// hint to ask for the CPU engine with --device cpu.
std::string no_plugin_message(const Registry& reg, const ModelRequirements& need, const Resolution& res);

}  // namespace eh::cli
