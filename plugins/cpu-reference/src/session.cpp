#include "session.hpp"

#include "forward.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <engine_host/plugin_abi.hpp>

namespace cpuref {

using ehp::Error;

Session::Session(const Model& model, const eh_session_params& params)
    : model_(model), n_ctx_(params.n_ctx), cancel_(params.cancel), cancel_user_(params.cancel_user) {
    const Config& c = model.config();
    if (n_ctx_ == 0) throw Error(EH_INVALID_ARGUMENT, "n_ctx must be > 0");
    // gpt2 has a table of learned positions: no room past its end
    if (c.arch == Arch::Gpt2 && n_ctx_ > c.n_ctx_train) {
        n_ctx_ = c.n_ctx_train;
        ctx_limit_note_ = " (gpt2 has " + std::to_string(c.n_ctx_train) + " learned positions)";
    }
    const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * c.head_dim;
    const double kv_bytes = 2.0 * c.n_layer * static_cast<double>(n_ctx_) * static_cast<double>(kv_dim) * sizeof(float);
    if (kv_bytes > 1e12)
        throw Error(EH_INVALID_ARGUMENT, "n_ctx " + std::to_string(n_ctx_) + " needs a KV cache of " +
                                             std::to_string(static_cast<uint64_t>(kv_bytes / 1e9)) + " GB");
    kv_ = std::make_unique<KvPool>(c.n_layer, kv_dim, n_ctx_, 1);
    seq_ = std::make_unique<Sequence>(*kv_);
    logits_.assign(c.n_vocab, 0.0f);
}

void Session::prefill(const int32_t* tokens, uint32_t n) {
    if (n == 0) throw Error(EH_INVALID_ARGUMENT, "prefill needs at least one token");
    if (!tokens) throw Error(EH_INVALID_ARGUMENT, "tokens is NULL");
    if (static_cast<uint64_t>(seq_->length()) + n > n_ctx_)
        throw Error(EH_CONTEXT_FULL, "context full: " + std::to_string(seq_->length()) + " + " + std::to_string(n) +
                                         " tokens exceed n_ctx " + std::to_string(n_ctx_) + ctx_limit_note_);
    const uint32_t n_vocab = model_.config().n_vocab;
    for (uint32_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= n_vocab)
            throw Error(EH_INVALID_ARGUMENT, "token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                                 " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
    seq_->blocks.reserve(n);
    std::vector<float> out(n_vocab);
    const Slice slice{seq_.get(), tokens, n, out.data(), nullptr};
    forward(model_, std::span<const Slice>(&slice, 1), cancel_, cancel_user_);
    seq_->blocks.commit(tokens, n);
    logits_.swap(out);
    has_logits_ = true;
}

int32_t Session::sample() {
    if (!has_logits_) throw Error(EH_INVALID_ARGUMENT, "nothing to sample from: prefill first");
    return sampler_.sample(logits_.data(), static_cast<uint32_t>(logits_.size()), seq_->tokens());
}

int32_t Session::decode(int32_t token) {
    if (!sampler_.ready()) throw Error(EH_INVALID_ARGUMENT, "session_set_sampling must be called before decode");
    prefill(&token, 1);
    return sample();
}

void Session::reset() {
    seq_->truncate(0);
    has_logits_ = false;
}

}  // namespace cpuref
