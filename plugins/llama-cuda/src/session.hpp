// One sequence: FP16 KV cache, activation buffers, device sampler state and
// the captured decode graph.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/prefill_workspace.hpp>
#include <ehcuda/sampler.hpp>

#include "model.hpp"

namespace llama_cuda {

class Session {
public:
    // Throws VRAM_OOM (everything already allocated is freed) when the cache
    // or buffers do not fit.
    Session(Model& model, const eh_session_params& params);
    ~Session();

    void set_sampling(const eh_sampling_params& p);
    void prefill(const int32_t* tokens, uint32_t n);
    int32_t sample();
    int32_t decode(int32_t token);
    void reset();
    uint32_t n_past() const { return n_past_; }
    int n_vocab() const { return c_.n_vocab; }
    const float* logits();  // host copy of the last raw logits

    std::string last_error;

private:
    // Device-side step inputs: kernels read them, so a graph can be replayed.
    struct Step {
        int32_t pos0;
        int32_t n_hist;
        int32_t token;
        int32_t pad;
    };

    void forward(int ntok, const int32_t* d_tokens, bool decode_path);
    // Profiling (EHCUDA_PROFILE_DECODE=1): decode steps run eagerly behind a
    // GPU busy-wait, with events between kernel groups; the per-group GPU
    // time is printed to stderr when the session is released.
    enum Group { kEmbed, kQkv, kRope, kAttn, kOut, kGateUp, kDown, kHead, kSample, kGroups };
    void mark(Group g);
    void profiled_step(const std::function<void()>& body);
    void print_profile() const;
    void check_cancel();
    void check_tokens(const int32_t* tokens, uint32_t n) const;

    Model& m_;
    const Config& c_;
    uint32_t n_ctx_;
    int max_batch_;
    int nsplit_;
    eh_cancel_fn cancel_;
    void* cancel_user_;

    ehcuda::Stream stream_;
    // cuBLAS prefill scratch (issue 7): used by prefill batches only, never
    // by the captured decode step.
    std::unique_ptr<ehcuda::PrefillWorkspace> prefill_ws_;
    std::vector<ehcuda::DeviceBuffer> kcache_, vcache_;
    ehcuda::DeviceBuffer h_, xn_, qkv_, attn_, ff_, logits_, attn_scratch_;
    ehcuda::DeviceBuffer history_, tokens_, step_, params_, counter_, out_token_;
    ehcuda::DeviceBuffer fwork_, iwork_;
    // Pinned host mirrors for the per-step transfers.
    Step* h_step_ = nullptr;
    int32_t* h_out_ = nullptr;
    int32_t* h_tokens_ = nullptr;

    ehcuda::CapturedGraph decode_graph_;
    bool decode_warm_ = false;
    uint32_t n_past_ = 0;
    bool have_logits_ = false;
    bool have_sampling_ = false;
    std::vector<float> host_logits_;

    bool profile_ = false;
    bool marking_ = false;
    std::vector<cudaEvent_t> events_;
    std::vector<int> event_group_;  // group whose work ends at events_[i]
    double group_ms_[kGroups] = {};
    double step_ms_ = 0;
    uint64_t profiled_steps_ = 0;
    uint64_t profiled_keys_ = 0;  // sum of attended lengths, for the mean
};

}  // namespace llama_cuda
