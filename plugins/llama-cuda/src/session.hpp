// One sequence: FP16 KV cache and activation buffers. The lifecycle (checks,
// chunked prefill, sampler state, captured decode graph, profiler) is
// ehcuda::SessionBase; this class is the llama forward pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/session_base.hpp>

#include "model.hpp"

namespace llama_cuda {

class Session : public ehcuda::SessionBase {
public:
    // Throws VRAM_OOM (everything already allocated is freed) when the cache
    // or buffers do not fit.
    Session(Model& model, const eh_session_params& params);

private:
    // Decode profile groups (KernelPlan::profile_decode), in forward's order.
    // Decode has no RoPE group: rope_attention_decode rotates Q and K
    // inside the attention kernel.
    enum Group { kEmbed, kQkv, kAttn, kOut, kGateUp, kDown, kHead };

    void forward(int ntok, const int32_t* d_tokens, bool decode_path) override;
    // 1 (RoPE + store, then attention_decode_group) from the plan's
    // attn_group_min_keys keys on, for grouped-query models; else 0 (the
    // fused rope_attention_decode).
    int choose_decode_variant(uint32_t pos) const override;
    enum Variant { kFused = 0, kGroup = 1 };
    // The attention of ntok tokens at d_pos0() over this layer's cache.
    ehcuda::AttnArgs attn_args(const __half* kc, const __half* vc, const float* qkv, int ntok) const;

    Model& m_;
    const Config& c_;
    int nsplit_;
    int group_splits_ = 0;  // attention_decode_group's grid, 0 when it does not serve the model

    std::vector<ehcuda::DeviceBuffer> kcache_, vcache_;
    ehcuda::DeviceBuffer h_, xn_, qkv_, attn_, ff_, attn_scratch_;
    ehcuda::DeviceBuffer attn_counters_;  // per-head split counters of rope_attention_decode, 0 between launches
    ehcuda::DeviceBuffer attn_chunks_;    // decode: the attention output as the output projection's integer chunks
};

}  // namespace llama_cuda
