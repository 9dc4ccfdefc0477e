// How far a plugin's logits are from the reference's: the largest
// difference relative to the reference's largest |logit|, the top-1 token
// kept (or tied within a tolerance), the log-probability of the
// reference's top token.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace ehtest {

// max |a - b| over max |b| (b the reference); 1e9 when the sizes differ.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double mx = 1e-6, e = 0;
    for (size_t i = 0; i < b.size() && i < a.size(); ++i) {
        mx = std::max(mx, double(std::fabs(b[i])));
        e = std::max(e, double(std::fabs(a[i] - b[i])));
    }
    return a.size() == b.size() ? e / mx : 1e9;
}
inline size_t argmax(const std::vector<float>& v) { return size_t(std::max_element(v.begin(), v.end()) - v.begin()); }
// The token `got` picks is the reference's best or within tol of ref's
// largest |logit| of it (a near tie may go either way under FP16 keys and
// values).
inline bool top1_ok(const std::vector<float>& got, const std::vector<float>& ref, double tol) {
    double mx = 1e-6;
    for (float v : ref) mx = std::max(mx, double(std::fabs(v)));
    return ref[argmax(ref)] - ref[argmax(got)] <= tol * mx;
}
// log-softmax of v at k
inline double logprob(const std::vector<float>& v, size_t k) {
    const double m = v[argmax(v)];
    double s = 0;
    for (float x : v) s += std::exp(double(x) - m);
    return double(v[k]) - m - std::log(s);
}

// Over teacher-forced positions: how many, how many keep the top-1 (within
// 1e-2), the worst rel_err and |delta logprob| of the reference's top token.
struct Agreement {
    size_t n = 0, top1 = 0;
    double max_rel = 0, max_dlp = 0;
};
inline Agreement agree(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& ref) {
    Agreement a;
    for (size_t p = 0; p < ref.size() && p < got.size(); ++p) {
        if (got[p].empty() || got[p].size() != ref[p].size()) {
            ADD_FAILURE() << "position " << p << ": " << got[p].size() << " logits against the reference's "
                          << ref[p].size();
            continue;
        }
        ++a.n;
        const size_t k = argmax(ref[p]);
        a.top1 += top1_ok(got[p], ref[p], 1e-2);
        a.max_rel = std::max(a.max_rel, rel_err(got[p], ref[p]));
        a.max_dlp = std::max(a.max_dlp, std::fabs(logprob(got[p], k) - logprob(ref[p], k)));
    }
    return a;
}

}  // namespace ehtest
