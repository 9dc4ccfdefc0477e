// ABI 1.2's batched step for gpt2, gpt-oss and qwen3moe: the shared CUDA batch engine
// (ehcuda::BatchBase: paged FP16 KV pool, sequences, sampling) with this
// family's forward pass over a step's tokens from many sequences at once.
// Dense matmuls run once over all the step's tokens; attention reads each
// token's own sequence through the block tables (per-head sinks and the
// per-layer sliding window for gpt-oss); the MoE groups the step's routed
// tokens by expert, whatever sequence they come from.
#pragma once

#include <ehcuda/batch.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/prefill_workspace.hpp>

#include <memory>

#include "model.hpp"

namespace gpt_cuda {

class Batch : public ehcuda::BatchBase {
public:
    // Throws VRAM_OOM / INSUFFICIENT_VRAM (nothing left allocated).
    Batch(Model& model, const eh_kv_params& params);
    // kv_init's Q8_0 / FP8_E4M3: K/V rows of whole 32-value blocks (heads
    // up to 256; a head dim that is not a multiple of 32 takes the paged
    // kernel only, whose blocks may span heads).
    static void accept_kv_type(const Model& m, uint32_t type);
    ~Batch() override;

private:
    void forward(const ehcuda::StepView& v) override;
    // Graphs hold LoRA launches only for sites some adapter had at capture.
    uint64_t graph_epoch() const override { return m_.lora.generation(); }
    void gpt2_layer(int li, const ehcuda::StepView& v);
    void moe_layer(int li, const ehcuda::StepView& v);  // gpt-oss, qwen3moe
    // RoPE (none for gpt2) + K/V into the pool rows, then paged attention
    // of the step's qkv_ rows into attn_.
    // q_norm / k_norm (Qwen3-MoE's QK-norm, else null): the heads are
    // normalised first, inside the fused decode attention where it runs.
    // Returns true when the attention output went to attn_chunks_ as the
    // output projection's integer chunks (one decode row) instead of attn_.
    bool attend(int li, const ehcuda::StepView& v, int n_rot, int window, const float* sinks,
                const ehcuda::MatSeg& attn_out, const float* q_norm = nullptr, const float* k_norm = nullptr);
    // The experts of layer li over the step's T tokens (routing in ids_ /
    // wts_ already, or done by the one-token kernel when T == 1).
    void moe(int li, int T);
    void invariant_moe(int li, int T);  // batch_invariant's (batch.cpp)
    // moe_grouped over tokens t0 .. t0 + n of the step (n <= moe_grouped_max_).
    void grouped(int li, int t0, int n);
    // y (+)= segs . x over n tokens (see batch.cpp for the kernel choice).
    void matmul(const ehcuda::MatSeg* segs, int nseg, int cols, const float* x, int ldx, ehcuda::XMode mode, float* y,
                int ldy, bool accumulate, int n, const float* norm_w = nullptr);
    // y = segs . (RMSNorm(x) * norm_w) over n rows of n_embd: folded into
    // the single-token GEMV's input staging when `fold` (n == 1), else the
    // normalised rows go to xn_ (where the MoE reads them) first.
    void normed_matmul(const ehcuda::MatSeg* segs, int nseg, const float* x, const float* norm_w, float* y, int ldy,
                       int n, bool fold);

    Model& m_;
    const Config& c_;
    // The most tokens whose dense matmuls run one single-token call per
    // token (ehcuda::route_step_matmul: the plan's batch_gemv_per_token),
    // and the most whose experts run grouped (batch_moe_grouped_max).
    int gemv_per_token_max_;
    int moe_grouped_max_;
    ehcuda::DeviceBuffer h_, xn_, qkv_, attn_, ff_, last_, router_, ids_, wts_, grouped_;
    // Steps with LoRA adapters (lora.hpp): every adapted matmul's input in
    // memory (no folded norm, no quantized attention output) and its rows'
    // updates after it; adapt() launches nothing in a step without.
    ehcuda::LoraStep lora_;
    void adapt(const ehcuda::StepView& v, std::initializer_list<int> sites, const float* x, int ldx, float* y, int ldy,
               int n, const int32_t* row_token = nullptr);
    // gpt-oss decode rows: the paged fused decode attention's split scratch,
    // counters and (one row) quantized output.
    ehcuda::DeviceBuffer attn_scratch_, attn_counters_, attn_chunks_;
    ehcuda::DeviceBuffer router_counter_;  // moe_router_decode's
    int decode_splits(int rows) const;
    // The grouped-by-expert cuBLAS MoE's own workspace (the base's has no
    // MoE buffers), sized for kMoeChunk tokens; null where every layer's
    // experts take the grouped kernels.
    std::unique_ptr<ehcuda::PrefillWorkspace> moe_ws_;
};

}  // namespace gpt_cuda
