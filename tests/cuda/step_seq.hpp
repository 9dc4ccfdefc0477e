// A plugin driven through its batched step (ABI 1.2's kv_init, seq_* and
// step) over the raw C table: a model with its KV cache, its sequences, and
// one sequence in the shape the model tests need (prefill a prompt, decode a
// token, read the logits). The CUDA plugins export no session calls, so
// every test that runs a whole model on them comes through here; the CPU
// reference, which has both, runs the same way beside them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <engine_host/plugin_abi.hpp>

namespace ehtest {

// What kv_init asks for. budget_bytes 0: the plugin's default share of the
// free memory (the pool never takes more than max_seqs full sequences);
// kv_type 0: the plugin's default cache type (the CUDA plugins' is F16).
struct KvShape {
    uint32_t max_seqs = 1;
    uint32_t max_step_tokens = 512;
    uint32_t max_step_entries = 1;
    uint32_t max_seq_tokens = 256;
    uint64_t budget_bytes = 0;
    uint32_t kv_type = 0;
};

// One sequence of n_ctx tokens whose prompt steps take up to step_tokens.
inline KvShape one_seq(uint32_t n_ctx, uint32_t step_tokens = 512) {
    KvShape k;
    k.max_seq_tokens = n_ctx;
    k.max_step_tokens = step_tokens;
    return k;
}

inline eh_step_entry step_entry(eh_seq* s, const int32_t* tokens, uint32_t n,
                                uint32_t flags = EH_STEP_SAMPLE | EH_STEP_LOGITS) {
    eh_step_entry e{};
    e.struct_size = sizeof e;
    e.flags = flags;
    e.seq = s;
    e.tokens = tokens;
    e.n_tokens = n;
    return e;
}

// A model loaded through `api` with kv_init done; on failure `status` and
// `failure` are those of the call that failed (model_load or kv_init).
// Sequences made here are released before the model.
class StepModel {
public:
    StepModel(const eh_plugin_api* a, const eh_model_view* view, const KvShape& shape = {},
              const char* options = nullptr, const char* path = "test-model")
        : api(a) {
        eh_load_params lp{};
        lp.struct_size = sizeof lp;
        lp.path = path;
        lp.view = view;
        lp.options_json = options;
        status = api->model_load(&lp, &model);
        if (status != EH_OK) {
            failure = api->plugin_last_error();
            return;
        }
        init_kv(shape);
    }
    // Over a model loaded and released by someone else (the host's
    // EngineModel): kv_init and the sequences only.
    StepModel(const eh_plugin_api* a, eh_model* borrowed, const KvShape& shape) : api(a), model(borrowed), owned_(false) {
        init_kv(shape);
    }
    ~StepModel() {
        for (eh_seq* s : seqs) api->seq_release(s);
        if (model && owned_) api->model_release(model);
    }
    StepModel(const StepModel&) = delete;
    StepModel& operator=(const StepModel&) = delete;

    bool ok() const { return status == EH_OK; }
    std::string error() const { return model ? api->model_last_error(model) : api->plugin_last_error(); }

    // Greedy sampling, released with the model.
    eh_seq* add(eh_seq* s) {
        if (!s) return s;
        const eh_sampling_params g = ehp::greedy_sampling();
        EXPECT_EQ(api->seq_set_sampling(s, &g), EH_OK) << error();
        seqs.push_back(s);
        return s;
    }
    eh_seq* create() {
        eh_seq* s = nullptr;
        EXPECT_EQ(api->seq_create(model, &s), EH_OK) << error();
        return add(s);
    }
    eh_seq* fork(eh_seq* src, uint32_t n) {
        eh_seq* s = nullptr;
        EXPECT_EQ(api->seq_fork(src, n, &s), EH_OK) << error();
        return add(s);
    }
    void release(eh_seq* s) {
        seqs.erase(std::remove(seqs.begin(), seqs.end(), s), seqs.end());
        api->seq_release(s);
    }
    std::vector<float> logits(eh_seq* s) const {
        const float* l = nullptr;
        uint32_t n = 0;
        EXPECT_EQ(api->seq_logits(s, &l, &n), EH_OK) << error();
        return l ? std::vector<float>(l, l + n) : std::vector<float>();
    }
    uint32_t free_blocks() const {
        eh_kv_info i{};
        i.struct_size = sizeof i;
        EXPECT_EQ(api->kv_get_info(model, &i), EH_OK) << error();
        return i.free_blocks;
    }

    const eh_plugin_api* api = nullptr;
    eh_model* model = nullptr;
    eh_kv_info kv{};
    eh_status status = EH_OK;
    std::string failure;
    std::vector<eh_seq*> seqs;

private:
    void init_kv(const KvShape& shape) {
        if (!api->kv_init) {
            status = EH_UNSUPPORTED;
            failure = "the plugin has no batched step";
            return;
        }
        eh_kv_params p{};
        p.struct_size = sizeof p;
        p.max_seqs = shape.max_seqs;
        p.max_step_tokens = shape.max_step_tokens;
        p.max_step_entries = shape.max_step_entries;
        p.max_seq_tokens = shape.max_seq_tokens;
        p.budget_bytes = shape.budget_bytes;
        p.kv_type = shape.kv_type;
        kv.struct_size = sizeof kv;
        status = api->kv_init(model, &p, &kv);
        if (status != EH_OK) failure = api->model_last_error(model);
    }
    bool owned_ = true;
};

// One sequence on a StepModel of its own, as a session was: prefill()
// takes a prompt in steps of up to max_step_tokens, decode() one token; the
// last step of each samples (greedy unless set_sampling) and keeps the raw
// logits (flags says which of the two).
class StepSeq : public StepModel {
public:
    StepSeq(const eh_plugin_api* a, const eh_model_view* view, const KvShape& shape, const char* options = nullptr,
            const char* path = "test-model")
        : StepModel(a, view, shape, options, path) {
        if (ok()) seq = create();
    }
    StepSeq(const eh_plugin_api* a, eh_model* borrowed, const KvShape& shape) : StepModel(a, borrowed, shape) {
        if (ok()) seq = create();
    }

    eh_status set_sampling(const eh_sampling_params& p) { return api->seq_set_sampling(seq, &p); }
    // The statuses are the plugin's; error() says why.
    eh_status prefill(const int32_t* tokens, uint32_t n, int32_t* sampled = nullptr) {
        const uint32_t chunk = std::max<uint32_t>(kv.max_step_tokens, 1);
        for (uint32_t done = 0;;) {
            const uint32_t k = std::min(n - done, chunk);
            const bool last = done + k >= n;
            eh_step_entry e = step_entry(seq, tokens + done, k, last ? flags : 0u);
            if (const eh_status st = api->step(model, &e, 1); st != EH_OK) return st;
            done += k;
            if (last) {
                if (sampled) *sampled = e.token;
                return EH_OK;
            }
        }
    }
    eh_status prefill(const std::vector<int32_t>& tokens, int32_t* sampled = nullptr) {
        return prefill(tokens.data(), uint32_t(tokens.size()), sampled);
    }
    eh_status decode(int32_t token, int32_t* next = nullptr) { return prefill(&token, 1, next); }
    std::vector<float> logits() const { return StepModel::logits(seq); }
    uint32_t length() const { return api->seq_length(seq); }
    // Empty again, as a new request's sequence.
    eh_status reset() { return api->seq_truncate(seq, 0); }

    eh_seq* seq = nullptr;
    uint32_t flags = EH_STEP_SAMPLE | EH_STEP_LOGITS;
};

}  // namespace ehtest
