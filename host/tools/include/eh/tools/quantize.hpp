// `engine-host quantize`: rewrites a GGUF file with its matrices in another
// type (a plain type such as Q8_0, or the Q4_K_M / MXFP4_MOE mixtures of
// recipe.hpp). Metadata is copied; general.file_type is updated. Sources
// in F32/F16/BF16 are converted; an already quantized tensor is
// dequantized first (requantizing loses precision twice, as in llama.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "eh/tools/recipe.hpp"

namespace eh::tools {

struct QuantizeOptions {
    std::string in, out;
    QuantTarget target;
    unsigned threads = 0;
    std::function<void(const std::string&)> log;
};

struct QuantizeResult {
    uint64_t n_tensors = 0;
    uint64_t in_bytes = 0, out_bytes = 0;
    std::map<std::string, int> census;
};

QuantizeResult quantize_file(const QuantizeOptions& options);

}  // namespace eh::tools
