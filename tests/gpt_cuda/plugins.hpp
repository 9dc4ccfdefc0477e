// The gpt-cuda and cpu-reference plugins as the host sees them (dlopen, the
// entry symbol, the table), and a model + session pair over one of them.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

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

struct Engine {
    const eh_plugin_api* api = nullptr;
    eh_model* model = nullptr;
    eh_session* session = nullptr;
    eh_status status = EH_OK;
    std::string error;

    Engine(const eh_plugin_api* a, const eh_model_view* view, uint32_t n_ctx) : api(a) {
        eh_load_params lp{};
        lp.struct_size = sizeof lp;
        lp.path = "test-model";
        lp.view = view;
        lp.n_threads = 0;
        status = api->model_load(&lp, &model);
        if (status != EH_OK) {
            error = api->plugin_last_error();
            return;
        }
        eh_session_params sp{};
        sp.struct_size = sizeof sp;
        sp.n_ctx = n_ctx;
        status = api->session_create(model, &sp, &session);
        if (status != EH_OK) {
            error = api->model_last_error(model);
            return;
        }
        eh_sampling_params smp{};
        smp.struct_size = sizeof smp;
        smp.top_p = 1;
        smp.repetition_penalty = 1;
        smp.repetition_window = -1;
        status = api->session_set_sampling(session, &smp);
    }
    ~Engine() {
        if (session) api->session_release(session);
        if (model) api->model_release(model);
    }
    bool ok() const { return status == EH_OK; }

    std::vector<float> logits() {
        const float* p = nullptr;
        uint32_t n = 0;
        EXPECT_EQ(api->session_logits(session, &p, &n), EH_OK) << api->session_last_error(session);
        return p ? std::vector<float>(p, p + n) : std::vector<float>{};
    }
    std::vector<float> prefill(const std::vector<int32_t>& t) {
        EXPECT_EQ(api->session_prefill(session, t.data(), uint32_t(t.size())), EH_OK) << api->session_last_error(session);
        return logits();
    }
    // Through the decode path (the captured graph on the GPU).
    std::vector<float> decode(int32_t token, int32_t* next = nullptr) {
        int32_t out = -1;
        EXPECT_EQ(api->session_decode(session, token, &out), EH_OK) << api->session_last_error(session);
        if (next) *next = out;
        return logits();
    }
};

}  // namespace gpttest
