// dlopen()s the built llama-cuda plugin and exposes its function table.
#pragma once

#include <dlfcn.h>

#include <cstdlib>

#include <string>

#include <engine_host/plugin_abi.h>

namespace ehtest {

inline const eh_plugin_api* llama_cuda_api() {
    static const eh_plugin_api* api = [] {
        void* h = dlopen(std::getenv("EH_LLAMA_CUDA_PLUGIN") ? std::getenv("EH_LLAMA_CUDA_PLUGIN") : EH_LLAMA_CUDA_PLUGIN, RTLD_NOW | RTLD_LOCAL);
        if (!h) return static_cast<const eh_plugin_api*>(nullptr);
        auto entry = reinterpret_cast<eh_plugin_entry_fn>(dlsym(h, EH_PLUGIN_ENTRY_SYMBOL));
        return entry ? entry(EH_ABI_MAJOR, EH_ABI_MINOR) : nullptr;
    }();
    return api;
}

}  // namespace ehtest
