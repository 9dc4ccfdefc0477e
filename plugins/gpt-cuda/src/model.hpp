// A loaded GPT-2 / gpt-oss / Qwen3-MoE model: configuration plus every weight in one
// device arena, kept in its stored type (MXFP4 experts stay MXFP4).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/weight_mirror.hpp>
#include <ehcuda/moe.hpp>
#include <ehcuda/lora.hpp>
#include <ehcuda/sharded_model.hpp>

#include "config.hpp"

namespace gpt_cuda {

// The most ranks one load may have (eh_plugin_info.max_devices).
inline constexpr int kMaxDevices = 8;

struct Layer {
    const float* attn_norm = nullptr;
    const float* attn_norm_b = nullptr;  // gpt2
    ehcuda::MatSeg qkv[3];               // fused attn_qkv (1) or attn_q, attn_k, attn_v (3)
    int n_qkv = 0;
    ehcuda::MatSeg attn_out;             // with its bias
    const float* sinks = nullptr;        // gpt-oss, one per query head
    const float* q_norm = nullptr;       // qwen3moe: head_dim weights of the per-head RMSNorm
    const float* k_norm = nullptr;
    const float* ffn_norm = nullptr;     // ffn_norm or post_attention_norm
    const float* ffn_norm_b = nullptr;
    // gpt2 MLP
    ehcuda::MatSeg ffn_up, ffn_down;
    // gpt-oss / qwen3moe experts
    ehcuda::MatSeg router;
    ehcuda::ExpertMat gate_exps, up_exps, down_exps;
    int window = 0;
};

// What every expert kernel's arguments (moe_decode, moe_grouped,
// moe_decode_mma) take alike from layer L: the top-k of n_expert, the
// gate / up / down experts, the activation (gpt-oss's clamped SwiGLU, else
// the plain one), the scratch, and the rows h the expert sums are added to.
template <class Args>
void set_expert_args(Args& a, const Config& c, const Layer& L, void* scratch, size_t scratch_bytes, float* h) {
    a.k = c.n_expert_used;
    a.n_expert = c.n_expert;
    a.gate = L.gate_exps;
    a.up = L.up_exps;
    a.down = L.down_exps;
    a.alpha = c.swiglu_alpha;
    a.limit = c.swiglu_limit;
    a.scratch = scratch;
    a.scratch_bytes = scratch_bytes;
    a.h = h;
}

// What both router kernels' arguments (moe_router_decode,
// moe_router_rows) take alike from layer L: the residual rows x, their
// pre-norm (ffn_norm), the F32 router of n_expert x n_embd with its bias,
// and where the logits go.
template <class Args>
void set_router_args(Args& a, const Config& c, const Layer& L, const float* x, float* logits) {
    a.x = x;
    a.norm_w = L.ffn_norm;
    a.norm_eps = c.eps;
    a.w = static_cast<const float*>(L.router.w.data);
    a.bias = L.router.bias;
    a.n_expert = c.n_expert;
    a.cols = c.n_embd;
    a.logits = logits;
}

// An MoE layer's single-token expert block (moe_decode) for the token
// whose residual stream is h: the pre-norm inside the kernels, the routing
// of the router's `logits` too (ids and weights left in route_ids /
// route_weights), `scratch` of moe_decode_scratch_bytes. A caller that
// routed already sets logits to NULL and ids / weights instead.
ehcuda::MoeDecodeArgs moe_decode_args(const Config& c, const Layer& L, float* h, const float* logits, int32_t* route_ids,
                                      float* route_weights, void* scratch, size_t scratch_bytes);

// The router of the token whose residual stream is h as one kernel
// (moe_router_decode; router_decode says when): the pre-norm inside, the
// logits, and (ids not NULL) the routing: ids and weights where moe_route
// leaves them, `counter` the caller's zeroed device int.
ehcuda::MoeRouterArgs router_decode_args(const Config& c, const Layer& L, const float* h, float* logits, int32_t* ids,
                                         float* weights, int* counter);

// The expert block of ntok tokens (2 .. moe_grouped_max) through the grouped
// kernels (moe_grouped): pre-normed inputs xn, the routing in ids / wts, the
// residual stream h added to; `scratch` of moe_grouped_scratch_bytes.
ehcuda::MoeGroupedArgs moe_grouped_args(const Config& c, const Layer& L, const float* xn, int ntok, const int32_t* ids,
                                        const float* wts, float* h, void* scratch, size_t scratch_bytes);

// One rank of a tensor-parallel load (gpt-oss, qwen3moe; the scheme:
// cuda-common README, "Tensor parallelism"): its query and KV heads (their
// Q/K/V rows, attn_output's columns, their sinks) and its experts: whole
// ones by default (expert parallelism: [expert0, expert0 + n_local) of
// every layer, with their biases), or with Model::expert_rows every expert
// and its rows [ff0, ff0 + c.n_ff_exp) of each one's width (gate and up
// rows, down's columns; tensor parallelism within experts), in an arena of
// its own on its GPU with its own copy of the norms, the router (every
// rank routes alike) and the RoPE table. attn_output's bias is rank 0's
// alone (added once by the all-reduce), as is down's within experts.
struct Shard {
    // n_head and n_kv are this rank's, n_ff_exp too within experts; the
    // rest (n_expert too) the model's
    Config c;
    int device = 0;   // its GPU
    int head0 = 0;    // its first query head
    int kv0 = 0;      // its first KV head
    int expert0 = 0;  // its first expert
    int n_local = 0;  // its experts
    int ff0 = 0;      // its first row of every expert's width (0 but within experts)
    std::vector<Layer> layers;
    ehcuda::DeviceArena arena;
    ehcuda::WeightMirror mirror;       // FP16 copies of its dense matrices (when the model keeps them)
    const float* inv_freq = nullptr;   // Model::inv_freq's copy on its GPU
};

// (sharded_model.hpp: its GPU and ranks, device memory, kernel plan and
// adapters; the mirror keeps the dense matrices only, the experts their
// own path)
struct Model : ehcuda::ShardedModel<Shard> {
    Config cfg;
    ehcuda::WeightRef tok_embd, pos_embd;
    const float* output_norm = nullptr;
    const float* output_norm_b = nullptr;
    ehcuda::WeightRef output;  // LM head (the embedding table when tied)
    const float* inv_freq = nullptr;
    std::vector<Layer> layers;
    // The load option batch_invariant: the experts of every row take the
    // grouped kernels, one token too, so a token's routing and expert sums
    // do not depend on how many rows its step holds (see batch.cpp).
    bool batch_invariant = false;
    // The load option expert_split "rows" on a tensor-parallel load: the
    // experts split within (every rank every expert, its rows of their
    // width; no routing filter) instead of whole per rank.
    bool expert_rows = false;
};

// Whether a one-token expert block routes inside its gate|up kernel
// (moe_decode's logits): the plan's moe_fused_route. Every block of that
// kernel ranks all the experts itself (route_warp: under a microsecond for
// the top-8 of 128), which costs less than a routing step between the
// router and the experts (H100, forged files, tg128 after 512 tokens:
// Qwen3-30B-A3B 404 tok/s fused against 396 routed by the router kernel
// and 390 by route_kernel after the GEMV).
inline bool moe_fused_route(const Model& m) { return m.plan.moe_fused_route; }

// Whether a one-token expert block's router takes moe_router_decode (one
// block per expert row; the top-k too where the expert kernel does not
// route) rather than the GEMV (and route_kernel): the plan's
// moe_router_kernel, for an F32 router of n_expert x n_embd (H100,
// gpt-oss-20b tg128 after 512 tokens 522 -> 537 tok/s).
inline bool router_decode(const Model& m, const Layer& L) {
    const ehcuda::WeightRef& w = L.router.w;
    return m.plan.moe_router_kernel && w.rows == m.cfg.n_expert && w.cols == m.cfg.n_embd &&
           w.row_bytes == size_t(w.cols) * 4 &&
           ehcuda::moe_router_decode_supported(w.type, m.cfg.n_expert, m.cfg.n_embd, m.cfg.n_expert_used);
}

// The most tokens of a batched step whose experts run grouped (moe_grouped:
// each expert's weights read in their stored type once per 8 or 32 of its
// tokens, graph-safe); past it, when not captured, the cuBLAS
// grouped-by-expert form (moe_prefill), which converts each routed expert's
// weights to FP16 per pass and synchronises the host once a layer: the
// plan's batch_moe_grouped_max (512).
inline int moe_grouped_max(const Model& m) { return m.plan.batch_moe_grouped_max; }
// Every expert type keeps the grouped kernels up to that many: the
// Qwen3-30B-A3B steps (Q4_K / Q6_K experts) ran slower when they left them
// (GptOss20bBatchedStep, 64 decodes + four 32-token prompts: 109.5 ms
// grouped, 143.6 ms with 64 tokens the most), the uncaptured cuBLAS form not
// being what they gained.

// Validates every tensor, checks free memory (INSUFFICIENT_VRAM), allocates
// and uploads. Progress and cancel come from the load params.
std::unique_ptr<Model> load_model(const eh_load_params& params);

}  // namespace gpt_cuda
