// The plugin as the host sees it: dlopen, the entry symbol, the table.
#pragma once

#include <dlfcn.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace cpuref_test {

inline const eh_plugin_api& plugin() {
    static const eh_plugin_api* api = [] {
        void* lib = dlopen(CPUREF_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
        if (!lib) throw std::runtime_error(std::string("dlopen: ") + dlerror());
        auto entry = reinterpret_cast<eh_plugin_entry_fn>(dlsym(lib, EH_PLUGIN_ENTRY_SYMBOL));
        if (!entry) throw std::runtime_error("no " EH_PLUGIN_ENTRY_SYMBOL);
        return entry(EH_ABI_MAJOR, EH_ABI_MINOR);  // library stays loaded for the process
    }();
    if (!api) throw std::runtime_error("plugin returned no table");
    return *api;
}

inline eh_load_params load_params(const eh_model_view* view, uint32_t n_threads = 2) {
    eh_load_params p{};
    p.struct_size = sizeof(p);
    p.path = "";
    p.view = view;
    p.n_threads = n_threads;
    return p;
}

inline eh_sampling_params greedy_params() {
    eh_sampling_params p{};
    p.struct_size = sizeof(p);
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.repetition_window = -1;
    return p;
}

// RAII model + session, failing loudly with the plugin's message.
struct Loaded {
    eh_model* model = nullptr;
    eh_session* session = nullptr;
    Loaded(const eh_model_view* view, uint32_t n_ctx) {
        const eh_plugin_api& api = plugin();
        eh_load_params lp = load_params(view);
        if (api.model_load(&lp, &model) != EH_OK) throw std::runtime_error(std::string("load: ") + api.plugin_last_error());
        eh_session_params sp{};
        sp.struct_size = sizeof(sp);
        sp.n_ctx = n_ctx;
        if (api.session_create(model, &sp, &session) != EH_OK)
            throw std::runtime_error(std::string("session: ") + api.model_last_error(model));
        eh_sampling_params g = greedy_params();
        api.session_set_sampling(session, &g);
    }
    ~Loaded() {
        if (session) plugin().session_release(session);
        if (model) plugin().model_release(model);
    }
    std::vector<float> prefill(const std::vector<int32_t>& tokens) {
        const eh_plugin_api& api = plugin();
        if (api.session_prefill(session, tokens.data(), static_cast<uint32_t>(tokens.size())) != EH_OK)
            throw std::runtime_error(std::string("prefill: ") + api.session_last_error(session));
        return logits();
    }
    std::vector<float> logits() {
        const float* l = nullptr;
        uint32_t n = 0;
        if (plugin().session_logits(session, &l, &n) != EH_OK) throw std::runtime_error("logits");
        return std::vector<float>(l, l + n);
    }
};

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float m = 0.0f;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}
inline float max_abs(const std::vector<float>& a) {
    float m = 0.0f;
    for (float x : a) m = std::max(m, std::fabs(x));
    return m;
}

}  // namespace cpuref_test
