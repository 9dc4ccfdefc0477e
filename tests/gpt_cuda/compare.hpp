// Logit comparisons and the test models the gpt-cuda tests share.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <eh/tools/forge.hpp>

namespace gpttest {

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
// got's top token is ref's, or ties with it within tol of ref's largest |logit|.
inline bool top1_ok(const std::vector<float>& got, const std::vector<float>& ref, double tol) {
    double mx = 1e-6;
    for (float v : ref) mx = std::max(mx, double(std::fabs(v)));
    return ref[argmax(ref)] - ref[argmax(got)] <= tol * mx;
}

// Forged tiny models ("tiny-..." profiles), made once per process in a temp dir.
inline std::string forged(const std::string& profile) {
    namespace fs = std::filesystem;
    static const fs::path dir = fs::temp_directory_path() / ("gpt_cuda_test_" + std::to_string(::getpid()));
    const fs::path out = dir / (profile + ".gguf");
    if (!fs::exists(out)) {
        fs::create_directories(dir);
        eh::tools::ForgeOptions o;
        o.profile = profile;
        o.out = out.string();
        o.seed = 11;
        o.vocab = "none";
        eh::tools::forge(o);
    }
    return out.string();
}

// A forged tiny profile, or a transformers-checked file in tests/reference/data.
inline std::string model_path(const std::string& name) {
    if (name.rfind("tiny-", 0) == 0) return forged(name);
    return std::string(GPT_REFERENCE_DIR) + "/" + name + "/model.gguf";
}

}  // namespace gpttest
