// Several sequences fed teacher-forced through one model's batched step
// (step_seq.hpp's StepModel), so that prefill chunks of some share steps
// with the decodes of others: the mixes the batched tests compare against
// each sequence alone and against the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "step_seq.hpp"

namespace ehtest {

// Logits of sequence i at position p: [i][p], empty where none was asked.
using SeqLogits = std::vector<std::vector<std::vector<float>>>;

// The first `prompt` tokens of each sequence in chunks of `chunk` (0:
// whole), then one token a step, every sequence that still has tokens in
// every step. `only` (>= 0) feeds that sequence alone. Every entry asks for
// logits; the sequences are made on `m` (and released with it).
inline SeqLogits feed(StepModel& m, const std::vector<std::vector<int32_t>>& toks, size_t prompt, uint32_t chunk,
                      int only = -1) {
    SeqLogits out(toks.size());
    std::vector<eh_seq*> s(toks.size(), nullptr);
    std::vector<size_t> fed(toks.size(), 0);
    for (size_t i = 0; i < toks.size(); ++i) {
        out[i].resize(toks[i].size());
        if (only < 0 || size_t(only) == i) s[i] = m.create();
        else fed[i] = toks[i].size();
    }
    for (int guard = 0; guard < 10000; ++guard) {
        std::vector<eh_step_entry> es;
        std::vector<size_t> who;
        for (size_t i = 0; i < toks.size(); ++i) {
            if (fed[i] == toks[i].size()) continue;
            const size_t p = std::min(prompt, toks[i].size());
            size_t k = 1;
            if (fed[i] < p) k = chunk ? std::min<size_t>(chunk, p - fed[i]) : p - fed[i];
            es.push_back(step_entry(s[i], toks[i].data() + fed[i], uint32_t(k)));
            who.push_back(i);
            fed[i] += k;
        }
        if (es.empty()) break;
        EXPECT_EQ(m.api->step(m.model, es.data(), uint32_t(es.size())), EH_OK) << m.error();
        for (size_t j = 0; j < es.size(); ++j) out[who[j]][fed[who[j]] - 1] = m.logits(s[who[j]]);
    }
    return out;
}

}  // namespace ehtest
