// Double-precision building blocks of the independent reference passes the
// image and decoder tests compare the plugin with (written from the
// transformers definitions, not from the plugin's code).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace cpuref_test::dref {

using V = std::vector<double>;

// m (rows of x.size() floats) times x, plus b when given.
inline V linear(const std::vector<float>& m, const std::vector<float>* b, const V& x, size_t rows) {
    V y(rows);
    for (size_t r = 0; r < rows; ++r) {
        double s = b ? (*b)[r] : 0.0;
        for (size_t c = 0; c < x.size(); ++c) s += double(m[r * x.size() + c]) * x[c];
        y[r] = s;
    }
    return y;
}

// x / rms(x) * g.
inline V rms_norm(const V& x, const std::vector<float>& g, double eps) {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
    V y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * g[i];
    return y;
}

// One head's softmax(q . k_j / sqrt(hd)) v_j over keys j in [lo, hi), added
// into out[oo ..]: q at q[qo ..], key and value j at k[j][ko ..], v[j][ko ..].
inline void attend(const V& q, size_t qo, const std::vector<V>& k, const std::vector<V>& v, size_t ko, size_t lo,
                   size_t hi, size_t hd, V& out, size_t oo) {
    V s(hi - lo);
    double mx = -1e300, sum = 0;
    for (size_t j = lo; j < hi; ++j) {
        double d = 0;
        for (size_t t = 0; t < hd; ++t) d += q[qo + t] * k[j][ko + t];
        mx = std::max(mx, s[j - lo] = d / std::sqrt(double(hd)));
    }
    for (double& e : s) sum += (e = std::exp(e - mx));
    for (size_t j = lo; j < hi; ++j)
        for (size_t t = 0; t < hd; ++t) out[oo + t] += s[j - lo] / sum * v[j][ko + t];
}

}  // namespace cpuref_test::dref
