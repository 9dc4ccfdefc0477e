// One sequence: KV cache (FP32, or FP16 with the plan's kv_f16) and
// activation buffers. The lifecycle (checks, chunked prefill, sampler state,
// captured decode graph) is ehcuda::SessionBase; this class is the gpt2 and
// MoE (gpt-oss, qwen3moe) forward pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/gpt_ops.hpp>
#include <ehcuda/prefill_workspace.hpp>
#include <ehcuda/session_base.hpp>

#include "model.hpp"

namespace gpt_cuda {

class Session : public ehcuda::SessionBase {
public:
    // Throws VRAM_OOM (everything already allocated is freed) when the cache
    // or buffers do not fit. gpt2's n_ctx is capped at its learned positions.
    Session(Model& model, const eh_session_params& params);

private:
    // Decode profile groups (KernelPlan::profile_decode); gpt2 has no router.
    enum Group { kEmbed, kQkv, kRope, kAttn, kOut, kRouter, kFfnUp, kFfnDown, kHead };

    void forward(int ntok, const int32_t* d_tokens, bool decode_path) override;
    std::string vocab_text() const override;
    std::string context_note() const override;
    void gpt2_layer(int li, int ntok);
    void moe_layer(int li, int ntok);  // gpt-oss, qwen3moe
    // RoPE (as r's rotation fields say), the K/V store and sink attention
    // of layer li over qkv_ into attn_; the callers set only rotation,
    // window and sinks. True when the split decode also left the output in
    // attn_chunks_ as out_proj's integer chunks (read with XMode::Chunks).
    bool attend(int li, int ntok, ehcuda::RopeTableArgs r, ehcuda::SinkAttnArgs at, const ehcuda::MatSeg& out_proj);
    // 1 (RoPE + store, then attention_decode_group for layers whose window
    // holds at least that many keys) from the plan's attn_group_min_keys
    // keys on, for grouped-query models (gpt-oss); else 0 (the fused
    // rope_sink_attention_decode).
    int choose_decode_variant(uint32_t pos) const override;
    enum Variant { kFused = 0, kGroup = 1 };
    // The cuBLAS prefill scratch for a pass of ntok tokens; decode (one
    // token, captured in a graph) never gets it.
    ehcuda::PrefillWorkspace* prefill_ws(int ntok) const { return ntok > 1 ? prefill_workspace() : nullptr; }

    Model& m_;
    const Config& c_;
    // FP32 cache unless the plan's kv_f16 (see session.cpp).
    bool kv_f32_ = false;
    std::vector<ehcuda::DeviceBuffer> kcache_, vcache_;
    ehcuda::DeviceBuffer h_, xn_, qkv_, attn_, ff_, router_, ids_, wts_;
    ehcuda::DeviceBuffer grouped_;  // moe_grouped's scratch for prefill passes of up to grouped_max_ tokens
    int grouped_max_ = 0;
    // Decode attention split over the keys (attention_sinks): per-split
    // partial results and one counter per head.
    int nsplit_ = 1;
    int group_splits_ = 0;  // attention_decode_group's grid, 0 when it does not serve the model
    ehcuda::DeviceBuffer attn_chunks_;  // decode: the attention output as the output projection's chunks
    ehcuda::DeviceBuffer attn_scratch_, attn_counters_;
    ehcuda::DeviceBuffer router_counter_;  // moe_router_decode's
};

}  // namespace gpt_cuda
