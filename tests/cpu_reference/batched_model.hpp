// The CPU reference through its batched C table (ABI 1.2+): a model with a
// small KV cache (8 sequences of 64 tokens, 256 tokens a step) and its
// sequences, released with it; a step entry; a bitwise comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "plugin_handle.hpp"

namespace cpuref_test {

struct BatchedModel {
    eh_model* model = nullptr;
    eh_kv_info kv{};
    std::vector<eh_seq*> seqs;
    explicit BatchedModel(const eh_model_view* view) {
        eh_load_params lp = load_params(view);
        if (plugin().model_load(&lp, &model) != EH_OK)
            throw std::runtime_error(std::string("load: ") + plugin().plugin_last_error());
        eh_kv_params p{};
        p.struct_size = sizeof(p);
        p.max_seqs = 8;
        p.max_step_tokens = 256;
        p.max_step_entries = 8;
        p.max_seq_tokens = 64;
        kv.struct_size = sizeof(kv);
        if (plugin().kv_init(model, &p, &kv) != EH_OK) throw std::runtime_error(std::string("kv_init: ") + error());
    }
    ~BatchedModel() {
        for (eh_seq* s : seqs) plugin().seq_release(s);
        plugin().model_release(model);
    }
    BatchedModel(const BatchedModel&) = delete;
    BatchedModel& operator=(const BatchedModel&) = delete;
    std::string error() const { return plugin().model_last_error(model); }
    // A new sequence, greedy (sampled) or without a sampler (a hidden state
    // needs none).
    eh_seq* create(bool greedy = true) {
        eh_seq* s = nullptr;
        EXPECT_EQ(plugin().seq_create(model, &s), EH_OK) << error();
        if (greedy) {
            eh_sampling_params g = greedy_params();
            EXPECT_EQ(plugin().seq_set_sampling(s, &g), EH_OK) << error();
        }
        seqs.push_back(s);
        return s;
    }
    void release(eh_seq* s) {
        seqs.erase(std::find(seqs.begin(), seqs.end(), s));
        plugin().seq_release(s);
    }
    std::vector<float> logits(eh_seq* s) const {
        const float* l = nullptr;
        uint32_t n = 0;
        EXPECT_EQ(plugin().seq_logits(s, &l, &n), EH_OK) << error();
        return l ? std::vector<float>(l, l + n) : std::vector<float>();
    }
    std::vector<float> hidden(eh_seq* s) const {
        const float* h = nullptr;
        uint32_t n = 0;
        EXPECT_EQ(plugin().seq_hidden(s, &h, &n), EH_OK) << error();
        return h ? std::vector<float>(h, h + n) : std::vector<float>();
    }
};

inline eh_step_entry entry(eh_seq* s, const int32_t* tokens, uint32_t n,
                           uint32_t flags = EH_STEP_SAMPLE | EH_STEP_LOGITS) {
    eh_step_entry e{};
    e.struct_size = sizeof(e);
    e.flags = flags;
    e.seq = s;
    e.tokens = tokens;
    e.n_tokens = n;
    return e;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace cpuref_test
