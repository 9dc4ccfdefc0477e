// The plugins a GPU test compares through the C ABI, loaded as the host
// loads them (dlopen, the entry symbol, the table; a path in the
// environment variable of the macro's name wins over the built one): the
// CUDA plugin under test and the CPU reference beside it; whether the CUDA
// one finds a device it supports; and a test's first lines, which skip
// without such a device and fail when a plugin does not load.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <engine_host/plugin_abi.h>

#ifdef EH_LLAMA_CUDA_PLUGIN
#include "plugin_handle.hpp"  // llama_cuda_api()
#endif

namespace ehtest {

// The table of the plugin at $env, else at `built`; null when it does not load.
inline const eh_plugin_api* open_plugin(const char* env, const char* built) {
    const char* path = std::getenv(env);
    void* lib = dlopen(path ? path : built, RTLD_NOW | RTLD_LOCAL);
    auto entry = lib ? reinterpret_cast<eh_plugin_entry_fn>(dlsym(lib, EH_PLUGIN_ENTRY_SYMBOL)) : nullptr;
    return entry ? entry(EH_ABI_MAJOR, EH_ABI_MINOR) : nullptr;
}

#ifdef EH_CPU_REFERENCE_PLUGIN
inline const eh_plugin_api* cpu_reference_api() {
    static const eh_plugin_api* api = open_plugin("EH_CPU_REFERENCE_PLUGIN", EH_CPU_REFERENCE_PLUGIN);
    return api;
}
#endif

#ifdef EH_GPT_CUDA_PLUGIN
inline const eh_plugin_api* gpt_cuda_api() {
    static const eh_plugin_api* api = open_plugin("EH_GPT_CUDA_PLUGIN", EH_GPT_CUDA_PLUGIN);
    return api;
}
#endif

// The plugin loaded and its probe finds device 0 supported.
inline bool gpu_usable(const eh_plugin_api* api) {
    if (!api) return false;
    eh_probe_result r{};
    r.struct_size = sizeof r;
    return api->probe(0, &r) == EH_OK && r.supported;
}

}  // namespace ehtest

// Skips without a device `gpu` supports; fails (with `gpu_missing` for the
// CUDA plugin) when either plugin is not loadable.
#define REQUIRE_PLUGIN_PAIR(gpu, gpu_missing)                                                  \
    if (!::ehtest::gpu_usable(gpu)) GTEST_SKIP() << "no usable CUDA device";                   \
    ASSERT_NE(::ehtest::cpu_reference_api(), nullptr) << "cpu-reference plugin not loadable"; \
    ASSERT_NE(gpu, nullptr) << gpu_missing
