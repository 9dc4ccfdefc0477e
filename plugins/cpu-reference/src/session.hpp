// One sequence: its KV cache, the tokens in context, the logits of the last
// position, and the sampler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "model.hpp"
#include "sampler.hpp"

namespace cpuref {

class Session {
public:
    Session(const Model& model, const eh_session_params& params);

    // Appends tokens and computes the logits of the last one. Throws
    // ehp::Error: CONTEXT_FULL (nothing appended), INVALID_ARGUMENT (bad
    // token id), CANCELLED (nothing appended; previous logits kept).
    void prefill(const int32_t* tokens, uint32_t n);
    int32_t sample();
    int32_t decode(int32_t token);
    void reset();
    void set_sampling(const eh_sampling_params& p) { sampler_.set(p); }

    uint32_t n_past() const { return static_cast<uint32_t>(tokens_.size()); }
    const std::vector<float>& logits() const { return logits_; }
    bool has_logits() const { return has_logits_; }

    std::string last_error;

private:
    void forward(const int32_t* tokens, uint32_t n);
    void attention(const Layer& L, uint32_t layer, size_t T, int64_t pos0,
                   float* q, float* k, float* v, float* out);
    void feed_forward(const Layer& L, size_t T, const float* in, float* out);
    void moe(const Layer& L, size_t T, const float* in, float* out);

    const Model& model_;
    uint32_t n_ctx_;
    std::string ctx_limit_note_;  // why n_ctx_ is below what was asked for
    eh_cancel_fn cancel_;
    void* cancel_user_;
    std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer: n_ctx x kv_dim
    std::vector<int32_t> tokens_;
    std::vector<float> logits_;
    bool has_logits_ = false;
    Sampler sampler_;
};

}  // namespace cpuref
