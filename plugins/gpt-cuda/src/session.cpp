#include "session.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include <ehcuda/attention_decode_group.hpp>
#include <ehcuda/attention_prefill.hpp>
#include <ehcuda/check.hpp>
#include <ehcuda/gpt_ops.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/moe.hpp>

namespace gpt_cuda {
namespace {

// Prefill tokens per forward pass. A pass the cuBLAS form takes
// (session_moe_grouped_max, model.hpp) converts every routed expert's
// weights to FP16 once (moe_prefill's slabs), so longer passes amortize
// that over more tokens.
constexpr int kMaxBatch = 2048;

// FP32 KV cache by default. With FP16 K/V the rounding (~5e-4 relative)
// flips near-tied MoE router choices in later layers, and on the forged
// gpt-oss-20b that moved logits by a median 2.8 % and the top-1 token at
// 15 of 128 positions; with FP32 the logits match the CPU reference to
// ~4e-6 (tests/gpt_cuda/agreement_diag_test.cpp, issue 8). The plan's
// kv_f16 halves the cache's memory and attention reads at that precision
// cost.
}  // namespace

namespace {

ehcuda::SessionShape shape_of(Model& m) {
    ehcuda::SessionShape sh;
    sh.device = m.device;
    sh.ledger = &m.ledger;
    sh.n_vocab = m.cfg.n_vocab;
    // gpt2 has a table of learned positions: no room past its end
    if (m.cfg.arch == Arch::Gpt2) sh.n_ctx_cap = uint32_t(m.cfg.n_ctx_train);
    sh.max_batch = kMaxBatch;
    sh.plan = &m.plan;
    sh.profile_groups = {"embed",         "qkv gemv (+norm)",      "rope+kv store (prefill)", "rope+kv+attention (sinks)",
                         "attn_out gemv", "ffn norm+router+top-k", "ffn up / experts gate|up", "ffn down / experts down",
                         "lm head gemv"};
    return sh;
}

}  // namespace

Session::Session(Model& model, const eh_session_params& params)
    : SessionBase(shape_of(model), params), m_(model), c_(model.cfg) {
    ehcuda::MemoryLedger* L = &m_.ledger;
    const size_t B = size_t(max_batch());
    kv_f32_ = !m_.plan.kv_f16;
    const size_t kv_bytes = size_t(n_ctx()) * c_.kv_dim() * (kv_f32_ ? sizeof(float) : sizeof(__half));
    for (int i = 0; i < c_.n_layer; ++i) {
        kcache_.emplace_back(kv_bytes, L);
        vcache_.emplace_back(kv_bytes, L);
    }
    const size_t K = size_t(std::max(c_.n_expert_used, 1));
    h_ = ehcuda::DeviceBuffer(B * c_.n_embd * 4, L);
    xn_ = ehcuda::DeviceBuffer(B * c_.n_embd * 4, L);
    qkv_ = ehcuda::DeviceBuffer(B * c_.qkv_dim() * 4, L);
    attn_ = ehcuda::DeviceBuffer(B * c_.q_dim() * 4, L);
    // gpt2: the MLP's hidden layer; gpt-oss: one activation row per (token,
    // slot), and the decode kernels' int16x2 activations.
    ff_ = ehcuda::DeviceBuffer(c_.arch == Arch::Gpt2 ? B * c_.n_ff * 4
                                                     : std::max(B * K * c_.n_ff_exp * 4,
                                                                ehcuda::moe_decode_scratch_bytes(int(K), c_.n_ff_exp)),
                               L);
    if (c_.moe()) {
        router_ = ehcuda::DeviceBuffer(B * c_.n_expert * 4, L);
        ids_ = ehcuda::DeviceBuffer(B * K * 4, L);
        wts_ = ehcuda::DeviceBuffer(B * K * 4, L);
        // Prefill passes of up to session_moe_grouped_max tokens run their
        // experts grouped (model.hpp says when).
        grouped_max_ = std::min(session_moe_grouped_max(m_), int(B));
        if (grouped_max_ >= 2)
            grouped_ = ehcuda::DeviceBuffer(
                ehcuda::moe_grouped_scratch_bytes(grouped_max_, int(K), c_.n_expert, c_.n_embd, c_.n_ff_exp), L);
    }
    // Split-K width of the sink attention; the plan's attn_splits fixes it
    // for measurements (at most 128 here).
    nsplit_ = m_.plan.attn_splits > 0 ? std::min(m_.plan.attn_splits, 128) : ehcuda::attention_sink_splits(n_ctx());
    if (const size_t n = ehcuda::gemv_chunk_bytes(c_.q_dim())) attn_chunks_ = ehcuda::DeviceBuffer(n, L);
    set_profile_note(std::to_string(nsplit_) + " attention splits");
    attn_scratch_ = ehcuda::DeviceBuffer(ehcuda::attention_sink_scratch_floats(c_.n_head, c_.head_dim, nsplit_) * 4, L);
    attn_counters_ = ehcuda::DeviceBuffer(size_t(c_.n_head) * 4, L);
    EHC_CHECK(cudaMemset(attn_counters_.get(), 0, attn_counters_.size()));
    if (c_.moe()) {
        router_counter_ = ehcuda::DeviceBuffer(4, L);
        EHC_CHECK(cudaMemset(router_counter_.get(), 0, 4));
    }
    {
        ehcuda::SinkAttnArgs probe;
        probe.q = qkv_.as<float>();
        probe.ldq = c_.qkv_dim();
        if (kv_f32_) {
            probe.k_cache32 = kcache_[0].as<float>();
            probe.v_cache32 = vcache_[0].as<float>();
        } else {
            probe.k_cache = kcache_[0].as<__half>();
            probe.v_cache = vcache_[0].as<__half>();
        }
        probe.n_head = c_.n_head;
        probe.n_kv = c_.n_kv;
        probe.head_dim = c_.head_dim;
        if (c_.moe() && ehcuda::attention_decode_group_takes(ehcuda::attn_args_of(probe)))
            group_splits_ = ehcuda::attention_decode_group_splits(nsplit_, c_.n_kv);
    }
    ehcuda::PrefillShape ps;  // cuBLAS prefill path: slab, FP16 activations, MoE grouping
    ps.max_cols = std::max({c_.n_embd, c_.q_dim(), c_.arch == Arch::Gpt2 ? c_.n_ff : 0});
    if (c_.moe()) {
        ps.moe_experts = c_.n_expert;
        ps.moe_k = c_.n_expert_used;
        ps.moe_embd = c_.n_embd;
        ps.moe_ff = c_.n_ff_exp;
    }
    finish_init(ps);
    prefill_workspace()->set_mirror(&m_.mirror);
}

int Session::choose_decode_variant(uint32_t pos) const {
    const int min_keys = m_.plan.attn_group_min_keys;
    return group_splits_ > 0 && min_keys >= 0 && pos + 1 >= uint32_t(min_keys) ? kGroup : kFused;
}

std::string Session::vocab_text() const { return "(0.." + std::to_string(c_.n_vocab - 1) + ")"; }

std::string Session::context_note() const {
    if (c_.arch != Arch::Gpt2) return std::string();
    return " (gpt2 has " + std::to_string(c_.n_ctx_train) + " learned positions)";
}

bool Session::attend(int li, int ntok, ehcuda::RopeTableArgs r, ehcuda::SinkAttnArgs at, const ehcuda::MatSeg& out_proj) {
    cudaStream_t s = stream();
    const Config& c = c_;
    r.qkv = qkv_.as<float>();
    r.ld = c.qkv_dim();
    r.n_head = c.n_head;
    r.n_kv = c.n_kv;
    r.head_dim = c.head_dim;
    r.d_pos0 = d_pos0();
    r.ntok = ntok;
    at.q = r.qkv;
    at.ldq = r.ld;
    at.n_head = c.n_head;
    at.n_kv = c.n_kv;
    at.head_dim = c.head_dim;
    at.d_pos0 = r.d_pos0;
    at.ntok = ntok;
    at.scale = 1.0f / std::sqrt(float(c.head_dim));
    at.out = attn_.as<float>();
    at.ldo = c.q_dim();
    at.nsplit = nsplit_;
    at.split_scratch = attn_scratch_.as<float>();
    at.split_counters = attn_counters_.as<int>();
    ehcuda::DeviceBuffer& k = kcache_[size_t(li)];
    ehcuda::DeviceBuffer& v = vcache_[size_t(li)];
    if (kv_f32_) {
        r.k_cache32 = k.as<float>();
        r.v_cache32 = v.as<float>();
        at.k_cache32 = r.k_cache32;
        at.v_cache32 = r.v_cache32;
    } else {
        r.k_cache = k.as<__half>();
        r.v_cache = v.as<__half>();
        at.k_cache = r.k_cache;
        at.v_cache = r.v_cache;
    }
    // Decode at depth: each key read once per KV head (attention_decode_group);
    // window layers of fewer keys keep the fused kernel.
    const bool group = ntok == 1 && decode_variant() == kGroup &&
                       (at.window <= 0 || at.window >= m_.plan.attn_group_min_keys);
    const bool chunks = ntok == 1 && !group && m_.plan.attn_chunks && nsplit_ > 1 && c.head_dim % 32 == 0 && attn_chunks_.size() &&
                        attn_chunks_.size() >= ehcuda::gemv_chunk_bytes(c.q_dim()) &&
                        ehcuda::gemv_takes_chunks(out_proj.w.type);
    if (chunks) at.out_chunks = attn_chunks_.get();
    if (ntok > 1) {
        const ehcuda::AttnSplitScratch sp = ehcuda::attention_split_scratch(*prefill_workspace());
        at.prefill_scratch = sp.data;
        at.prefill_scratch_floats = sp.floats;
    }
    // QK-norm (r.q_norm set): inside the fused one-token kernel, else its
    // own kernel over the qkv rows first
    if (r.q_norm && (group || ntok > 1)) {
        ehcuda::head_rmsnorm(r.qkv, r.ld, c.n_head, c.n_kv, c.head_dim, r.q_norm, r.k_norm, ntok, r.norm_eps, s);
        r.q_norm = r.k_norm = nullptr;
    }
    if (group) {
        ehcuda::rope_table_store_kv(r, s);
        mark(kRope);
        ehcuda::attention_decode_group(ehcuda::attn_args_of(at), attn_scratch_.as<float>(), group_splits_, s);
    } else if (ntok == 1) {  // one kernel: RoPE, K/V store, split attention
        ehcuda::rope_sink_attention_decode(r, at, s);
    } else {
        ehcuda::rope_table_store_kv(r, s);
        mark(kRope);
        ehcuda::attention_sinks(at, s);
    }
    mark(kAttn);
    return chunks;
}

void Session::gpt2_layer(int li, int ntok) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const Layer& L = m_.layers[size_t(li)];
    float* h = h_.as<float>();
    float* xn = xn_.as<float>();
    float* qkv = qkv_.as<float>();
    float* attn = attn_.as<float>();
    float* ff = ff_.as<float>();

    ehcuda::layernorm(h, c.n_embd, L.attn_norm, L.attn_norm_b, xn, c.n_embd, c.n_embd, ntok, c.eps, s);
    ehcuda::MatmulArgs a;
    for (int k = 0; k < L.n_qkv; ++k) a.seg[k] = L.qkv[k];
    a.nseg = L.n_qkv;
    a.cols = c.n_embd;
    a.x = xn;
    a.ldx = c.n_embd;
    a.y = qkv;
    a.ldy = c.qkv_dim();
    a.ntok = ntok;
    a.prefill = prefill_ws(ntok);
    ehcuda::matmul(a, s);
    mark(kQkv);

    // (no rotation: stores K and V)
    const bool chunks = attend(li, ntok, ehcuda::RopeTableArgs{}, ehcuda::SinkAttnArgs{}, L.attn_out);

    ehcuda::MatmulArgs o;
    o.seg[0] = L.attn_out;
    o.cols = c.q_dim();
    o.x = chunks ? attn_chunks_.as<float>() : attn;
    if (chunks) o.xmode = ehcuda::XMode::Chunks;
    o.ldx = c.q_dim();
    o.y = h;
    o.ldy = c.n_embd;
    o.accumulate = true;  // residual add
    o.ntok = ntok;
    o.prefill = prefill_ws(ntok);
    ehcuda::matmul(o, s);
    mark(kOut);

    ehcuda::layernorm(h, c.n_embd, L.ffn_norm, L.ffn_norm_b, xn, c.n_embd, c.n_embd, ntok, c.eps, s);
    ehcuda::MatmulArgs u;
    u.seg[0] = L.ffn_up;
    u.cols = c.n_embd;
    u.x = xn;
    u.ldx = c.n_embd;
    u.y = ff;
    u.ldy = c.n_ff;
    u.ntok = ntok;
    u.prefill = prefill_ws(ntok);
    ehcuda::matmul(u, s);
    ehcuda::gelu_tanh_inplace(ff, c.n_ff, c.n_ff, ntok, s);
    mark(kFfnUp);

    ehcuda::MatmulArgs d;
    d.seg[0] = L.ffn_down;
    d.cols = c.n_ff;
    d.x = ff;
    d.ldx = c.n_ff;
    d.y = h;
    d.ldy = c.n_embd;
    d.accumulate = true;
    d.ntok = ntok;
    d.prefill = prefill_ws(ntok);
    ehcuda::matmul(d, s);
    mark(kFfnDown);
}

void Session::moe_layer(int li, int ntok) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const Layer& L = m_.layers[size_t(li)];
    float* h = h_.as<float>();
    float* xn = xn_.as<float>();
    float* qkv = qkv_.as<float>();
    float* attn = attn_.as<float>();

    ehcuda::MatmulArgs a;
    for (int k = 0; k < L.n_qkv; ++k) a.seg[k] = L.qkv[k];
    a.nseg = L.n_qkv;
    a.cols = c.n_embd;
    if (ntok == 1) {  // the pre-norm folded into the GEMV's input staging
        a.x = h;
        a.xmode = ehcuda::XMode::RmsNorm;
        a.norm_w = L.attn_norm;
        a.norm_eps = c.eps;
    } else {
        ehcuda::rmsnorm(h, c.n_embd, L.attn_norm, xn, c.n_embd, c.n_embd, ntok, c.eps, s);
        a.x = xn;
    }
    a.ldx = c.n_embd;
    a.y = qkv;
    a.ldy = c.qkv_dim();
    a.ntok = ntok;
    a.prefill = prefill_ws(ntok);
    ehcuda::matmul(a, s);
    mark(kQkv);

    ehcuda::RopeTableArgs r;  // NEOX rotation (YaRN-scaled when the file says) from the model's table
    r.n_rot = c.n_rot;
    r.neox = true;
    r.inv_freq = m_.inv_freq;
    r.attn_factor = c.attn_factor;
    if (c.qk_norm) {  // (applied in attend)
        r.q_norm = L.q_norm;
        r.k_norm = L.k_norm;
        r.norm_eps = c.eps;
    }
    ehcuda::SinkAttnArgs at;
    at.window = L.window;
    at.sinks = L.sinks;
    const bool chunks = attend(li, ntok, r, at, L.attn_out);

    ehcuda::MatmulArgs o;
    o.seg[0] = L.attn_out;
    o.cols = c.q_dim();
    o.x = chunks ? attn_chunks_.as<float>() : attn;
    if (chunks) o.xmode = ehcuda::XMode::Chunks;
    o.ldx = c.q_dim();
    o.y = h;
    o.ldy = c.n_embd;
    o.accumulate = true;
    o.ntok = ntok;
    o.prefill = prefill_ws(ntok);
    ehcuda::matmul(o, s);
    mark(kOut);

    // MoE: router, top-k, the selected experts' gate|up with the model's
    // SwiGLU, then down with the routing weights summed into the residual.
    // One token (decode): the pre-norm is folded into the router GEMV and
    // the expert kernels' input staging, and the experts run as the two
    // integer-input decode kernels.
    const int k = c.n_expert_used;
    const bool one = ntok == 1 && ehcuda::moe_decode_supported(L.gate_exps, L.up_exps, L.down_exps, k);
    // (one token: the expert kernel routes for itself unless switched off)
    const bool fused_route = one && moe_fused_route(m_);
    if (one && router_decode(m_, L)) {
        // the router's own kernel: its logits, and the routing unless the
        // expert kernel routes
        ehcuda::moe_router_decode(router_decode_args(c, L, h, router_.as<float>(), fused_route ? nullptr : ids_.as<int32_t>(),
                                                     wts_.as<float>(), router_counter_.as<int>()),
                                  s);
    } else {
        ehcuda::MatmulArgs ro;
        ro.seg[0] = L.router;
        ro.cols = c.n_embd;
        if (one) {
            ro.x = h;
            ro.xmode = ehcuda::XMode::RmsNorm;
            ro.norm_w = L.ffn_norm;
            ro.norm_eps = c.eps;
        } else {
            ehcuda::rmsnorm(h, c.n_embd, L.ffn_norm, xn, c.n_embd, c.n_embd, ntok, c.eps, s);
            ro.x = xn;
        }
        ro.ldx = c.n_embd;
        ro.y = router_.as<float>();
        ro.ldy = c.n_expert;
        ro.ntok = ntok;
        ro.prefill = prefill_ws(ntok);
        ehcuda::matmul(ro, s);
        if (!fused_route)
            ehcuda::moe_route(router_.as<float>(), ntok, c.n_expert, k, ids_.as<int32_t>(), wts_.as<float>(), s);
    }
    mark(kRouter);
    if (one) {
        ehcuda::MoeDecodeArgs md = moe_decode_args(c, L, h, router_.as<float>(), ids_.as<int32_t>(), wts_.as<float>(),
                                                   ff_.get(), ff_.size());
        if (!fused_route) {  // routed above
            md.logits = nullptr;
            md.ids = ids_.as<int32_t>();
            md.weights = wts_.as<float>();
        }
        ehcuda::moe_decode(md, s);
        mark(kFfnDown);
    } else if (ntok >= 2 && ntok <= grouped_max_ && grouped_.get() &&
               ehcuda::moe_grouped_supported(L.gate_exps, L.up_exps, L.down_exps, k)) {
        ehcuda::moe_grouped(moe_grouped_args(c, L, xn, ntok, ids_.as<int32_t>(), wts_.as<float>(), h, grouped_.get(),
                                             grouped_.size()),
                            s);
        mark(kFfnDown);
    } else if (!ehcuda::moe_prefill(prefill_ws(ntok), xn, c.n_embd, ntok, k, c.n_expert, ids_.as<int32_t>(),
                                    wts_.as<float>(), L.gate_exps, L.up_exps, L.down_exps, c.swiglu_alpha,
                                    c.swiglu_limit, h, c.n_embd, s)) {
        ehcuda::moe_gate_up(xn, c.n_embd, ntok, k, ids_.as<int32_t>(), L.gate_exps, L.up_exps, c.swiglu_alpha,
                            c.swiglu_limit, ff_.as<float>(), s);
        mark(kFfnUp);
        ehcuda::moe_down(ff_.as<float>(), ntok, k, ids_.as<int32_t>(), wts_.as<float>(), L.down_exps, h, c.n_embd, s);
        mark(kFfnDown);
    }
}

// decode_path is not consulted: decode is the one-token pass, and every
// one-token pass (a one-token prefill chunk too) runs without the prefill
// workspace (see prefill_ws).
void Session::forward(int ntok, const int32_t* d_tokens, bool /*decode_path*/) {
    cudaStream_t s = stream();
    const Config& c = c_;
    float* h = h_.as<float>();
    const int32_t* d_pos0 = this->d_pos0();
    ehcuda::embed_rows(m_.tok_embd, d_tokens, ntok, h, s);
    if (c.arch == Arch::Gpt2) ehcuda::add_position_rows(m_.pos_embd, d_pos0, ntok, h, s);
    mark(kEmbed);
    for (int li = 0; li < c.n_layer; ++li) {
        if (c.arch == Arch::Gpt2) gpt2_layer(li, ntok);
        else moe_layer(li, ntok);
    }
    // LM head on the last token only.
    const float* last = h + size_t(ntok - 1) * c.n_embd;
    ehcuda::MatmulArgs lm;
    lm.seg[0].w = m_.output;
    lm.cols = c.n_embd;
    lm.ldx = c.n_embd;
    if (c.arch == Arch::Gpt2) {
        float* xn = xn_.as<float>();
        ehcuda::layernorm(last, c.n_embd, m_.output_norm, m_.output_norm_b, xn, c.n_embd, c.n_embd, 1, c.eps, s);
        lm.x = xn;
    } else {
        lm.x = last;
        lm.xmode = ehcuda::XMode::RmsNorm;
        lm.norm_w = m_.output_norm;
        lm.norm_eps = c.eps;
    }
    lm.y = d_logits();
    lm.ldy = c.n_vocab;
    lm.ntok = 1;
    ehcuda::matmul(lm, s);
    mark(kHead);
}

}  // namespace gpt_cuda
