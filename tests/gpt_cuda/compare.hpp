// Logit comparisons and the test models the gpt-cuda tests share.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <eh/tools/forge.hpp>

#include "../cuda/logit_compare.hpp"

namespace gpttest {

// rel_err (max |a - b| over max |b|, 1e9 when the sizes differ), argmax,
// top1_ok: the llama-cuda tests' (tests/cuda/logit_compare.hpp).
using ehtest::argmax;
using ehtest::rel_err;
using ehtest::top1_ok;

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
