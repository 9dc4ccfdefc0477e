#include "ehcuda/session_base.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <ehcuda/check.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/sampler.hpp>

namespace ehcuda {

SessionBase::SessionBase(const SessionShape& shape, const eh_session_params& params)
    : device_(shape.device),
      ledger_(shape.ledger),
      n_vocab_(shape.n_vocab),
      n_ctx_(params.n_ctx),
      cancel_(params.cancel),
      cancel_user_(params.cancel_user) {
    if (n_ctx_ == 0 || n_ctx_ > (1u << 24)) throw ehp::Error(EH_INVALID_ARGUMENT, "n_ctx must be in 1..16777216");
    n_ctx_ = std::min(n_ctx_, shape.n_ctx_cap);
    EHC_CHECK(cudaSetDevice(device_));
    max_batch_ = int(std::min<uint32_t>(n_ctx_, uint32_t(shape.max_batch)));
    plan_ = shape.plan ? *shape.plan : plan();
    const KernelPlan& kp = plan_;
    if (!shape.profile_groups.empty()) {
        profile_ = kp.profile_decode;
        group_names_ = shape.profile_groups;
        group_names_.push_back("sampler");
        group_ms_.assign(group_names_.size(), 0.0);
    }
    pipeline_ = kp.pipeline;
}

void SessionBase::finish_init(PrefillShape ps) {
    MemoryLedger* L = ledger_;
    const size_t B = size_t(max_batch_);
    for (DeviceBuffer& b : logits_) b = DeviceBuffer(size_t(n_vocab_) * 4, L);
    history_ = DeviceBuffer(size_t(n_ctx_) * 4, L);
    tokens_ = DeviceBuffer(B * 4, L);
    step_ = DeviceBuffer(sizeof(Step), L);
    params_ = DeviceBuffer(sizeof(SamplerParams), L);
    counter_ = DeviceBuffer(sizeof(unsigned long long), L);
    out_token_ = DeviceBuffer(4, L);
    fwork_ = DeviceBuffer(size_t(n_vocab_) * 4, L);
    iwork_ = DeviceBuffer(size_t(n_vocab_) * 4, L);
    ps.max_tokens = max_batch_;
    prefill_ws_ = std::make_unique<PrefillWorkspace>(ps, stream_.get(), L);
    EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_step_), sizeof(Step)));
    EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_out_), 2 * sizeof(int32_t)));
    for (cudaEvent_t& e : step_done_) EHC_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_tokens_), B * sizeof(int32_t)));
    *h_step_ = Step{};
    EHC_CHECK(cudaMemsetAsync(step_.get(), 0, sizeof(Step), stream_.get()));
    EHC_CHECK(cudaMemsetAsync(counter_.get(), 0, sizeof(unsigned long long), stream_.get()));
    SamplerParams sp;  // greedy until set
    EHC_CHECK(cudaMemcpyAsync(params_.get(), &sp, sizeof sp, cudaMemcpyHostToDevice, stream_.get()));
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
}

SessionBase::~SessionBase() {
    // A step run ahead may still be writing the pinned token mirror.
    if (stream_.get()) cudaStreamSynchronize(stream_.get());
    if (profile_ && profiled_steps_) print_profile();
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (cudaEvent_t e : step_done_)
        if (e) cudaEventDestroy(e);
    for (CapturedGraph& g : decode_graph_) g.reset();
    if (h_step_) cudaFreeHost(h_step_);
    if (h_out_) cudaFreeHost(h_out_);
    if (h_tokens_) cudaFreeHost(h_tokens_);
}

void SessionBase::set_sampling(const eh_sampling_params& p) {
    const SamplerParams sp = sampler_params_of(p);
    EHC_CHECK(cudaSetDevice(device_));
    settle();  // a step run ahead drew with the old settings
    EHC_CHECK(cudaMemcpyAsync(params_.get(), &sp, sizeof sp, cudaMemcpyHostToDevice, stream_.get()));
    EHC_CHECK(cudaMemsetAsync(counter_.get(), 0, sizeof(unsigned long long), stream_.get()));
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
    have_sampling_ = true;
}

void SessionBase::check_cancel() {
    if (cancel_ && cancel_(cancel_user_)) throw ehp::Error(EH_CANCELLED, "cancelled");
}

std::string SessionBase::vocab_text() const { return "(" + std::to_string(n_vocab_) + ")"; }

void SessionBase::check_tokens(const int32_t* tokens, uint32_t n) const {
    for (uint32_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= n_vocab_)
            throw ehp::Error(EH_INVALID_ARGUMENT, "token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                                      " is outside the vocabulary " + vocab_text());
}

void SessionBase::run_forward(int ntok, const int32_t* d_tokens, bool decode_path) {
    record_tokens(history_.as<int32_t>(), d_pos0(), d_tokens, ntok, stream_.get());
    forward(ntok, d_tokens, decode_path);
}

void SessionBase::prefill(const int32_t* tokens, uint32_t n) {
    if (n == 0) throw ehp::Error(EH_INVALID_ARGUMENT, "prefill with no tokens");
    if (!tokens) throw ehp::Error(EH_INVALID_ARGUMENT, "tokens is NULL");
    if (uint64_t(n_past_) + n > n_ctx_)
        throw ehp::Error(EH_CONTEXT_FULL, "context full: " + std::to_string(n_past_) + " + " + std::to_string(n) +
                                              " tokens exceed n_ctx " + std::to_string(n_ctx_) + context_note());
    check_tokens(tokens, n);
    EHC_CHECK(cudaSetDevice(device_));
    settle();
    cudaStream_t s = stream_.get();
    const uint32_t start = n_past_;
    fwd_slot_ = slot_;
    try {
        for (uint32_t done = 0; done < n;) {
            check_cancel();
            const int nb = int(std::min<uint32_t>(n - done, uint32_t(max_batch_)));
            // The pinned mirrors are reused per chunk, so the previous chunk
            // must have consumed them.
            EHC_CHECK(cudaStreamSynchronize(s));
            std::copy(tokens + done, tokens + done + nb, h_tokens_);
            EHC_CHECK(cudaMemcpyAsync(tokens_.get(), h_tokens_, size_t(nb) * 4, cudaMemcpyHostToDevice, s));
            write_step(Step{int32_t(n_past_), int32_t(n_past_) + nb});
            run_forward(nb, tokens_.as<int32_t>(), false);
            n_past_ += uint32_t(nb);
            done += uint32_t(nb);
        }
        EHC_CHECK(cudaStreamSynchronize(s));
    } catch (...) {
        // The cache past `start` may be partly written; those positions are
        // simply not counted, so the session stays consistent.
        cudaStreamSynchronize(s);
        n_past_ = start;
        have_logits_ = false;
        throw;
    }
    have_logits_ = true;
}

void SessionBase::sample_on_device(int slot, Step* next) {
    sample_tokens(logits_[slot].as<float>(), n_vocab_, history_.as<int32_t>(), &step_.as<Step>()->n_hist,
                  params_.as<SamplerParams>(), counter_.as<unsigned long long>(), {fwork_.as<float>(), iwork_.as<int32_t>()},
                  out_token_.as<int32_t>(), stream_.get(), next);
}

void SessionBase::write_step(const Step& st) {
    *h_step_ = st;
    EHC_CHECK(cudaMemcpyAsync(step_.get(), h_step_, sizeof(Step), cudaMemcpyHostToDevice, stream_.get()));
}

// Drops a step run ahead (decode()): its KV-cache row and history entry lie
// at position n_past_, which nothing reads before it is written again, and
// its logits and token mirror are the other slot's; only the draw counter
// must go back. Stream-ordered: no host wait.
void SessionBase::settle() {
    if (!ahead_) return;
    ahead_ = false;
    EHC_CHECK(cudaMemcpyAsync(counter_.get(), &step_.as<Step>()->counter_before, sizeof(unsigned long long),
                              cudaMemcpyDeviceToDevice, stream_.get()));
}

int32_t SessionBase::sample() {
    if (!have_logits_) throw ehp::Error(EH_INVALID_ARGUMENT, "no logits yet: prefill first");
    if (!have_sampling_) throw ehp::Error(EH_INVALID_ARGUMENT, "session_set_sampling was not called");
    EHC_CHECK(cudaSetDevice(device_));
    settle();
    cudaStream_t s = stream_.get();
    write_step(Step{int32_t(n_past_), int32_t(n_past_)});
    sample_on_device(slot_, nullptr);
    EHC_CHECK(cudaMemcpyAsync(h_out_, out_token_.get(), 4, cudaMemcpyDeviceToHost, s));
    EHC_CHECK(cudaStreamSynchronize(s));
    return h_out_[0];
}

// One decode step in slot `slot`: the token and position come from the
// device step state, which the sampler then advances to the next step.
void SessionBase::decode_step(int slot) {
    Step* d_step = step_.as<Step>();
    fwd_slot_ = slot;
    run_forward(1, &d_step->token, true);
    sample_on_device(slot, d_step);
    mark(int(group_names_.size()) - 1);  // the sampler's group
    EHC_CHECK(cudaMemcpyAsync(h_out_ + slot, out_token_.get(), 4, cudaMemcpyDeviceToHost, stream_.get()));
}

void SessionBase::capture_decode_graphs() {
    for (int slot = 0; slot < 2; ++slot) {
        try {
            decode_graph_[slot].capture(stream_.get(), [&] { decode_step(slot); });
        } catch (...) {
            for (CapturedGraph& g : decode_graph_) g.reset();
            throw;
        }
    }
}

// The host's loop feeds each returned token straight back, so decode runs
// one step ahead: before waiting for this step's token it enqueues the next
// step, whose input is the token this step's sampler leaves in the device
// step state (sample_tokens' `next`). The GPU then goes from one step to the
// next without waiting on the host's read, wake-up and launch. When the
// host passes another token, or does anything else with the session
// (prefill, sample, set_sampling, reset), the step run ahead is dropped
// (settle()) and the state is as if it never ran.
int32_t SessionBase::decode(int32_t token) {
    if (!have_sampling_) throw ehp::Error(EH_INVALID_ARGUMENT, "session_set_sampling was not called");
    if (uint64_t(n_past_) + 1 > n_ctx_)
        throw ehp::Error(EH_CONTEXT_FULL, "context full: n_ctx " + std::to_string(n_ctx_) + " reached");
    check_tokens(&token, 1);
    check_cancel();
    EHC_CHECK(cudaSetDevice(device_));
    cudaStream_t s = stream_.get();
    if (ahead_ && token != ahead_token_) settle();
    int slot;
    try {
        if (ahead_) {
            slot = ahead_slot_;
            ahead_ = false;
        } else {
            slot = slot_ ^ 1;
            if (const int v = choose_decode_variant(n_past_); v != variant_) {
                EHC_CHECK(cudaStreamSynchronize(s));  // a dropped step may still run its graph
                for (CapturedGraph& g : decode_graph_) g.reset();
                variant_ = v;
                decode_warm_ = false;  // its kernels' modules load in an eager step first
            }
            // The first step runs eagerly so every kernel's module is loaded
            // (lazy loading) before capture; later steps replay the graphs.
            if (!decode_graph_[0].ready() && decode_warm_ && !profile_) capture_decode_graphs();
            write_step(Step{int32_t(n_past_), int32_t(n_past_) + 1, token});
            if (profile_ && decode_warm_) {
                profiled_keys_ += n_past_ + 1;
                profiled_step([&] { decode_step(slot); });
            } else if (decode_graph_[slot].ready())
                decode_graph_[slot].launch(s);
            else
                decode_step(slot);
            EHC_CHECK(cudaEventRecord(step_done_[slot], s));
        }
        const int next = slot ^ 1;
        if (pipeline_ && decode_graph_[next].ready() && uint64_t(n_past_) + 2 <= n_ctx_) {
            decode_graph_[next].launch(s);
            EHC_CHECK(cudaEventRecord(step_done_[next], s));
            ahead_ = true;
            ahead_slot_ = next;
        }
        EHC_CHECK(cudaEventSynchronize(step_done_[slot]));
        decode_warm_ = true;
    } catch (...) {
        have_logits_ = false;
        ahead_ = false;
        cudaStreamSynchronize(s);
        throw;
    }
    n_past_ += 1;
    slot_ = slot;
    have_logits_ = true;
    ahead_token_ = h_out_[slot];
    return ahead_token_;
}

void SessionBase::mark(int g) {
    if (!marking_) return;
    if (events_.size() == event_group_.size()) {
        cudaEvent_t e;
        EHC_CHECK(cudaEventCreate(&e));
        events_.push_back(e);
    }
    EHC_CHECK(cudaEventRecord(events_[event_group_.size()], stream_.get()));
    event_group_.push_back(g);
}

void SessionBase::profiled_step(const std::function<void()>& body) {
    cudaStream_t s = stream_.get();
    // Hold the GPU while the whole step is enqueued, so its kernels then run
    // back to back and the events measure GPU time, not launch gaps.
    gpu_busy_wait(3000, s);
    event_group_.clear();
    marking_ = true;
    try {
        mark(0);  // start marker; its own interval is not counted
        event_group_.back() = -1;
        body();
    } catch (...) {
        marking_ = false;
        throw;
    }
    marking_ = false;
    EHC_CHECK(cudaStreamSynchronize(s));
    for (size_t i = 1; i < event_group_.size(); ++i) {
        float ms = 0;
        EHC_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
        group_ms_[size_t(event_group_[i])] += ms;
        step_ms_ += ms;
    }
    ++profiled_steps_;
}

void SessionBase::print_profile() const {
    const double n = double(profiled_steps_);
    const std::string note = profile_note_.empty() ? std::string() : ", " + profile_note_;
    std::fprintf(stderr, "[profile] decode: %llu steps, mean attended length %.0f keys%s, GPU time %.1f us/step\n",
                 static_cast<unsigned long long>(profiled_steps_), double(profiled_keys_) / n, note.c_str(),
                 1e3 * step_ms_ / n);
    for (size_t g = 0; g < group_names_.size(); ++g)
        std::fprintf(stderr, "[profile]   %-26s %8.1f us/step  %5.1f %%\n", group_names_[g], 1e3 * group_ms_[g] / n,
                     step_ms_ > 0 ? 100 * group_ms_[g] / step_ms_ : 0.0);
}

// Leaves the session idle as well as empty: a step run ahead and dropped
// here is waited for now, not by whatever the caller times next (bench's
// prefill, a new request's first token).
void SessionBase::reset() {
    EHC_CHECK(cudaSetDevice(device_));
    settle();
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
    n_past_ = 0;
    have_logits_ = false;
}

const float* SessionBase::logits() {
    if (!have_logits_) throw ehp::Error(EH_INVALID_ARGUMENT, "no logits yet");
    host_logits_.resize(size_t(n_vocab_));
    EHC_CHECK(cudaSetDevice(device_));
    // (stream-ordered: waits for a step run ahead, whose logits go to the
    // other slot)
    EHC_CHECK(cudaMemcpyAsync(host_logits_.data(), logits_[slot_].get(), host_logits_.size() * 4, cudaMemcpyDeviceToHost,
                              stream_.get()));
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
    return host_logits_.data();
}

}  // namespace ehcuda
