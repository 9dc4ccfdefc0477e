#include "session.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include <ehcuda/check.hpp>
#include <ehcuda/gpt_ops.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/moe.hpp>

namespace gpt_cuda {
namespace {

constexpr int kMaxBatch = 512;  // prefill tokens per forward pass

// FP32 KV cache by default. With FP16 K/V the rounding (~5e-4 relative)
// flips near-tied MoE router choices in later layers, and on the forged
// gpt-oss-20b that moved logits by a median 2.8 % and the top-1 token at
// 15 of 128 positions; with FP32 the logits match the CPU reference to
// ~4e-6 (tests/gpt_cuda/agreement_diag_test.cpp, issue 8). EH_GPT_CUDA_KV=f16
// halves the cache's memory and attention reads at that precision cost.
}  // namespace

bool kv_f32_from_env() {
    const char* v = std::getenv("EH_GPT_CUDA_KV");
    return !(v && std::string(v) == "f16");
}

size_t kv_element_bytes() { return kv_f32_from_env() ? 4 : 2; }

Session::Session(Model& model, const eh_session_params& params)
    : m_(model), c_(model.cfg), n_ctx_(params.n_ctx), cancel_(params.cancel), cancel_user_(params.cancel_user) {
    if (n_ctx_ == 0 || n_ctx_ > (1u << 24)) throw ehp::Error(EH_INVALID_ARGUMENT, "n_ctx must be in 1..16777216");
    // gpt2 has a table of learned positions: no room past its end
    if (c_.arch == Arch::Gpt2) n_ctx_ = std::min<uint32_t>(n_ctx_, uint32_t(c_.n_ctx_train));
    EHC_CHECK(cudaSetDevice(m_.device));
    max_batch_ = int(std::min<uint32_t>(n_ctx_, kMaxBatch));
    ehcuda::MemoryLedger* L = &m_.ledger;
    const size_t B = size_t(max_batch_);
    kv_f32_ = kv_f32_from_env();
    const size_t kv_bytes = size_t(n_ctx_) * c_.kv_dim() * (kv_f32_ ? sizeof(float) : sizeof(__half));
    for (int i = 0; i < c_.n_layer; ++i) {
        kcache_.emplace_back(kv_bytes, L);
        vcache_.emplace_back(kv_bytes, L);
    }
    const size_t K = size_t(std::max(c_.n_expert_used, 1));
    h_ = ehcuda::DeviceBuffer(B * c_.n_embd * 4, L);
    xn_ = ehcuda::DeviceBuffer(B * c_.n_embd * 4, L);
    qkv_ = ehcuda::DeviceBuffer(B * c_.qkv_dim() * 4, L);
    attn_ = ehcuda::DeviceBuffer(B * c_.q_dim() * 4, L);
    // gpt2: the MLP's hidden layer; gpt-oss: one activation row per (token, slot)
    ff_ = ehcuda::DeviceBuffer(c_.arch == Arch::Gpt2 ? B * c_.n_ff * 4 : B * K * c_.n_ff_exp * 4, L);
    if (c_.arch == Arch::GptOss) {
        router_ = ehcuda::DeviceBuffer(B * c_.n_expert * 4, L);
        ids_ = ehcuda::DeviceBuffer(B * K * 4, L);
        wts_ = ehcuda::DeviceBuffer(B * K * 4, L);
    }
    logits_ = ehcuda::DeviceBuffer(size_t(c_.n_vocab) * 4, L);
    history_ = ehcuda::DeviceBuffer(size_t(n_ctx_) * 4, L);
    tokens_ = ehcuda::DeviceBuffer(B * 4, L);
    step_ = ehcuda::DeviceBuffer(sizeof(Step), L);
    params_ = ehcuda::DeviceBuffer(sizeof(ehcuda::SamplerParams), L);
    counter_ = ehcuda::DeviceBuffer(sizeof(unsigned long long), L);
    out_token_ = ehcuda::DeviceBuffer(4, L);
    fwork_ = ehcuda::DeviceBuffer(size_t(c_.n_vocab) * 4, L);
    iwork_ = ehcuda::DeviceBuffer(size_t(c_.n_vocab) * 4, L);
    {  // cuBLAS prefill path: slab, FP16 activations, MoE grouping, on the ledger
        ehcuda::PrefillShape ps;
        ps.max_tokens = max_batch_;
        ps.max_cols = std::max({c_.n_embd, c_.q_dim(), c_.arch == Arch::Gpt2 ? c_.n_ff : 0});
        if (c_.arch == Arch::GptOss) {
            ps.moe_experts = c_.n_expert;
            ps.moe_k = c_.n_expert_used;
            ps.moe_embd = c_.n_embd;
            ps.moe_ff = c_.n_ff_exp;
        }
        prefill_ws_ = std::make_unique<ehcuda::PrefillWorkspace>(ps, stream_.get(), L);
    }
    EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_step_), sizeof(Step)));
    EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_out_), sizeof(int32_t)));
    EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_tokens_), B * sizeof(int32_t)));
    *h_step_ = Step{0, 0, 0, 0};
    EHC_CHECK(cudaMemsetAsync(step_.get(), 0, sizeof(Step), stream_.get()));
    EHC_CHECK(cudaMemsetAsync(counter_.get(), 0, sizeof(unsigned long long), stream_.get()));
    ehcuda::SamplerParams sp;  // greedy until set
    EHC_CHECK(cudaMemcpyAsync(params_.get(), &sp, sizeof sp, cudaMemcpyHostToDevice, stream_.get()));
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
}

Session::~Session() {
    decode_graph_.reset();
    if (h_step_) cudaFreeHost(h_step_);
    if (h_out_) cudaFreeHost(h_out_);
    if (h_tokens_) cudaFreeHost(h_tokens_);
}

void Session::set_sampling(const eh_sampling_params& p) {
    if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) throw ehp::Error(EH_INVALID_ARGUMENT, "temperature must be >= 0");
    if (p.top_k < 0) throw ehp::Error(EH_INVALID_ARGUMENT, "top_k must be >= 0");
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) throw ehp::Error(EH_INVALID_ARGUMENT, "top_p must be in (0, 1]");
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) throw ehp::Error(EH_INVALID_ARGUMENT, "min_p must be in [0, 1]");
    if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
        throw ehp::Error(EH_INVALID_ARGUMENT, "repetition_penalty must be > 0");
    if (p.repetition_window < -1) throw ehp::Error(EH_INVALID_ARGUMENT, "repetition_window must be >= -1");
    ehcuda::SamplerParams sp;
    sp.temperature = p.temperature;
    sp.top_k = p.top_k;
    sp.top_p = p.top_p;
    sp.min_p = p.min_p;
    sp.repetition_penalty = p.repetition_penalty;
    sp.repetition_window = p.repetition_window;
    sp.seed = p.seed;
    EHC_CHECK(cudaSetDevice(m_.device));
    EHC_CHECK(cudaMemcpyAsync(params_.get(), &sp, sizeof sp, cudaMemcpyHostToDevice, stream_.get()));
    EHC_CHECK(cudaMemsetAsync(counter_.get(), 0, sizeof(unsigned long long), stream_.get()));
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
    have_sampling_ = true;
}

void Session::check_cancel() {
    if (cancel_ && cancel_(cancel_user_)) throw ehp::Error(EH_CANCELLED, "cancelled");
}

void Session::check_tokens(const int32_t* tokens, uint32_t n) const {
    for (uint32_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= c_.n_vocab)
            throw ehp::Error(EH_INVALID_ARGUMENT, "token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                                      " is outside the vocabulary (0.." + std::to_string(c_.n_vocab - 1) + ")");
}

void Session::set_cache(int li, ehcuda::RopeTableArgs& r, ehcuda::SinkAttnArgs& at) {
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
}

void Session::gpt2_layer(int li, int ntok) {
    cudaStream_t s = stream_.get();
    const Config& c = c_;
    const Layer& L = m_.layers[size_t(li)];
    float* h = h_.as<float>();
    float* xn = xn_.as<float>();
    float* qkv = qkv_.as<float>();
    float* attn = attn_.as<float>();
    float* ff = ff_.as<float>();
    const int32_t* d_pos0 = &step_.as<Step>()->pos0;

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

    ehcuda::RopeTableArgs r;  // no rotation: stores K and V
    r.qkv = qkv;
    r.ld = c.qkv_dim();
    r.n_head = c.n_head;
    r.n_kv = c.n_kv;
    r.head_dim = c.head_dim;
    r.d_pos0 = d_pos0;
    r.ntok = ntok;
    ehcuda::SinkAttnArgs at;
    at.q = qkv;
    at.ldq = c.qkv_dim();
    at.n_head = c.n_head;
    at.n_kv = c.n_kv;
    at.head_dim = c.head_dim;
    at.d_pos0 = d_pos0;
    at.ntok = ntok;
    at.scale = 1.0f / std::sqrt(float(c.head_dim));
    at.out = attn;
    at.ldo = c.q_dim();
    set_cache(li, r, at);
    ehcuda::rope_table_store_kv(r, s);
    ehcuda::attention_sinks(at, s);

    ehcuda::MatmulArgs o;
    o.seg[0] = L.attn_out;
    o.cols = c.q_dim();
    o.x = attn;
    o.ldx = c.q_dim();
    o.y = h;
    o.ldy = c.n_embd;
    o.accumulate = true;  // residual add
    o.ntok = ntok;
    o.prefill = prefill_ws(ntok);
    ehcuda::matmul(o, s);

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
}

void Session::gpt_oss_layer(int li, int ntok) {
    cudaStream_t s = stream_.get();
    const Config& c = c_;
    const Layer& L = m_.layers[size_t(li)];
    float* h = h_.as<float>();
    float* xn = xn_.as<float>();
    float* qkv = qkv_.as<float>();
    float* attn = attn_.as<float>();
    const int32_t* d_pos0 = &step_.as<Step>()->pos0;

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

    ehcuda::RopeTableArgs r;
    r.qkv = qkv;
    r.ld = c.qkv_dim();
    r.n_head = c.n_head;
    r.n_kv = c.n_kv;
    r.head_dim = c.head_dim;
    r.n_rot = c.n_rot;
    r.neox = true;
    r.inv_freq = m_.inv_freq;
    r.attn_factor = c.attn_factor;
    r.d_pos0 = d_pos0;
    r.ntok = ntok;
    ehcuda::SinkAttnArgs at;
    at.q = qkv;
    at.ldq = c.qkv_dim();
    at.n_head = c.n_head;
    at.n_kv = c.n_kv;
    at.head_dim = c.head_dim;
    at.d_pos0 = d_pos0;
    at.ntok = ntok;
    at.window = L.window;
    at.scale = 1.0f / std::sqrt(float(c.head_dim));
    at.sinks = L.sinks;
    at.out = attn;
    at.ldo = c.q_dim();
    set_cache(li, r, at);
    ehcuda::rope_table_store_kv(r, s);
    ehcuda::attention_sinks(at, s);

    ehcuda::MatmulArgs o;
    o.seg[0] = L.attn_out;
    o.cols = c.q_dim();
    o.x = attn;
    o.ldx = c.q_dim();
    o.y = h;
    o.ldy = c.n_embd;
    o.accumulate = true;
    o.ntok = ntok;
    o.prefill = prefill_ws(ntok);
    ehcuda::matmul(o, s);

    // MoE: router, top-k, the selected experts' gate|up with the clamped
    // SwiGLU, then down with the routing weights summed into the residual.
    ehcuda::rmsnorm(h, c.n_embd, L.ffn_norm, xn, c.n_embd, c.n_embd, ntok, c.eps, s);
    ehcuda::MatmulArgs ro;
    ro.seg[0] = L.router;
    ro.cols = c.n_embd;
    ro.x = xn;
    ro.ldx = c.n_embd;
    ro.y = router_.as<float>();
    ro.ldy = c.n_expert;
    ro.ntok = ntok;
    ro.prefill = prefill_ws(ntok);
    ehcuda::matmul(ro, s);
    const int k = c.n_expert_used;
    ehcuda::moe_route(router_.as<float>(), ntok, c.n_expert, k, ids_.as<int32_t>(), wts_.as<float>(), s);
    if (!ehcuda::moe_prefill(prefill_ws(ntok), xn, c.n_embd, ntok, k, c.n_expert, ids_.as<int32_t>(), wts_.as<float>(),
                             L.gate_exps, L.up_exps, L.down_exps, c.swiglu_alpha, c.swiglu_limit, h, c.n_embd, s)) {
        ehcuda::moe_gate_up(xn, c.n_embd, ntok, k, ids_.as<int32_t>(), L.gate_exps, L.up_exps, c.swiglu_alpha,
                            c.swiglu_limit, ff_.as<float>(), s);
        ehcuda::moe_down(ff_.as<float>(), ntok, k, ids_.as<int32_t>(), wts_.as<float>(), L.down_exps, h, c.n_embd, s);
    }
}

// One forward pass over ntok tokens at positions step.pos0 .. +ntok-1,
// leaving the last token's logits in logits_.
void Session::forward(int ntok, const int32_t* d_tokens) {
    cudaStream_t s = stream_.get();
    const Config& c = c_;
    float* h = h_.as<float>();
    const int32_t* d_pos0 = &step_.as<Step>()->pos0;
    ehcuda::record_tokens(history_.as<int32_t>(), d_pos0, d_tokens, ntok, s);
    ehcuda::embed_rows(m_.tok_embd, d_tokens, ntok, h, s);
    if (c.arch == Arch::Gpt2) ehcuda::add_position_rows(m_.pos_embd, d_pos0, ntok, h, s);
    for (int li = 0; li < c.n_layer; ++li) {
        if (c.arch == Arch::Gpt2) gpt2_layer(li, ntok);
        else gpt_oss_layer(li, ntok);
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
    lm.y = logits_.as<float>();
    lm.ldy = c.n_vocab;
    lm.ntok = 1;
    ehcuda::matmul(lm, s);
}

void Session::prefill(const int32_t* tokens, uint32_t n) {
    if (n == 0) throw ehp::Error(EH_INVALID_ARGUMENT, "prefill with no tokens");
    if (!tokens) throw ehp::Error(EH_INVALID_ARGUMENT, "tokens is NULL");
    if (uint64_t(n_past_) + n > n_ctx_)
        throw ehp::Error(EH_CONTEXT_FULL, "context full: " + std::to_string(n_past_) + " + " + std::to_string(n) +
                                              " tokens exceed n_ctx " + std::to_string(n_ctx_) +
                                              (c_.arch == Arch::Gpt2 ? " (gpt2 has " + std::to_string(c_.n_ctx_train) +
                                                                           " learned positions)" : std::string()));
    check_tokens(tokens, n);
    EHC_CHECK(cudaSetDevice(m_.device));
    cudaStream_t s = stream_.get();
    const uint32_t start = n_past_;
    try {
        for (uint32_t done = 0; done < n;) {
            check_cancel();
            const int nb = int(std::min<uint32_t>(n - done, uint32_t(max_batch_)));
            // The pinned mirrors are reused per chunk, so the previous chunk
            // must have consumed them.
            EHC_CHECK(cudaStreamSynchronize(s));
            std::copy(tokens + done, tokens + done + nb, h_tokens_);
            *h_step_ = Step{int32_t(n_past_), int32_t(n_past_) + nb, 0, 0};
            EHC_CHECK(cudaMemcpyAsync(tokens_.get(), h_tokens_, size_t(nb) * 4, cudaMemcpyHostToDevice, s));
            EHC_CHECK(cudaMemcpyAsync(step_.get(), h_step_, sizeof(Step), cudaMemcpyHostToDevice, s));
            forward(nb, tokens_.as<int32_t>());
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

int32_t Session::sample() {
    if (!have_logits_) throw ehp::Error(EH_INVALID_ARGUMENT, "no logits yet: prefill first");
    if (!have_sampling_) throw ehp::Error(EH_INVALID_ARGUMENT, "session_set_sampling was not called");
    EHC_CHECK(cudaSetDevice(m_.device));
    cudaStream_t s = stream_.get();
    ehcuda::sample_tokens(logits_.as<float>(), c_.n_vocab, history_.as<int32_t>(), &step_.as<Step>()->n_hist,
                          params_.as<ehcuda::SamplerParams>(), counter_.as<unsigned long long>(),
                          {fwork_.as<float>(), iwork_.as<int32_t>()}, out_token_.as<int32_t>(), s);
    EHC_CHECK(cudaMemcpyAsync(h_out_, out_token_.get(), 4, cudaMemcpyDeviceToHost, s));
    EHC_CHECK(cudaStreamSynchronize(s));
    return *h_out_;
}

int32_t Session::decode(int32_t token) {
    if (!have_sampling_) throw ehp::Error(EH_INVALID_ARGUMENT, "session_set_sampling was not called");
    if (uint64_t(n_past_) + 1 > n_ctx_)
        throw ehp::Error(EH_CONTEXT_FULL, "context full: n_ctx " + std::to_string(n_ctx_) + " reached");
    check_tokens(&token, 1);
    check_cancel();
    EHC_CHECK(cudaSetDevice(m_.device));
    cudaStream_t s = stream_.get();
    Step* d_step = step_.as<Step>();
    auto step = [&] {
        EHC_CHECK(cudaMemcpyAsync(d_step, h_step_, sizeof(Step), cudaMemcpyHostToDevice, s));
        forward(1, &d_step->token);
        ehcuda::sample_tokens(logits_.as<float>(), c_.n_vocab, history_.as<int32_t>(), &d_step->n_hist,
                              params_.as<ehcuda::SamplerParams>(), counter_.as<unsigned long long>(),
                              {fwork_.as<float>(), iwork_.as<int32_t>()}, out_token_.as<int32_t>(), s);
        EHC_CHECK(cudaMemcpyAsync(h_out_, out_token_.get(), 4, cudaMemcpyDeviceToHost, s));
    };
    // The first step runs eagerly so every kernel's module is loaded (lazy
    // loading) before capture; later steps replay the captured graph.
    if (!decode_graph_.ready() && decode_warm_) decode_graph_.capture(s, step);
    *h_step_ = Step{int32_t(n_past_), int32_t(n_past_) + 1, token, 0};
    try {
        if (decode_graph_.ready())
            decode_graph_.launch(s);
        else
            step();
        decode_warm_ = true;
        EHC_CHECK(cudaStreamSynchronize(s));
    } catch (...) {
        have_logits_ = false;
        throw;
    }
    n_past_ += 1;
    have_logits_ = true;
    return *h_out_;
}

void Session::reset() {
    n_past_ = 0;
    have_logits_ = false;
}

const float* Session::logits() {
    if (!have_logits_) throw ehp::Error(EH_INVALID_ARGUMENT, "no logits yet");
    host_logits_.resize(size_t(c_.n_vocab));
    EHC_CHECK(cudaSetDevice(m_.device));
    EHC_CHECK(cudaMemcpyAsync(host_logits_.data(), logits_.get(), host_logits_.size() * 4, cudaMemcpyDeviceToHost,
                              stream_.get()));
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
    return host_logits_.data();
}

}  // namespace gpt_cuda
