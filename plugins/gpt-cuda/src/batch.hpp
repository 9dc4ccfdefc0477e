// ABI 1.2's batched step for gpt2, gpt-oss and qwen3moe: the shared CUDA batch engine
// (ehcuda::BatchBase: paged FP16 KV pool, sequences, sampling) with this
// family's forward pass over a step's tokens from many sequences at once.
// Dense matmuls run once over all the step's tokens; attention reads each
// token's own sequence through the block tables (per-head sinks and the
// per-layer sliding window for gpt-oss); the MoE groups the step's routed
// tokens by expert, whatever sequence they come from.
// A tensor-parallel model (Model::tp > 1; gpt-oss and qwen3moe) runs its
// ranks as llama-cuda's do: one after another on the step's stream (the
// shard mode), each writing its share of attn_output and of the experts
// into a partial that one all-reduce adds into the residual, or
// (Model::rank_streams) each on its own stream and GPU with its own
// residual, the sums through an ehcuda::TpGroup. Rank r of layer l keeps
// its KV heads in the pool's layer l * tp + r, on its GPU. Every rank
// routes every token alike (the whole router), keeps the pairs routed to
// its own experts (moe_expert_range.hpp) and runs the expert kernels on
// those; within experts (Model::expert_rows) it runs every pair on its rows
// of every expert, the kernels seeing its width (the layers' ExpertMats and
// its Config's n_ff_exp size its scratch).
#pragma once

#include <ehcuda/batch.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/prefill_workspace.hpp>
#include <ehcuda/tp_group.hpp>
#include <ehcuda/tp_rank.hpp>
#include <ehcuda/tp_step.hpp>

#include <memory>
#include <vector>

#include "model.hpp"

namespace gpt_cuda {

class Batch : public ehcuda::BatchBase {
public:
    // Throws VRAM_OOM / INSUFFICIENT_VRAM (nothing left allocated).
    Batch(Model& model, const eh_kv_params& params);
    // kv_init's Q8_0 / FP8_E4M3 where the heads take them (kv_accept.hpp).
    static void accept_kv_type(const Model& m, uint32_t type);
    ~Batch() override;

private:
    // One rank's heads, experts and activations (the whole model at tp 1),
    // where its work goes (stream, GPU, workspaces) and its residual
    // (tp_rank.hpp; part: its share of attn_output / the experts).
    struct Rank : ehcuda::RankLane<Config, Layer> {
        const float* inv_freq = nullptr;
        int expert0 = 0, n_local = 0;  // its experts (all of them at tp 1 and within experts)
        ehcuda::DeviceBuffer router, ids, wts, grouped;
        ehcuda::DeviceBuffer router_counter;  // moe_router_decode's, then moe_decode_mma's
        // The grouped-by-expert cuBLAS MoE's own workspace (the base's has no
        // MoE buffers), sized for kMoeChunk tokens; null where every layer's
        // experts take the grouped kernels.
        std::unique_ptr<ehcuda::PrefillWorkspace> moe_ws;
    };

    void forward(const ehcuda::StepView& v) override;
    // Graphs hold LoRA launches only for sites some adapter had at capture.
    uint64_t graph_epoch() const override { return m_.lora.generation(); }
    void gpt2_layer(int li, const ehcuda::StepView& v);
    // An MoE layer's halves (gpt-oss, qwen3moe) on rank r: the attention,
    // its output projection into y (added when acc: tp 1, y the residual),
    // then the experts' sum added into y (the residual at tp 1, else the
    // rank's zeroed partial).
    void attention_block(Rank& r, int li, const ehcuda::StepView& v, float* y, bool acc);
    void expert_block(Rank& r, int li, const ehcuda::StepView& v, float* y);
    // RoPE (none for gpt2) + K/V into the pool rows, then paged attention
    // of the rank's qkv rows into its attn.
    // q_norm / k_norm (Qwen3-MoE's QK-norm, else null): the heads are
    // normalised first, inside the fused decode attention where it runs.
    // Returns true when the attention output went to attn_chunks as the
    // output projection's integer chunks (one decode row) instead of attn.
    bool attend(Rank& r, int li, const ehcuda::StepView& v, int n_rot, int window, const float* sinks,
                const ehcuda::MatSeg& attn_out, const float* q_norm = nullptr, const float* k_norm = nullptr);
    // The experts of layer li over the step's T tokens into y (routing in
    // the rank's ids / wts already, or done by the one-token kernel when
    // T == 1 and fused_route()).
    void moe(Rank& r, int li, int T, float* y);
    void invariant_moe(Rank& r, int li, int T);  // batch_invariant's (batch.cpp; tp 1)
    // moe_grouped over tokens t0 .. t0 + n of the step (n <= moe_grouped_max_).
    void grouped(Rank& r, int li, int t0, int n, float* y);
    // Whether the one-token expert kernel routes (moe_fused_route): tp 1
    // only, a rank filtering its pairs between the routing and the experts.
    bool fused_route() const { return m_.tp == 1 && moe_fused_route(m_); }
    // y (+)= segs . x over n tokens on rank r's stream (see batch.cpp for the kernel choice).
    void matmul(Rank& r, const ehcuda::MatSeg* segs, int nseg, int cols, const float* x, int ldx, ehcuda::XMode mode,
                float* y, int ldy, bool accumulate, int n, const float* norm_w = nullptr);
    // y = segs . (RMSNorm(x) * norm_w) over n rows of n_embd: folded into
    // the single-token GEMV's input staging when `fold` (n == 1), else the
    // normalised rows go to r.xn (where the MoE reads them) first.
    void normed_matmul(Rank& r, const ehcuda::MatSeg* segs, int nseg, const float* x, const float* norm_w, float* y,
                       int ldy, int n, bool fold);
    // The pool layer of rank r's heads of `layer`.
    int pool_layer(const Rank& r, int layer) const { return layer * m_.tp + r.index; }

    Model& m_;
    const Config& c_;
    // The most tokens whose dense matmuls run one single-token call per
    // token (ehcuda::route_step_matmul: the plan's batch_gemv_per_token),
    // and the most whose experts run grouped (batch_moe_grouped_max).
    int gemv_per_token_max_;
    int moe_grouped_max_;
    // (before ranks_: their workspaces go first, while the streams exist)
    std::unique_ptr<ehcuda::TpGroup> group_;  // rank_streams
    bool signals_ = false;                    // its one-shot all-reduce's barrier in the kernel
    ehcuda::DeviceBuffer h_, xn_, last_;
    std::vector<Rank> ranks_;
    Rank head_;  // the LM head's lane: the step's stream and workspace, h_ and xn_
    ehcuda::TpRows rows_;  // the ranks' residual rows and shares (tp_step.hpp)
    // Steps with LoRA adapters (lora.hpp; tp 1): every adapted matmul's
    // input in memory (no folded norm, no quantized attention output) and
    // its rows' updates after it; adapt() launches nothing in a step without.
    ehcuda::LoraStep lora_;
    void adapt(const ehcuda::StepView& v, std::initializer_list<int> sites, const float* x, int ldx, float* y, int ldy,
               int n, const int32_t* row_token = nullptr);
};

}  // namespace gpt_cuda
