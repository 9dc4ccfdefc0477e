#include "ops.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cpuref {

void rms_norm(const float* x, const float* w, float eps, size_t n, float* out) {
    double ss = 0.0;
    for (size_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (size_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void layer_norm(const float* x, const float* w, const float* b, float eps, size_t n, float* out) {
    double mean = 0.0;
    for (size_t i = 0; i < n; ++i) mean += x[i];
    mean /= static_cast<double>(n);
    double var = 0.0;
    for (size_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= static_cast<double>(n);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (size_t i = 0; i < n; ++i)
        out[i] = static_cast<float>((x[i] - mean) * inv) * w[i] + (b ? b[i] : 0.0f);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

float gelu_tanh(float x) {
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}

float swiglu_oai(float gate, float up, float alpha, float limit) {
    gate = std::min(gate, limit);
    up = std::clamp(up, -limit, limit);
    const float glu = gate / (1.0f + std::exp(-alpha * gate));
    return (up + 1.0f) * glu;
}

void softmax(float* x, size_t n) {
    if (n == 0) return;
    const float m = *std::max_element(x, x + n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - m);
        sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

RopeTables make_rope_tables(const RopeConfig& cfg) {
    RopeTables t;
    t.style = cfg.style;
    t.n_rot = cfg.n_rot;
    if (cfg.style == RopeStyle::None || cfg.n_rot == 0) return t;
    const uint32_t half = cfg.n_rot / 2;
    const double dim = cfg.n_rot;
    const double base = cfg.freq_base;
    t.inv_freq.resize(half);
    for (uint32_t i = 0; i < half; ++i) t.inv_freq[i] = static_cast<float>(1.0 / std::pow(base, 2.0 * i / dim));

    if (cfg.yarn && cfg.yarn_factor > 1.0f) {
        // Blend interpolated (pos / factor) and original frequencies: pairs that
        // turn fewer than beta_slow times over the original context are
        // interpolated, more than beta_fast times kept, linear ramp between.
        const double factor = cfg.yarn_factor;
        const double orig = cfg.yarn_orig_ctx ? cfg.yarn_orig_ctx : 4096;
        auto correction_dim = [&](double rotations) {
            return dim * std::log(orig / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
        };
        double low = correction_dim(cfg.yarn_beta_fast);
        double high = correction_dim(cfg.yarn_beta_slow);
        if (cfg.yarn_truncate) {
            low = std::floor(low);
            high = std::ceil(high);
        }
        low = std::max(low, 0.0);
        high = std::min(high, dim - 1);
        if (low == high) high += 0.001;
        for (uint32_t i = 0; i < half; ++i) {
            const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
            const double extrapolation = 1.0 - ramp;  // weight of the original frequency
            const double f = 1.0 / std::pow(base, 2.0 * i / dim);
            t.inv_freq[i] = static_cast<float>(f / factor * (1.0 - extrapolation) + f * extrapolation);
        }
        t.attn_factor = static_cast<float>(0.1 * std::log(factor) + 1.0);
    }
    if (cfg.linear_factor != 1.0f && cfg.linear_factor > 0.0f)
        for (auto& f : t.inv_freq) f /= cfg.linear_factor;
    if (!cfg.freq_factors.empty())
        for (uint32_t i = 0; i < half && i < cfg.freq_factors.size(); ++i) t.inv_freq[i] /= cfg.freq_factors[i];
    return t;
}

void rope_cos_sin(const RopeTables& t, int64_t pos, float* cos_out, float* sin_out) {
    const uint32_t half = t.n_rot / 2;
    for (uint32_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos) * t.inv_freq[i];
        cos_out[i] = std::cos(angle) * t.attn_factor;
        sin_out[i] = std::sin(angle) * t.attn_factor;
    }
}

void mrope_cos_sin(const RopeTables& t, const ehp::mrope::Sections& sections, const ehp::mrope::Position& pos,
                   float* cos_out, float* sin_out) {
    const uint32_t half = t.n_rot / 2;
    for (uint32_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos[sections.component(i)]) * t.inv_freq[i];
        cos_out[i] = std::cos(angle) * t.attn_factor;
        sin_out[i] = std::sin(angle) * t.attn_factor;
    }
}

void rope_apply(const RopeTables& t, const float* c, const float* s, float* head) {
    const uint32_t half = t.n_rot / 2;
    if (t.style == RopeStyle::Normal) {
        for (uint32_t i = 0; i < half; ++i) {
            const float a = head[2 * i], b = head[2 * i + 1];
            head[2 * i] = a * c[i] - b * s[i];
            head[2 * i + 1] = b * c[i] + a * s[i];
        }
    } else if (t.style == RopeStyle::Neox) {
        for (uint32_t i = 0; i < half; ++i) {
            const float a = head[i], b = head[i + half];
            head[i] = a * c[i] - b * s[i];
            head[i + half] = b * c[i] + a * s[i];
        }
    }
}

int64_t window_start(int64_t pos, uint32_t window) {
    if (window == 0) return 0;
    return std::max<int64_t>(0, pos - static_cast<int64_t>(window) + 1);
}

void attend_rows(const float* q, const float* const* k_rows, const float* const* v_rows, size_t n,
                 size_t head_dim, float scale, const float* sink, float* scores, float* out) {
    float m = sink ? *sink : -INFINITY;
    for (size_t j = 0; j < n; ++j) {
        const float* kj = k_rows[j];
        float d = 0.0f;
        for (size_t i = 0; i < head_dim; ++i) d += q[i] * kj[i];
        scores[j] = d * scale;
        m = std::max(m, scores[j]);
    }
    double denom = sink ? std::exp(static_cast<double>(*sink - m)) : 0.0;
    for (size_t j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - m);
        denom += scores[j];
    }
    const float inv = static_cast<float>(1.0 / denom);
    for (size_t i = 0; i < head_dim; ++i) out[i] = 0.0f;
    for (size_t j = 0; j < n; ++j) {
        const float p = scores[j] * inv;
        const float* vj = v_rows[j];
        for (size_t i = 0; i < head_dim; ++i) out[i] += p * vj[i];
    }
}

void attend_one(const float* q, const float* k, const float* v, size_t stride, size_t head_dim,
                int64_t first, int64_t last, float scale, const float* sink,
                float* scores, float* out) {
    const size_t n = static_cast<size_t>(last - first + 1);
    std::vector<const float*> k_rows(n), v_rows(n);
    for (size_t j = 0; j < n; ++j) {
        const size_t row = static_cast<size_t>(first + static_cast<int64_t>(j)) * stride;
        k_rows[j] = k + row;
        v_rows[j] = v + row;
    }
    attend_rows(q, k_rows.data(), v_rows.data(), n, head_dim, scale, sink, scores, out);
}

std::vector<std::pair<int, float>> route_top_k(const float* logits, int n_expert, int k) {
    std::vector<int> idx(static_cast<size_t>(n_expert));
    std::iota(idx.begin(), idx.end(), 0);
    k = std::min(k, n_expert);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    std::vector<float> w(static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) w[static_cast<size_t>(i)] = logits[idx[static_cast<size_t>(i)]];
    softmax(w.data(), w.size());
    std::vector<std::pair<int, float>> out;
    for (int i = 0; i < k; ++i) out.emplace_back(idx[static_cast<size_t>(i)], w[static_cast<size_t>(i)]);
    return out;
}

}  // namespace cpuref
