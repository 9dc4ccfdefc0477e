// `engine-host convert --hf DIR`: a Hugging Face model directory
// (config.json, tokenizer.json, *.safetensors) to a GGUF file with the
// tensor names, metadata keys and tokenizer keys llama.cpp's converter
// writes. Supported: llama (with the Q/K row permutation GGUF expects),
// qwen2, phi3, gpt2 (Conv1D weights transposed; output.weight written as a
// copy of the tied embedding). Weights are converted to F16 by default or
// to any QuantTarget (Q4_K_M applies the recipe of recipe.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "eh/tools/recipe.hpp"

namespace eh::tools {

struct ConvertOptions {
    std::string hf_dir, out;
    QuantTarget target{Recipe::Plain, 1 /* F16 */};
    unsigned threads = 0;
    std::function<void(const std::string&)> log;
};

struct ConvertResult {
    std::string architecture;
    uint64_t n_tensors = 0, out_bytes = 0;
    std::map<std::string, int> census;
};

ConvertResult convert_hf(const ConvertOptions& options);

}  // namespace eh::tools
