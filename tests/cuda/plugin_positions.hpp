// Teacher-forced logits of a plugin through its C ABI: the first token by
// prefill, every later one by session_decode (the captured decode graph on
// the CUDA plugins), the logits after each.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace ehtest {

inline std::vector<std::vector<float>> run_positions(const eh_plugin_api* api, const eh_model_view* view,
                                                     const std::vector<int32_t>& toks, uint32_t n_ctx = 128) {
    std::vector<std::vector<float>> out;
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = "";
    lp.view = view;
    lp.n_threads = 4;
    eh_model* m = nullptr;
    EXPECT_EQ(api->model_load(&lp, &m), EH_OK) << api->plugin_last_error();
    if (!m) return out;
    eh_session_params sp{};
    sp.struct_size = sizeof sp;
    sp.n_ctx = n_ctx;
    eh_session* s = nullptr;
    EXPECT_EQ(api->session_create(m, &sp, &s), EH_OK) << api->model_last_error(m);
    if (!s) {
        api->model_release(m);
        return out;
    }
    eh_sampling_params g{};
    g.struct_size = sizeof g;
    g.top_p = 1;
    g.repetition_penalty = 1;
    g.repetition_window = -1;
    api->session_set_sampling(s, &g);
    for (size_t t = 0; t < toks.size(); ++t) {
        int32_t next;
        eh_status st = t == 0 ? api->session_prefill(s, &toks[t], 1) : api->session_decode(s, toks[t], &next);
        EXPECT_EQ(st, EH_OK) << api->session_last_error(s);
        const float* lg = nullptr;
        uint32_t n = 0;
        api->session_logits(s, &lg, &n);
        out.emplace_back(lg, lg + n);
    }
    api->session_release(s);
    api->model_release(m);
    return out;
}

// The largest |a - b| over every position's logits, relative to the largest
// |b| at that position (b: the reference).
inline double worst_relative(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    double worst = 0;
    for (size_t t = 0; t < a.size() && t < b.size(); ++t) {
        double mx = 1e-6, err = 0;
        for (size_t i = 0; i < b[t].size() && i < a[t].size(); ++i) {
            mx = std::max(mx, double(std::fabs(b[t][i])));
            err = std::max(err, double(std::fabs(a[t][i] - b[t][i])));
        }
        worst = std::max(worst, err / mx);
    }
    return worst;
}

}  // namespace ehtest
