// The part of a CUDA engine session every architecture shares: argument and
// token checks, chunked prefill through pinned host mirrors, the device
// sampler state, the graph-captured decode step, logits readback and the
// optional decode profiler. A plugin's Session derives from it, allocates its
// own cache and activation buffers, then calls finish_init(); it implements
// only forward().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/kernel_plan.hpp>
#include <ehcuda/prefill_workspace.hpp>
#include <ehcuda/sampler.hpp>

namespace ehcuda {

struct SessionShape {
    int device = 0;
    MemoryLedger* ledger = nullptr;
    int n_vocab = 0;
    // n_ctx is checked against 1..2^24 first, then capped at this.
    uint32_t n_ctx_cap = UINT32_MAX;
    // Prefill tokens per forward pass (capped at n_ctx).
    int max_batch = 1;
    // Names of the decode profile groups forward() marks, in order; the
    // sampler's group is appended after them. Empty: no profiler, and
    // KernelPlan::profile_decode is ignored.
    std::vector<const char*> profile_groups;
    // The model's plan (pipeline, profile_decode); NULL: the installed one.
    const KernelPlan* plan = nullptr;
};

class SessionBase {
public:
    SessionBase(const SessionShape& shape, const eh_session_params& params);
    virtual ~SessionBase();
    SessionBase(const SessionBase&) = delete;
    SessionBase& operator=(const SessionBase&) = delete;

    // The plan this session's kernels run with (its model's, copied at
    // creation); plugin_glue.hpp installs it around every session call.
    const KernelPlan& kernel_plan() const { return plan_; }

    void set_sampling(const eh_sampling_params& p);
    void prefill(const int32_t* tokens, uint32_t n);
    int32_t sample();
    int32_t decode(int32_t token);
    void reset();
    uint32_t n_past() const { return n_past_; }
    uint32_t n_ctx() const { return n_ctx_; }
    int n_vocab() const { return n_vocab_; }
    const float* logits();  // host copy of the last raw logits

    std::string last_error;

protected:
    // Device-side step inputs (sampler.hpp): kernels read them, so a graph
    // can be replayed.
    using Step = StepState;

    // One forward pass over ntok tokens at positions step.pos0 .. +ntok-1
    // (already recorded in the history), leaving the last token's logits in
    // d_logits(). decode_path: the single-token step captured in the graph.
    virtual void forward(int ntok, const int32_t* d_tokens, bool decode_path) = 0;
    // Which kernels a decode step at position pos takes, for a session that
    // changes them with depth (0 for one that never does). The decode graphs
    // are captured for one variant and captured again when it changes;
    // forward() reads the current one from decode_variant().
    virtual int choose_decode_variant(uint32_t pos) const { return 0; }
    int decode_variant() const { return variant_; }
    // Text closing the "is outside the vocabulary" message, e.g. "(32000)".
    virtual std::string vocab_text() const;
    // Appended to prefill's "context full" message.
    virtual std::string context_note() const { return std::string(); }

    // The tail of construction, after the derived buffers: the sampler
    // state, the step buffers, the prefill workspace (ps.max_tokens is set
    // here) and the pinned mirrors.
    void finish_init(PrefillShape ps);
    // Profile: the end of group g's work in the current decode step.
    void mark(int g);
    // Shown in the profile's summary line, e.g. "8 attention splits".
    void set_profile_note(std::string note) { profile_note_ = std::move(note); }

    cudaStream_t stream() const { return stream_.get(); }
    int max_batch() const { return max_batch_; }
    const int32_t* d_pos0() const { return &step_.as<Step>()->pos0; }
    // Where forward() leaves its logits (the decode steps alternate between
    // two buffers, see decode()).
    float* d_logits() const { return logits_[fwd_slot_].as<float>(); }
    PrefillWorkspace* prefill_workspace() const { return prefill_ws_.get(); }

private:
    void run_forward(int ntok, const int32_t* d_tokens, bool decode_path);
    void sample_on_device(int slot, Step* next);
    void decode_step(int slot);
    void capture_decode_graphs();
    void settle();
    void write_step(const Step& st);
    void profiled_step(const std::function<void()>& body);
    void print_profile() const;
    void check_cancel();
    void check_tokens(const int32_t* tokens, uint32_t n) const;

    int device_;
    MemoryLedger* ledger_;
    int n_vocab_;
    uint32_t n_ctx_;
    int max_batch_;
    eh_cancel_fn cancel_;
    void* cancel_user_;

    Stream stream_;
    // cuBLAS prefill scratch: used by prefill batches only, never by the
    // captured decode step.
    std::unique_ptr<PrefillWorkspace> prefill_ws_;
    DeviceBuffer logits_[2], history_, tokens_, step_, params_, counter_, out_token_;
    DeviceBuffer fwork_, iwork_;
    // Pinned host mirrors for the per-step transfers (h_out_: one token per
    // decode slot).
    Step* h_step_ = nullptr;
    int32_t* h_out_ = nullptr;
    int32_t* h_tokens_ = nullptr;

    // Decode runs one step ahead (decode()): two captured steps, each with
    // its own logits buffer and token mirror, alternate. slot_ holds the
    // logits the host may read; fwd_slot_ is where forward() writes.
    CapturedGraph decode_graph_[2];
    int variant_ = 0;  // what the graphs (and eager decode steps) run
    cudaEvent_t step_done_[2] = {nullptr, nullptr};
    int slot_ = 0;
    int fwd_slot_ = 0;
    KernelPlan plan_;
    bool pipeline_ = true;  // KernelPlan::pipeline off: no step runs ahead
    // A step for position n_past_ is in flight in slot ahead_slot_,
    // consuming ahead_token_ (the token the last decode returned).
    bool ahead_ = false;
    int ahead_slot_ = 0;
    int32_t ahead_token_ = 0;
    bool decode_warm_ = false;
    uint32_t n_past_ = 0;
    bool have_logits_ = false;
    bool have_sampling_ = false;
    std::vector<float> host_logits_;

    // Profiling (KernelPlan::profile_decode): decode steps run eagerly behind a
    // GPU busy-wait, with events between kernel groups; the per-group GPU
    // time is printed to stderr when the session is released.
    std::vector<const char*> group_names_;  // forward's groups, then the sampler
    std::string profile_note_;
    bool profile_ = false;
    bool marking_ = false;
    std::vector<cudaEvent_t> events_;
    std::vector<int> event_group_;  // group whose work ends at events_[i]
    std::vector<double> group_ms_;
    double step_ms_ = 0;
    uint64_t profiled_steps_ = 0;
    uint64_t profiled_keys_ = 0;  // sum of attended lengths, for the mean
};

}  // namespace ehcuda
