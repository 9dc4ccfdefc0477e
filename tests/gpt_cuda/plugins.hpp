// The gpt-cuda and cpu-reference plugins as the host sees them (dlopen, the
// entry symbol, the table), and a model with one sequence over one of them.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "../cuda/step_seq.hpp"

namespace gpttest {

inline const eh_plugin_api* open_plugin(const char* env, const char* path) {
    const char* p = std::getenv(env) ? std::getenv(env) : path;
    void* h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (!h) return nullptr;
    auto entry = reinterpret_cast<eh_plugin_entry_fn>(dlsym(h, EH_PLUGIN_ENTRY_SYMBOL));
    return entry ? entry(EH_ABI_MAJOR, EH_ABI_MINOR) : nullptr;
}
inline const eh_plugin_api* gpu_api() {
    static const eh_plugin_api* api = open_plugin("EH_GPT_CUDA_PLUGIN", GPT_CUDA_PLUGIN);
    return api;
}
inline const eh_plugin_api* cpu_api() {
    static const eh_plugin_api* api = open_plugin("EH_CPUREF_PLUGIN", CPUREF_PLUGIN);
    return api;
}

// The gpt-cuda plugin loads and finds a supported device.
inline bool plugin_gpu_usable() {
    const eh_plugin_api* api = gpu_api();
    if (!api) return false;
    eh_probe_result r{};
    r.struct_size = sizeof r;
    return api->probe(0, &r) == EH_OK && r.supported;
}

// A model with one sequence of n_ctx tokens through the batched step
// (tests/cuda/step_seq.hpp), whose calls return the logits they leave.
struct Engine : ehtest::StepSeq {
    Engine(const eh_plugin_api* a, const eh_model_view* view, uint32_t n_ctx, uint32_t step_tokens = 512)
        : StepSeq(a, view, ehtest::one_seq(n_ctx, step_tokens)) {}

    std::vector<float> prefill(const std::vector<int32_t>& t, int32_t* sampled = nullptr) {
        EXPECT_EQ(StepSeq::prefill(t, sampled), EH_OK) << error();
        return logits();
    }
    // One token: a decode step (the captured graph on the GPU).
    std::vector<float> decode(int32_t token, int32_t* next = nullptr) {
        EXPECT_EQ(StepSeq::decode(token, next), EH_OK) << error();
        return logits();
    }
};

}  // namespace gpttest
