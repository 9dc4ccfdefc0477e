// One sequence: KV cache (FP32, or FP16 with EH_GPT_CUDA_KV=f16), activation buffers, device sampler state and
// the captured decode graph.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/gpt_ops.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/prefill_workspace.hpp>
#include <ehcuda/sampler.hpp>

#include "model.hpp"

namespace gpt_cuda {

// Bytes of one KV-cache element: FP32 unless EH_GPT_CUDA_KV=f16.
bool kv_f32_from_env();
size_t kv_element_bytes();

class Session {
public:
    // Throws VRAM_OOM (everything already allocated is freed) when the cache
    // or buffers do not fit. gpt2's n_ctx is capped at its learned positions.
    Session(Model& model, const eh_session_params& params);
    ~Session();

    void set_sampling(const eh_sampling_params& p);
    void prefill(const int32_t* tokens, uint32_t n);
    int32_t sample();
    int32_t decode(int32_t token);
    void reset();
    uint32_t n_past() const { return n_past_; }
    uint32_t n_ctx() const { return n_ctx_; }
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

    void forward(int ntok, const int32_t* d_tokens);
    void gpt2_layer(int li, int ntok);
    void gpt_oss_layer(int li, int ntok);
    void set_cache(int li, ehcuda::RopeTableArgs& r, ehcuda::SinkAttnArgs& at);
    // The cuBLAS prefill scratch for a pass of ntok tokens; decode (one
    // token, captured in a graph) never gets it.
    ehcuda::PrefillWorkspace* prefill_ws(int ntok) const { return ntok > 1 ? prefill_ws_.get() : nullptr; }
    void check_cancel();
    void check_tokens(const int32_t* tokens, uint32_t n) const;

    Model& m_;
    const Config& c_;
    uint32_t n_ctx_;
    int max_batch_;
    eh_cancel_fn cancel_;
    void* cancel_user_;

    ehcuda::Stream stream_;
    std::unique_ptr<ehcuda::PrefillWorkspace> prefill_ws_;  // issues 7, 8
    // FP32 cache unless EH_GPT_CUDA_KV=f16 (see session.cpp).
    bool kv_f32_ = false;
    std::vector<ehcuda::DeviceBuffer> kcache_, vcache_;
    ehcuda::DeviceBuffer h_, xn_, qkv_, attn_, ff_, router_, ids_, wts_, logits_;
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
};

}  // namespace gpt_cuda
