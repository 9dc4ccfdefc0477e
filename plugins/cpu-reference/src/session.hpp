// The 1.0/1.1 session: one sequence with a KV cache of its own, the logits
// of its last position, and its sampler. The batched calls (batch.hpp) share
// the forward pass and the sequence type with it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "kv_pool.hpp"
#include "model.hpp"
#include "sampler.hpp"
#include "sequence.hpp"

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

    uint32_t n_past() const { return seq_->length(); }
    const std::vector<float>& logits() const { return logits_; }
    bool has_logits() const { return has_logits_; }

    std::string last_error;

private:
    const Model& model_;
    uint32_t n_ctx_;
    std::string ctx_limit_note_;  // why n_ctx_ is below what was asked for
    eh_cancel_fn cancel_;
    void* cancel_user_;
    std::unique_ptr<KvPool> kv_;  // one block of n_ctx positions
    std::unique_ptr<Sequence> seq_;
    std::vector<float> logits_;
    bool has_logits_ = false;
    Sampler sampler_;
};

}  // namespace cpuref
