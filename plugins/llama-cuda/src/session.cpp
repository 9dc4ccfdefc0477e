#include "session.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <ehcuda/check.hpp>
#include <ehcuda/kernels.hpp>

namespace llama_cuda {
namespace {

// Prefill tokens per forward pass. 256, not 512: the per-session activation
// buffers scale with it, and at 512 they (with the prefill workspace) put a
// Qwen2.5-0.5B session at 1.18x weights + KV for a 4096 context, over the
// issue's 1.10 bound; cuBLAS GEMMs of 256 rows are still efficient.
constexpr int kMaxBatch = 256;

}  // namespace

Session::Session(Model& model, const eh_session_params& params)
    : m_(model), c_(model.cfg), n_ctx_(params.n_ctx), cancel_(params.cancel), cancel_user_(params.cancel_user) {
    if (n_ctx_ == 0 || n_ctx_ > (1u << 24)) throw ehp::Error(EH_INVALID_ARGUMENT, "n_ctx must be in 1..16777216");
    EHC_CHECK(cudaSetDevice(m_.device));
    max_batch_ = int(std::min<uint32_t>(n_ctx_, kMaxBatch));
    // Split-K width for decode attention, sized for a full cache. (It was
    // n_ctx/256 ≤ 32: a 641-position session got 2 splits, so a block walked
    // ~320 keys serially and decode after a 512-token prompt ran at half
    // speed.) EHCUDA_ATTN_SPLITS=N overrides it for measurements.
    nsplit_ = ehcuda::attention_decode_splits(n_ctx_);
    if (const char* e = std::getenv("EHCUDA_ATTN_SPLITS")) nsplit_ = std::clamp(std::atoi(e), 1, 1024);
    if (const char* e = std::getenv("EHCUDA_PROFILE_DECODE")) profile_ = e[0] == '1';
    ehcuda::MemoryLedger* L = &m_.ledger;
    const size_t B = size_t(max_batch_);
    const size_t kv_bytes = size_t(n_ctx_) * c_.kv_dim() * sizeof(__half);
    for (int i = 0; i < c_.n_layer; ++i) {
        kcache_.emplace_back(kv_bytes, L);
        vcache_.emplace_back(kv_bytes, L);
    }
    h_ = ehcuda::DeviceBuffer(B * c_.n_embd * 4, L);
    xn_ = ehcuda::DeviceBuffer(B * c_.n_embd * 4, L);
    qkv_ = ehcuda::DeviceBuffer(B * c_.qkv_dim() * 4, L);
    attn_ = ehcuda::DeviceBuffer(B * c_.q_dim() * 4, L);
    ff_ = ehcuda::DeviceBuffer(B * 2 * size_t(c_.n_ff) * 4, L);
    logits_ = ehcuda::DeviceBuffer(size_t(c_.n_vocab) * 4, L);
    attn_scratch_ = ehcuda::DeviceBuffer(ehcuda::attention_decode_scratch_floats(c_.n_head, c_.head_dim, nsplit_) * 4, L);
    history_ = ehcuda::DeviceBuffer(size_t(n_ctx_) * 4, L);
    tokens_ = ehcuda::DeviceBuffer(B * 4, L);
    step_ = ehcuda::DeviceBuffer(sizeof(Step), L);
    params_ = ehcuda::DeviceBuffer(sizeof(ehcuda::SamplerParams), L);
    counter_ = ehcuda::DeviceBuffer(sizeof(unsigned long long), L);
    out_token_ = ehcuda::DeviceBuffer(4, L);
    fwork_ = ehcuda::DeviceBuffer(size_t(c_.n_vocab) * 4, L);
    iwork_ = ehcuda::DeviceBuffer(size_t(c_.n_vocab) * 4, L);
    {  // cuBLAS prefill path: slab + FP16 activations, on the ledger
        ehcuda::PrefillShape ps;
        ps.max_tokens = max_batch_;
        ps.max_cols = std::max({c_.n_embd, c_.q_dim(), c_.n_ff});
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
    if (profile_ && profiled_steps_) print_profile();
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
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
                                                      " is outside the vocabulary (" + std::to_string(c_.n_vocab) + ")");
}

// One forward pass over ntok tokens at positions step.pos0 .. +ntok-1,
// leaving the last token's logits in logits_.
void Session::forward(int ntok, const int32_t* d_tokens, bool decode_path) {
    cudaStream_t s = stream_.get();
    const Config& c = c_;
    float* h = h_.as<float>();
    float* xn = xn_.as<float>();
    float* qkv = qkv_.as<float>();
    float* attn = attn_.as<float>();
    float* ff = ff_.as<float>();
    const int32_t* d_pos0 = &step_.as<Step>()->pos0;

    // Pre-norm of a matmul's input: folded into the GEMV for one token,
    // a separate kernel otherwise.
    auto prenorm = [&](ehcuda::MatmulArgs& m, const float* w) {
        if (ntok == 1) {
            m.x = h;
            m.xmode = ehcuda::XMode::RmsNorm;
            m.norm_w = w;
            m.norm_eps = c.eps;
        } else {
            ehcuda::rmsnorm(h, c.n_embd, w, xn, c.n_embd, c.n_embd, ntok, c.eps, s);
            m.x = xn;
        }
    };
    ehcuda::PrefillWorkspace* pw = decode_path ? nullptr : prefill_ws_.get();
    ehcuda::record_tokens(history_.as<int32_t>(), d_pos0, d_tokens, ntok, s);
    ehcuda::embed_rows(m_.tok_embd, d_tokens, ntok, h, s);
    mark(kEmbed);
    for (int li = 0; li < c.n_layer; ++li) {
        const Layer& L = m_.layers[size_t(li)];
        ehcuda::MatmulArgs a;
        for (int k = 0; k < L.n_qkv; ++k) a.seg[k] = L.qkv[k];
        a.nseg = L.n_qkv;
        a.cols = c.n_embd;
        prenorm(a, L.attn_norm);
        a.ldx = c.n_embd;
        a.y = qkv;
        a.ldy = c.qkv_dim();
        a.ntok = ntok;
        a.prefill = pw;
        ehcuda::matmul(a, s);
        mark(kQkv);

        ehcuda::RopeArgs r;
        r.qkv = qkv;
        r.ld = c.qkv_dim();
        r.n_head = c.n_head;
        r.n_kv = c.n_kv;
        r.head_dim = c.head_dim;
        r.n_rot = c.n_rot;
        r.neox = c.neox;
        r.freq_base = c.freq_base;
        r.d_pos0 = d_pos0;
        r.ntok = ntok;
        r.k_cache = kcache_[size_t(li)].as<__half>();
        r.v_cache = vcache_[size_t(li)].as<__half>();
        ehcuda::rope_store_kv(r, s);
        mark(kRope);

        ehcuda::AttnArgs at;
        at.q = qkv;
        at.ldq = c.qkv_dim();
        at.k_cache = r.k_cache;
        at.v_cache = r.v_cache;
        at.n_head = c.n_head;
        at.n_kv = c.n_kv;
        at.head_dim = c.head_dim;
        at.d_pos0 = d_pos0;
        at.ntok = ntok;
        at.window = c.window;
        at.scale = 1.0f / std::sqrt(float(c.head_dim));
        at.out = attn;
        at.ldo = c.q_dim();
        if (decode_path)
            ehcuda::attention_decode(at, attn_scratch_.as<float>(), nsplit_, s);
        else
            ehcuda::attention_prefill(at, s);
        mark(kAttn);

        ehcuda::MatmulArgs o;
        o.seg[0].w = L.attn_out;
        o.cols = c.q_dim();
        o.x = attn;
        o.ldx = c.q_dim();
        o.y = h;
        o.ldy = c.n_embd;
        o.accumulate = true;  // residual add
        o.ntok = ntok;
        o.prefill = pw;
        ehcuda::matmul(o, s);
        mark(kOut);

        ehcuda::MatmulArgs g;
        for (int k = 0; k < L.n_gate_up; ++k) g.seg[k] = L.gate_up[k];
        g.nseg = L.n_gate_up;
        g.cols = c.n_embd;
        prenorm(g, L.ffn_norm);
        g.ldx = c.n_embd;
        g.y = ff;
        g.ldy = 2 * c.n_ff;
        g.ntok = ntok;
        g.prefill = pw;
        ehcuda::matmul(g, s);
        mark(kGateUp);

        ehcuda::MatmulArgs d;
        d.seg[0].w = L.ffn_down;
        d.cols = c.n_ff;
        d.x = ff;
        d.ldx = 2 * c.n_ff;
        d.xmode = ehcuda::XMode::SwiGLU;
        d.y = h;
        d.ldy = c.n_embd;
        d.accumulate = true;
        d.ntok = ntok;
        d.prefill = pw;
        ehcuda::matmul(d, s);
        mark(kDown);
    }
    // LM head on the last token only; its final norm is folded into the
    // GEMV's input staging.
    const float* last = h + size_t(ntok - 1) * c.n_embd;
    ehcuda::MatmulArgs lm;
    lm.seg[0].w = m_.output;
    lm.cols = c.n_embd;
    lm.x = last;
    lm.ldx = c.n_embd;
    lm.xmode = ehcuda::XMode::RmsNorm;
    lm.norm_w = m_.output_norm;
    lm.norm_eps = c.eps;
    lm.y = logits_.as<float>();
    lm.ldy = c.n_vocab;
    lm.ntok = 1;
    ehcuda::matmul(lm, s);
    mark(kHead);
}

void Session::prefill(const int32_t* tokens, uint32_t n) {
    if (n == 0) throw ehp::Error(EH_INVALID_ARGUMENT, "prefill with no tokens");
    if (!tokens) throw ehp::Error(EH_INVALID_ARGUMENT, "tokens is NULL");
    if (uint64_t(n_past_) + n > n_ctx_)
        throw ehp::Error(EH_CONTEXT_FULL, "context full: " + std::to_string(n_past_) + " + " + std::to_string(n) +
                                              " tokens exceed n_ctx " + std::to_string(n_ctx_));
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
            forward(nb, tokens_.as<int32_t>(), false);
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
        forward(1, &d_step->token, true);
        ehcuda::sample_tokens(logits_.as<float>(), c_.n_vocab, history_.as<int32_t>(), &d_step->n_hist,
                              params_.as<ehcuda::SamplerParams>(), counter_.as<unsigned long long>(),
                              {fwork_.as<float>(), iwork_.as<int32_t>()}, out_token_.as<int32_t>(), s);
        mark(kSample);
        EHC_CHECK(cudaMemcpyAsync(h_out_, out_token_.get(), 4, cudaMemcpyDeviceToHost, s));
    };
    // The first step runs eagerly so every kernel's module is loaded (lazy
    // loading) before capture; later steps replay the captured graph.
    if (!decode_graph_.ready() && decode_warm_ && !profile_) decode_graph_.capture(s, step);
    *h_step_ = Step{int32_t(n_past_), int32_t(n_past_) + 1, token, 0};
    try {
        if (profile_ && decode_warm_) {
            profiled_keys_ += n_past_ + 1;
            profiled_step(step);
        } else if (decode_graph_.ready())
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

void Session::mark(Group g) {
    if (!marking_) return;
    if (events_.size() == event_group_.size()) {
        cudaEvent_t e;
        EHC_CHECK(cudaEventCreate(&e));
        events_.push_back(e);
    }
    EHC_CHECK(cudaEventRecord(events_[event_group_.size()], stream_.get()));
    event_group_.push_back(g);
}

void Session::profiled_step(const std::function<void()>& body) {
    cudaStream_t s = stream_.get();
    // Hold the GPU while the whole step is enqueued, so its kernels then run
    // back to back and the events measure GPU time, not launch gaps.
    ehcuda::gpu_busy_wait(3000, s);
    event_group_.clear();
    marking_ = true;
    try {
        mark(kEmbed);  // start marker; its own interval is not counted
        event_group_.back() = -1;
        body();
    } catch (...) {
        marking_ = false;
        throw;
    }
    marking_ = false;
    EHC_CHECK(cudaStreamSynchronize(s));
    for (size_t i = 1; i < event_group_.size(); ++i) {
        float ms = 0;
        EHC_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
        group_ms_[event_group_[i]] += ms;
        step_ms_ += ms;
    }
    ++profiled_steps_;
}

void Session::print_profile() const {
    static const char* names[kGroups] = {"embed+record", "qkv gemv (+norm)", "rope+kv store", "attention decode+merge",
                                         "attn_out gemv", "gate/up gemv (+norm)", "ffn_down gemv (+swiglu)",
                                         "lm head gemv", "sampler"};
    const double n = double(profiled_steps_);
    std::fprintf(stderr, "[profile] decode: %llu steps, mean attended length %.0f keys, %d attention splits, GPU time %.1f us/step\n",
                 static_cast<unsigned long long>(profiled_steps_), double(profiled_keys_) / n, nsplit_,
                 1e3 * step_ms_ / n);
    for (int g = 0; g < kGroups; ++g)
        std::fprintf(stderr, "[profile]   %-26s %8.1f us/step  %5.1f %%\n", names[g], 1e3 * group_ms_[g] / n,
                     step_ms_ > 0 ? 100 * group_ms_[g] / step_ms_ : 0.0);
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

}  // namespace llama_cuda
