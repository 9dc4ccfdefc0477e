// Teacher-forced logits of a plugin through its C ABI: one sequence, one
// token a step (the first a one-token prompt, every later one a decode step,
// which the CUDA plugins run as a captured graph), the logits after each.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "step_seq.hpp"

namespace ehtest {

inline std::vector<std::vector<float>> run_positions(const eh_plugin_api* api, const eh_model_view* view,
                                                     const std::vector<int32_t>& toks, uint32_t n_ctx = 128) {
    std::vector<std::vector<float>> out;
    StepSeq s(api, view, one_seq(n_ctx), nullptr, "");
    EXPECT_TRUE(s.ok()) << s.failure;
    if (!s.ok()) return out;
    for (int32_t t : toks) {
        EXPECT_EQ(s.decode(t), EH_OK) << s.error();
        out.push_back(s.logits());
    }
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
