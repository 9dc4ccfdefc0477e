// The tensor-parallel tests' load and check (tensor_parallel_test.cpp:
// llama-cuda, gpt_tensor_parallel_test.cpp: gpt-cuda): a model loaded over
// a list of ranks, teacher-forced logits at every position a fixed
// schedule asks for, and the sharded model's against the whole one's
// (top-1 agreement >= 99 %, |delta logprob| <= 0.02).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "step_seq.hpp"

namespace ehtest {

// A model loaded through `api` over `devices` (empty: the plain one-device
// load) with kv_init done (room for tp_teacher_forced's schedule); status /
// error of the call that failed.
struct TpLoaded {
    // device: eh_load_params.device; -1: devices[0] (or 0), as the host sets it
    TpLoaded(const eh_plugin_api* a, const char* path, const eh_model_view* view, const std::vector<int32_t>& devices,
             const char* options = nullptr, int device = -1)
        : api(a) {
        eh_load_params lp{};
        lp.progress = [](void* u, float, const char* stage) {
            if (stage) static_cast<TpLoaded*>(u)->stages.emplace_back(stage);
        };
        lp.progress_user = this;
        lp.struct_size = sizeof lp;
        lp.path = path;
        lp.view = view;
        lp.options_json = options;
        lp.device = device >= 0 ? device : devices.empty() ? 0 : devices[0];
        lp.n_devices = uint32_t(devices.size());
        lp.devices = devices.empty() ? nullptr : devices.data();
        status = api->model_load(&lp, &model);
        if (status != EH_OK) {
            error = api->plugin_last_error();
            return;
        }
        eh_model_info info{};
        info.struct_size = sizeof info;
        EXPECT_EQ(api->model_get_info(model, &info), EH_OK);
        vocab = int(info.vocab_size);
        KvShape k;
        k.max_seqs = k.max_step_entries = 4;
        k.max_seq_tokens = 256;
        k.max_step_tokens = 512;
        k.budget_bytes = 0;
        sm = std::make_unique<StepModel>(api, model, k);
        status = sm->status;
        error = sm->failure;
    }
    ~TpLoaded() {
        sm.reset();
        if (model) api->model_release(model);
    }
    TpLoaded(const TpLoaded&) = delete;
    TpLoaded& operator=(const TpLoaded&) = delete;

    const eh_plugin_api* api;
    eh_model* model = nullptr;
    eh_status status = EH_OK;
    std::string error;
    int vocab = 0;                    // the model's vocab_size
    std::vector<std::string> stages;  // the load's progress stages (its log lines)
    std::unique_ptr<StepModel> sm;
};

inline std::vector<int32_t> tp_tokens(size_t n, uint32_t salt, int vocab) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 37 + salt * 101 + 7) % size_t(vocab));
    return t;
}

// Three prompts (70 tokens: a tensor-core chunk; 20; 5) in one step, 16
// decode steps of all three (a multi-token step), then 12 of the first
// alone (single-token decode: the fused attention, the one-token FFN or
// expert kernels, CUDA graphs). Every entry's logits, in order.
inline std::vector<std::vector<float>> tp_teacher_forced(StepModel& sm, int vocab) {
    std::vector<std::vector<float>> out;
    const std::vector<size_t> prompt = {70, 20, 5};
    std::vector<std::vector<int32_t>> toks;
    std::vector<eh_seq*> s;
    for (size_t i = 0; i < 3; ++i) {
        toks.push_back(tp_tokens(prompt[i] + 40, uint32_t(i + 1), vocab));
        s.push_back(sm.create());
    }
    std::vector<size_t> fed(3, 0);
    auto step = [&](const std::vector<size_t>& who, bool prefill) {
        std::vector<eh_step_entry> es;
        for (size_t i : who) {
            const size_t k = prefill ? prompt[i] : 1;
            es.push_back(step_entry(s[i], toks[i].data() + fed[i], uint32_t(k)));
            fed[i] += k;
        }
        ASSERT_EQ(sm.api->step(sm.model, es.data(), uint32_t(es.size())), EH_OK) << sm.error();
        for (size_t i : who) out.push_back(sm.logits(s[i]));
    };
    step({0, 1, 2}, true);
    for (int d = 0; d < 16; ++d) step({0, 1, 2}, false);
    for (int d = 0; d < 12; ++d) step({0}, false);
    return out;
}

inline std::vector<double> tp_log_softmax(const std::vector<float>& l) {
    const double mx = *std::max_element(l.begin(), l.end());
    double z = 0;
    for (float x : l) z += std::exp(double(x) - mx);
    std::vector<double> o(l.size());
    for (size_t i = 0; i < l.size(); ++i) o[i] = double(l[i]) - mx - std::log(z);
    return o;
}

// `many` (the sharded model's) against `one` at every position; prints
// "[tp] <label>: ..." with the agreement and the largest |delta logprob|.
inline void expect_tp_agreement(const std::vector<std::vector<float>>& one, const std::vector<std::vector<float>>& many,
                                const std::string& label) {
    ASSERT_EQ(one.size(), many.size());
    ASSERT_FALSE(one.empty());
    size_t agree = 0;
    double worst = 0;
    for (size_t p = 0; p < one.size(); ++p) {
        ASSERT_EQ(one[p].size(), many[p].size());
        const size_t a = size_t(std::max_element(one[p].begin(), one[p].end()) - one[p].begin());
        const size_t b = size_t(std::max_element(many[p].begin(), many[p].end()) - many[p].begin());
        if (a == b) ++agree;
        const double d = std::fabs(tp_log_softmax(one[p])[a] - tp_log_softmax(many[p])[a]);
        worst = std::max(worst, d);
        EXPECT_LE(d, 0.02) << "position " << p << ": |delta logprob| of the one-rank top token " << a;
    }
    const double rate = double(agree) / double(one.size());
    std::printf("[tp] %s: %zu positions, top-1 agreement %.2f %%, max |delta logprob| %.3g\n", label.c_str(), one.size(),
                100.0 * rate, worst);
    EXPECT_GE(rate, 0.99) << agree << " of " << one.size() << " positions agree on the top token";
}

}  // namespace ehtest
