#include "forward.hpp"

#include "lora.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#include <engine_host/plugin_abi.hpp>

namespace cpuref {
namespace {

using ehp::Error;

const float* bias_of(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

// Where each row of the batch comes from.
struct Row {
    Sequence* seq;
    uint32_t pos;
    uint32_t last;  // the last position it attends to: pos, or the end of its bidirectional span
    ehp::mrope::Position mpos;  // its rotation's position on M-RoPE models (time, row, column)
};

// The index within slice s of the last token that token i attends to.
uint32_t attends_to(const Slice& s, uint32_t i) {
    for (uint32_t j = 0; j < s.n_spans; ++j) {
        const eh_embd_span& sp = s.spans[j];
        if ((sp.flags & EH_SPAN_BIDIRECTIONAL) && i >= sp.first && i - sp.first < sp.count) return sp.first + sp.count - 1;
    }
    return i;
}

class Pass {
public:
    Pass(const Model& model, std::span<const Slice> slices) : m_(model), c_(model.config()), slices_(slices) {
        for (const Slice& s : slices)
            for (uint32_t i = 0; i < s.n; ++i)
                rows_.push_back({s.seq, s.seq->length() + i, s.seq->length() + attends_to(s, i), {}});
        if (c_.mrope.active()) place_mrope();
        for (const Row& r : rows_) {
            adapters_.push_back(r.seq->adapter);
            any_adapter_ = any_adapter_ || r.seq->adapter;
        }
    }

    void run(eh_cancel_fn cancel, void* cancel_user);

private:
    // Each row's M-RoPE position, and each sequence's next_pos for its new tokens.
    void place_mrope() {
        size_t t = 0;
        for (const Slice& s : slices_) {
            const uint32_t L = s.seq->length();
            const int32_t next = s.seq->next_position();
            std::vector<ehp::mrope::Position> pos(s.n);
            std::vector<int32_t>& after = s.seq->next_pos;
            for (size_t k = after.size(); k < L; ++k) after.push_back(int32_t(k) + 1);  // text before it knew
            after.resize(size_t(L) + s.n);
            ehp::mrope::place(next, s.n, s.spans, s.n_spans, pos.data(), &after[L]);
            for (uint32_t i = 0; i < s.n; ++i) rows_[t + i].mpos = pos[i];
            t += s.n;
        }
    }

    void attention(const Layer& L, uint32_t layer, float* q, const float* k, const float* v, float* out);
    void feed_forward(const Layer& L, const float* in, float* out);
    void moe(const Layer& L, const float* in, float* out);
    void norm(const std::vector<float>& w, const std::vector<float>& b, const float* in, float* out, size_t n_rows);
    void logits(const float* x);

    const Model& m_;
    const Config& c_;
    std::span<const Slice> slices_;
    std::vector<Row> rows_;
    // Each row's LoRA adapter (its sequence's; NULL: none), and whether any row has one.
    std::vector<const Adapter*> adapters_;
    bool any_adapter_ = false;
    // y += the adapters' updates of matrix w, for every row of the batch.
    void lora(const Matrix& w, const float* x, size_t x_stride, float* y, size_t y_stride) {
        if (any_adapter_) lora_update(m_.pool(), w, adapters_.data(), rows_.size(), x, x_stride, y, y_stride);
    }
};

void Pass::norm(const std::vector<float>& w, const std::vector<float>& b, const float* in, float* out, size_t n_rows) {
    const size_t E = c_.n_embd;
    for (size_t t = 0; t < n_rows; ++t) {
        if (c_.layer_norm) layer_norm(in + t * E, w.data(), bias_of(b), c_.norm_eps, E, out + t * E);
        else rms_norm(in + t * E, w.data(), c_.norm_eps, E, out + t * E);
    }
}

void Pass::run(eh_cancel_fn cancel, void* cancel_user) {
    ThreadPool& pool = m_.pool();
    const size_t T = rows_.size(), E = c_.n_embd;
    const size_t q_dim = static_cast<size_t>(c_.n_head) * c_.head_dim;
    const size_t kv_dim = static_cast<size_t>(c_.n_head_kv) * c_.head_dim;
    std::vector<float> x(T * E), h(T * E), q(T * q_dim), k(T * kv_dim), v(T * kv_dim), att(T * q_dim), tmp(T * E);

    size_t t = 0;
    for (const Slice& s : slices_)
        for (uint32_t i = 0; i < s.n; ++i, ++t) {
            m_.token_embd().dequantize_row(static_cast<uint64_t>(s.tokens[i]), &x[t * E]);
            if (c_.arch == Arch::Gpt2) {
                m_.position_embd().dequantize_row(rows_[t].pos, &h[0]);
                for (size_t e = 0; e < E; ++e) x[t * E + e] += h[e];
            }
            if (c_.embd_scale != 1.0f)
                for (size_t e = 0; e < E; ++e) x[t * E + e] *= c_.embd_scale;
        }

    // An image's rows replace its tokens' embeddings, as given (unscaled).
    t = 0;
    for (const Slice& s : slices_) {
        for (uint32_t j = 0; j < s.n_spans; ++j)
            std::memcpy(&x[(t + s.spans[j].first) * E], s.spans[j].rows, size_t(s.spans[j].count) * E * sizeof(float));
        t += s.n;
    }

    for (uint32_t il = 0; il < c_.n_layer; ++il) {
        if (cancel && cancel(cancel_user)) throw Error(EH_CANCELLED, "cancelled");
        const Layer& L = m_.layers()[il];
        norm(L.attn_norm, L.attn_norm_b, x.data(), h.data(), T);
        if (L.wqkv) {
            const size_t stride = q_dim + 2 * kv_dim;
            std::vector<float> qkv(T * stride);
            matmul(pool, L.wqkv, 0, stride, h.data(), T, E, qkv.data(), stride, bias_of(L.bqkv));
            lora(L.wqkv, h.data(), E, qkv.data(), stride);
            for (size_t r = 0; r < T; ++r) {
                std::memcpy(&q[r * q_dim], &qkv[r * stride], q_dim * sizeof(float));
                std::memcpy(&k[r * kv_dim], &qkv[r * stride + q_dim], kv_dim * sizeof(float));
                std::memcpy(&v[r * kv_dim], &qkv[r * stride + q_dim + kv_dim], kv_dim * sizeof(float));
            }
        } else {
            matmul(pool, L.wq, 0, q_dim, h.data(), T, E, q.data(), q_dim, bias_of(L.bq));
            lora(L.wq, h.data(), E, q.data(), q_dim);
            matmul(pool, L.wk, 0, kv_dim, h.data(), T, E, k.data(), kv_dim, bias_of(L.bk));
            lora(L.wk, h.data(), E, k.data(), kv_dim);
            matmul(pool, L.wv, 0, kv_dim, h.data(), T, E, v.data(), kv_dim, bias_of(L.bv));
            lora(L.wv, h.data(), E, v.data(), kv_dim);
        }
        apply_qk_norm(c_, L, q.data(), k.data(), T);
        attention(L, il, q.data(), k.data(), v.data(), att.data());
        matmul(pool, L.wo, 0, E, att.data(), T, q_dim, tmp.data(), E, bias_of(L.bo));
        lora(L.wo, att.data(), q_dim, tmp.data(), E);
        if (!L.attn_post_norm.empty()) norm(L.attn_post_norm, {}, tmp.data(), tmp.data(), T);
        for (size_t i = 0; i < T * E; ++i) x[i] += tmp[i];

        norm(L.ffn_norm, L.ffn_norm_b, x.data(), h.data(), T);
        feed_forward(L, h.data(), tmp.data());
        if (!L.ffn_post_norm.empty()) norm(L.ffn_post_norm, {}, tmp.data(), tmp.data(), T);
        for (size_t i = 0; i < T * E; ++i) x[i] += tmp[i];
    }
    logits(x.data());
}

// Only the last position of a slice that asks gets logits or its hidden
// state (the output norm's row, which the LM head reads); every position of
// one that asks every_logits gets logits.
void Pass::logits(const float* x) {
    const size_t E = c_.n_embd;
    struct Out {
        size_t row;
        float* logits;
        float* hidden;
    };
    std::vector<Out> outs;
    size_t t = 0;
    for (const Slice& s : slices_) {
        t += s.n;
        if (s.every_logits && s.logits)
            for (uint32_t i = 0; i + 1 < s.n; ++i) outs.push_back({t - s.n + i, s.logits + size_t(i) * c_.n_vocab, nullptr});
        if (s.logits || s.hidden)
            outs.push_back({t - 1, s.logits && s.every_logits ? s.logits + size_t(s.n - 1) * c_.n_vocab : s.logits, s.hidden});
    }
    if (outs.empty()) return;
    const size_t n = outs.size();
    std::vector<float> h(n * E);
    for (size_t i = 0; i < n; ++i) {
        const float* row = x + outs[i].row * E;
        if (c_.layer_norm)
            layer_norm(row, m_.output_norm().data(), bias_of(m_.output_norm_b()), c_.norm_eps, E, &h[i * E]);
        else rms_norm(row, m_.output_norm().data(), c_.norm_eps, E, &h[i * E]);
        if (outs[i].hidden) std::memcpy(outs[i].hidden, &h[i * E], E * sizeof(float));
    }
    // The LM head over the rows that want logits, one row at a time's
    // arithmetic whichever rows share the matmul.
    std::vector<float> hl;
    std::vector<float*> want;
    std::vector<const Adapter*> want_ad;  // their rows' adapters
    for (size_t i = 0; i < n; ++i)
        if (outs[i].logits) {
            hl.insert(hl.end(), h.begin() + i * E, h.begin() + (i + 1) * E);
            want.push_back(outs[i].logits);
            want_ad.push_back(adapters_[outs[i].row]);
        }
    if (want.empty()) return;
    std::vector<float> out(want.size() * c_.n_vocab);
    matmul(m_.pool(), m_.output(), 0, c_.n_vocab, hl.data(), want.size(), E, out.data(), c_.n_vocab);
    if (any_adapter_) lora_update(m_.pool(), m_.output(), want_ad.data(), want.size(), hl.data(), E, out.data(), c_.n_vocab);
    if (const float cap = c_.logit_softcap; cap > 0.0f)
        for (float& l : out) l = cap * std::tanh(l / cap);
    for (size_t i = 0; i < want.size(); ++i) std::memcpy(want[i], &out[i * c_.n_vocab], c_.n_vocab * sizeof(float));
}

void Pass::attention(const Layer& L, uint32_t layer, float* q, const float* k, const float* v, float* out) {
    const size_t hd = c_.head_dim, T = rows_.size();
    const size_t q_dim = static_cast<size_t>(c_.n_head) * hd;
    const size_t kv_dim = static_cast<size_t>(c_.n_head_kv) * hd;
    const RopeTables& rope = m_.rope(L);

    // Rotate q and k at each row's own position, then store k and v there.
    std::vector<float> kr(k, k + T * kv_dim);
    if (rope.style != RopeStyle::None) {
        std::vector<float> cs(rope.n_rot / 2), sn(rope.n_rot / 2);
        for (size_t r = 0; r < T; ++r) {
            if (c_.mrope.active()) mrope_cos_sin(rope, c_.mrope, rows_[r].mpos, cs.data(), sn.data());
            else rope_cos_sin(rope, rows_[r].pos, cs.data(), sn.data());
            for (uint32_t hh = 0; hh < c_.n_head; ++hh) rope_apply(rope, cs.data(), sn.data(), q + r * q_dim + hh * hd);
            for (uint32_t hh = 0; hh < c_.n_head_kv; ++hh) rope_apply(rope, cs.data(), sn.data(), &kr[r * kv_dim + hh * hd]);
        }
    }
    for (size_t r = 0; r < T; ++r) {
        Sequence& seq = *rows_[r].seq;
        seq.pool().store_k(layer, seq.row(rows_[r].pos), &kr[r * kv_dim]);
        seq.pool().store_v(layer, seq.row(rows_[r].pos), v + r * kv_dim);
    }
    // An F32 pool is read in place; any other type is read back as floats
    // once per sequence and layer (every position up to its last row's), so
    // a row sees the same values whatever else shares the step.
    struct Plain {
        std::vector<float> k, v;
    };
    std::unordered_map<const Sequence*, Plain> plain;
    if (rows_[0].seq->pool().type() != EH_TYPE_F32) {
        std::unordered_map<const Sequence*, uint32_t> upto;
        for (const Row& row : rows_) upto[row.seq] = std::max(upto[row.seq], row.last + 1);
        for (auto [s, n] : upto) {
            Plain& p = plain[s];
            p.k.resize(size_t(n) * kv_dim);
            p.v.resize(size_t(n) * kv_dim);
            m_.pool().parallel_for(n, 64, [&](size_t b, size_t e) {
                for (size_t pos = b; pos < e; ++pos) {
                    s->pool().load_k(layer, s->row(uint32_t(pos)), &p.k[pos * kv_dim]);
                    s->pool().load_v(layer, s->row(uint32_t(pos)), &p.v[pos * kv_dim]);
                }
            });
        }
    }

    const float scale = c_.attn_scale > 0.0f ? c_.attn_scale : 1.0f / std::sqrt(static_cast<float>(hd));
    const uint32_t group = c_.n_head / c_.n_head_kv;
    size_t longest = 1;
    for (const Row& row : rows_) longest = std::max<size_t>(longest, row.last + 1);
    m_.pool().parallel_for(T * c_.n_head, std::max<size_t>(1, 4096 / (longest * hd + 1)), [&](size_t b, size_t e) {
        std::vector<float> scores(longest);
        std::vector<const float*> k_rows(longest), v_rows(longest);
        for (size_t item = b; item < e; ++item) {
            const size_t r = item / c_.n_head;
            const uint32_t hh = static_cast<uint32_t>(item % c_.n_head);
            const Sequence& seq = *rows_[r].seq;
            const int64_t pos = rows_[r].pos;
            const size_t g = static_cast<size_t>(hh / group) * hd;
            const int64_t first = window_start(pos, L.window);
            const size_t n = static_cast<size_t>(int64_t(rows_[r].last) - first + 1);
            const Plain* pl = plain.empty() ? nullptr : &plain.at(&seq);
            for (size_t j = 0; j < n; ++j) {
                const uint32_t p = static_cast<uint32_t>(first + static_cast<int64_t>(j));
                if (pl) {
                    k_rows[j] = &pl->k[size_t(p) * kv_dim + g];
                    v_rows[j] = &pl->v[size_t(p) * kv_dim + g];
                } else {
                    k_rows[j] = seq.pool().k_f32(layer, seq.row(p)) + g;
                    v_rows[j] = seq.pool().v_f32(layer, seq.row(p)) + g;
                }
            }
            attend_rows(q + r * q_dim + hh * hd, k_rows.data(), v_rows.data(), n, hd, scale,
                        L.sinks.empty() ? nullptr : &L.sinks[hh], scores.data(), out + r * q_dim + hh * hd);
        }
    });
}

void Pass::feed_forward(const Layer& L, const float* in, float* out) {
    ThreadPool& pool = m_.pool();
    const size_t T = rows_.size(), E = c_.n_embd, F = c_.n_ff;
    switch (c_.ffn) {
    case FfnKind::SwiGlu: {
        std::vector<float> g(T * F), u(T * F);
        matmul(pool, L.w_gate, 0, F, in, T, E, g.data(), F, bias_of(L.b_gate));
        lora(L.w_gate, in, E, g.data(), F);
        matmul(pool, L.w_up, 0, F, in, T, E, u.data(), F, bias_of(L.b_up));
        lora(L.w_up, in, E, u.data(), F);
        for (size_t i = 0; i < T * F; ++i) g[i] = silu(g[i]) * u[i];
        matmul(pool, L.w_down, 0, E, g.data(), T, F, out, E, bias_of(L.b_down));
        lora(L.w_down, g.data(), F, out, E);
        break;
    }
    case FfnKind::SwiGluFused: {
        std::vector<float> gu(T * 2 * F), a(T * F);
        matmul(pool, L.w_up, 0, 2 * F, in, T, E, gu.data(), 2 * F);
        lora(L.w_up, in, E, gu.data(), 2 * F);
        for (size_t t = 0; t < T; ++t)
            for (size_t i = 0; i < F; ++i) a[t * F + i] = silu(gu[t * 2 * F + i]) * gu[t * 2 * F + F + i];
        matmul(pool, L.w_down, 0, E, a.data(), T, F, out, E, bias_of(L.b_down));
        lora(L.w_down, a.data(), F, out, E);
        break;
    }
    case FfnKind::GeluGated: {
        std::vector<float> g(T * F), u(T * F);
        matmul(pool, L.w_gate, 0, F, in, T, E, g.data(), F, bias_of(L.b_gate));
        lora(L.w_gate, in, E, g.data(), F);
        matmul(pool, L.w_up, 0, F, in, T, E, u.data(), F, bias_of(L.b_up));
        lora(L.w_up, in, E, u.data(), F);
        for (size_t i = 0; i < T * F; ++i) g[i] = gelu_tanh(g[i]) * u[i];
        matmul(pool, L.w_down, 0, E, g.data(), T, F, out, E, bias_of(L.b_down));
        lora(L.w_down, g.data(), F, out, E);
        break;
    }
    case FfnKind::Gelu: {
        std::vector<float> u(T * F);
        matmul(pool, L.w_up, 0, F, in, T, E, u.data(), F, bias_of(L.b_up));
        lora(L.w_up, in, E, u.data(), F);
        for (auto& val : u) val = gelu_tanh(val);
        matmul(pool, L.w_down, 0, E, u.data(), T, F, out, E, bias_of(L.b_down));
        lora(L.w_down, u.data(), F, out, E);
        break;
    }
    case FfnKind::MoeOai:
    case FfnKind::MoeSwiGlu:
        moe(L, in, out);
        break;
    }
}

void Pass::moe(const Layer& L, const float* in, float* out) {
    ThreadPool& pool = m_.pool();
    const size_t T = rows_.size(), E = c_.n_embd, F = c_.n_ff_exp, X = c_.n_expert;
    std::vector<float> router(T * X);
    matmul(pool, L.router, 0, X, in, T, E, router.data(), X, bias_of(L.router_b));

    // which tokens go to which expert, with what weight
    std::vector<std::vector<std::pair<size_t, float>>> routed(X);
    for (size_t t = 0; t < T; ++t)
        for (auto [e, w] : route_top_k(&router[t * X], static_cast<int>(X), static_cast<int>(c_.n_expert_used)))
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
        for (size_t i = 0; i < m * F; ++i) g[i] = expert_activation(c_, g[i], u[i]);
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

}  // namespace

void forward(const Model& model, std::span<const Slice> slices, eh_cancel_fn cancel, void* cancel_user) {
    if (slices.empty()) return;
    Pass(model, slices).run(cancel, cancel_user);
}

}  // namespace cpuref
