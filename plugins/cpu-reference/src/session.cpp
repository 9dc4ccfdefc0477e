#include "session.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <engine_host/plugin_abi.hpp>

namespace cpuref {

using ehp::Error;

Session::Session(const Model& model, const eh_session_params& params)
    : model_(model), n_ctx_(params.n_ctx), cancel_(params.cancel), cancel_user_(params.cancel_user) {
    const Config& c = model.config();
    if (n_ctx_ == 0) throw Error(EH_INVALID_ARGUMENT, "n_ctx must be > 0");
    // gpt2 has a table of learned positions: no room past its end
    if (c.arch == Arch::Gpt2 && n_ctx_ > c.n_ctx_train) {
        n_ctx_ = c.n_ctx_train;
        ctx_limit_note_ = " (gpt2 has " + std::to_string(c.n_ctx_train) + " learned positions)";
    }
    const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * c.head_dim;
    const double kv_bytes = 2.0 * c.n_layer * static_cast<double>(n_ctx_) * static_cast<double>(kv_dim) * sizeof(float);
    if (kv_bytes > 1e12)
        throw Error(EH_INVALID_ARGUMENT, "n_ctx " + std::to_string(n_ctx_) + " needs a KV cache of " +
                                             std::to_string(static_cast<uint64_t>(kv_bytes / 1e9)) + " GB");
    k_cache_.assign(c.n_layer, std::vector<float>(static_cast<size_t>(n_ctx_) * kv_dim));
    v_cache_.assign(c.n_layer, std::vector<float>(static_cast<size_t>(n_ctx_) * kv_dim));
    logits_.assign(c.n_vocab, 0.0f);
}

void Session::prefill(const int32_t* tokens, uint32_t n) {
    if (n == 0) throw Error(EH_INVALID_ARGUMENT, "prefill needs at least one token");
    if (!tokens) throw Error(EH_INVALID_ARGUMENT, "tokens is NULL");
    if (static_cast<uint64_t>(tokens_.size()) + n > n_ctx_)
        throw Error(EH_CONTEXT_FULL, "context full: " + std::to_string(tokens_.size()) + " + " + std::to_string(n) +
                                         " tokens exceed n_ctx " + std::to_string(n_ctx_) + ctx_limit_note_);
    const uint32_t n_vocab = model_.config().n_vocab;
    for (uint32_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= n_vocab)
            throw Error(EH_INVALID_ARGUMENT, "token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                                 " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
    forward(tokens, n);
    tokens_.insert(tokens_.end(), tokens, tokens + n);
    has_logits_ = true;
}

int32_t Session::sample() {
    if (!has_logits_) throw Error(EH_INVALID_ARGUMENT, "nothing to sample from: prefill first");
    return sampler_.sample(logits_.data(), static_cast<uint32_t>(logits_.size()), tokens_);
}

int32_t Session::decode(int32_t token) {
    if (!sampler_.ready()) throw Error(EH_INVALID_ARGUMENT, "session_set_sampling must be called before decode");
    prefill(&token, 1);
    return sample();
}

void Session::reset() {
    tokens_.clear();
    has_logits_ = false;
}

void Session::forward(const int32_t* tokens, uint32_t n) {
    const Config& c = model_.config();
    ThreadPool& pool = model_.pool();
    const size_t T = n, E = c.n_embd;
    const size_t q_dim = static_cast<size_t>(c.n_head) * c.head_dim;
    const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * c.head_dim;
    const int64_t pos0 = static_cast<int64_t>(tokens_.size());

    std::vector<float> x(T * E), h(T * E), q(T * q_dim), k(T * kv_dim), v(T * kv_dim), att(T * q_dim), tmp(T * E);

    // embeddings
    for (size_t t = 0; t < T; ++t) {
        model_.token_embd().dequantize_row(static_cast<uint64_t>(tokens[t]), &x[t * E]);
        if (c.arch == Arch::Gpt2) {
            model_.position_embd().dequantize_row(static_cast<uint64_t>(pos0) + t, &h[0]);
            for (size_t i = 0; i < E; ++i) x[t * E + i] += h[i];
        }
    }

    auto norm = [&](const std::vector<float>& w, const std::vector<float>& b, const float* in, float* out) {
        for (size_t t = 0; t < T; ++t) {
            if (c.layer_norm) layer_norm(in + t * E, w.data(), b.empty() ? nullptr : b.data(), c.norm_eps, E, out + t * E);
            else rms_norm(in + t * E, w.data(), c.norm_eps, E, out + t * E);
        }
    };
    auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };

    for (uint32_t il = 0; il < c.n_layer; ++il) {
        if (cancel_ && cancel_(cancel_user_)) throw Error(EH_CANCELLED, "cancelled");
        const Layer& L = model_.layers()[il];
        norm(L.attn_norm, L.attn_norm_b, x.data(), h.data());
        if (L.wqkv) {
            std::vector<float> qkv(T * (q_dim + 2 * kv_dim));
            const size_t stride = q_dim + 2 * kv_dim;
            matmul(pool, L.wqkv, 0, stride, h.data(), T, E, qkv.data(), stride, bias(L.bqkv));
            for (size_t t = 0; t < T; ++t) {
                std::memcpy(&q[t * q_dim], &qkv[t * stride], q_dim * sizeof(float));
                std::memcpy(&k[t * kv_dim], &qkv[t * stride + q_dim], kv_dim * sizeof(float));
                std::memcpy(&v[t * kv_dim], &qkv[t * stride + q_dim + kv_dim], kv_dim * sizeof(float));
            }
        } else {
            matmul(pool, L.wq, 0, q_dim, h.data(), T, E, q.data(), q_dim, bias(L.bq));
            matmul(pool, L.wk, 0, kv_dim, h.data(), T, E, k.data(), kv_dim, bias(L.bk));
            matmul(pool, L.wv, 0, kv_dim, h.data(), T, E, v.data(), kv_dim, bias(L.bv));
        }
        apply_qk_norm(c, L, q.data(), k.data(), T);
        attention(L, il, T, pos0, q.data(), k.data(), v.data(), att.data());
        matmul(pool, L.wo, 0, E, att.data(), T, q_dim, tmp.data(), E, bias(L.bo));
        for (size_t i = 0; i < T * E; ++i) x[i] += tmp[i];

        norm(L.ffn_norm, L.ffn_norm_b, x.data(), h.data());
        feed_forward(L, T, h.data(), tmp.data());
        for (size_t i = 0; i < T * E; ++i) x[i] += tmp[i];
    }

    // Only the last position's logits are needed.
    const float* last = &x[(T - 1) * E];
    if (c.layer_norm) layer_norm(last, model_.output_norm().data(), bias(model_.output_norm_b()), c.norm_eps, E, h.data());
    else rms_norm(last, model_.output_norm().data(), c.norm_eps, E, h.data());
    std::vector<float> out(c.n_vocab);
    matmul(pool, model_.output(), 0, c.n_vocab, h.data(), 1, E, out.data(), c.n_vocab);
    logits_.swap(out);
}

void Session::attention(const Layer& L, uint32_t layer, size_t T, int64_t pos0,
                        float* q, float* k, float* v, float* out) {
    const Config& c = model_.config();
    const size_t hd = c.head_dim;
    const size_t q_dim = static_cast<size_t>(c.n_head) * hd;
    const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * hd;
    const RopeTables& rope = model_.rope();

    // rotate q and k, then store k and v at their positions
    if (rope.style != RopeStyle::None) {
        std::vector<float> cs(rope.n_rot / 2), sn(rope.n_rot / 2);
        for (size_t t = 0; t < T; ++t) {
            rope_cos_sin(rope, pos0 + static_cast<int64_t>(t), cs.data(), sn.data());
            for (uint32_t hh = 0; hh < c.n_head; ++hh) rope_apply(rope, cs.data(), sn.data(), q + t * q_dim + hh * hd);
            for (uint32_t hh = 0; hh < c.n_head_kv; ++hh) rope_apply(rope, cs.data(), sn.data(), k + t * kv_dim + hh * hd);
        }
    }
    float* kc = k_cache_[layer].data();
    float* vc = v_cache_[layer].data();
    for (size_t t = 0; t < T; ++t) {
        std::memcpy(kc + (static_cast<size_t>(pos0) + t) * kv_dim, k + t * kv_dim, kv_dim * sizeof(float));
        std::memcpy(vc + (static_cast<size_t>(pos0) + t) * kv_dim, v + t * kv_dim, kv_dim * sizeof(float));
    }

    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const uint32_t group = c.n_head / c.n_head_kv;
    const size_t n_items = T * c.n_head;
    const size_t ctx_len = static_cast<size_t>(pos0) + T;
    model_.pool().parallel_for(n_items, std::max<size_t>(1, 4096 / (ctx_len * hd + 1)), [&](size_t b, size_t e) {
        std::vector<float> scores(ctx_len);
        for (size_t item = b; item < e; ++item) {
            const size_t t = item / c.n_head;
            const uint32_t hh = static_cast<uint32_t>(item % c.n_head);
            const int64_t pos = pos0 + static_cast<int64_t>(t);
            const size_t g = hh / group;
            attend_one(q + t * q_dim + hh * hd, kc + g * hd, vc + g * hd, kv_dim, hd,
                       window_start(pos, L.window), pos, scale,
                       L.sinks.empty() ? nullptr : &L.sinks[hh], scores.data(), out + t * q_dim + hh * hd);
        }
    });
}

void Session::feed_forward(const Layer& L, size_t T, const float* in, float* out) {
    const Config& c = model_.config();
    ThreadPool& pool = model_.pool();
    const size_t E = c.n_embd, F = c.n_ff;
    auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
    switch (c.ffn) {
    case FfnKind::SwiGlu: {
        std::vector<float> g(T * F), u(T * F);
        matmul(pool, L.w_gate, 0, F, in, T, E, g.data(), F, bias(L.b_gate));
        matmul(pool, L.w_up, 0, F, in, T, E, u.data(), F, bias(L.b_up));
        for (size_t i = 0; i < T * F; ++i) g[i] = silu(g[i]) * u[i];
        matmul(pool, L.w_down, 0, E, g.data(), T, F, out, E, bias(L.b_down));
        break;
    }
    case FfnKind::SwiGluFused: {
        std::vector<float> gu(T * 2 * F), a(T * F);
        matmul(pool, L.w_up, 0, 2 * F, in, T, E, gu.data(), 2 * F);
        for (size_t t = 0; t < T; ++t)
            for (size_t i = 0; i < F; ++i) a[t * F + i] = silu(gu[t * 2 * F + i]) * gu[t * 2 * F + F + i];
        matmul(pool, L.w_down, 0, E, a.data(), T, F, out, E, bias(L.b_down));
        break;
    }
    case FfnKind::Gelu: {
        std::vector<float> u(T * F);
        matmul(pool, L.w_up, 0, F, in, T, E, u.data(), F, bias(L.b_up));
        for (auto& val : u) val = gelu_tanh(val);
        matmul(pool, L.w_down, 0, E, u.data(), T, F, out, E, bias(L.b_down));
        break;
    }
    case FfnKind::MoeOai:
    case FfnKind::MoeSwiGlu:
        moe(L, T, in, out);
        break;
    }
}

void Session::moe(const Layer& L, size_t T, const float* in, float* out) {
    const Config& c = model_.config();
    ThreadPool& pool = model_.pool();
    const size_t E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
    std::vector<float> router(T * X);
    matmul(pool, L.router, 0, X, in, T, E, router.data(), X, L.router_b.empty() ? nullptr : L.router_b.data());

    // which tokens go to which expert, with what weight
    std::vector<std::vector<std::pair<size_t, float>>> routed(X);
    for (size_t t = 0; t < T; ++t)
        for (auto [e, w] : route_top_k(&router[t * X], static_cast<int>(X), static_cast<int>(c.n_expert_used)))
            routed[static_cast<size_t>(e)].emplace_back(t, w);

    std::fill(out, out + T * E, 0.0f);
    std::vector<float> xin, g, u, y;
    for (size_t e = 0; e < X; ++e) {
        const auto& list = routed[e];
        if (list.empty()) continue;
        const size_t m = list.size();
        xin.resize(m * E);
        for (size_t r = 0; r < m; ++r) std::memcpy(&xin[r * E], in + list[r].first * E, E * sizeof(float));
        g.resize(m * F);
        u.resize(m * F);
        matmul(pool, L.gate_exps, e * F, F, xin.data(), m, E, g.data(), F,
               L.gate_exps_b.empty() ? nullptr : &L.gate_exps_b[e * F]);
        matmul(pool, L.up_exps, e * F, F, xin.data(), m, E, u.data(), F,
               L.up_exps_b.empty() ? nullptr : &L.up_exps_b[e * F]);
        for (size_t i = 0; i < m * F; ++i) g[i] = expert_activation(c, g[i], u[i]);
        y.resize(m * E);
        matmul(pool, L.down_exps, e * E, E, g.data(), m, F, y.data(), E,
               L.down_exps_b.empty() ? nullptr : &L.down_exps_b[e * E]);
        for (size_t r = 0; r < m; ++r) {
            const float w = list[r].second;
            float* o = out + list[r].first * E;
            for (size_t i = 0; i < E; ++i) o[i] += w * y[r * E + i];
        }
    }
}

}  // namespace cpuref
