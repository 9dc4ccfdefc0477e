// Which tensor type each tensor of a model gets, the way llama.cpp's
// converter and `llama-quantize` decide it. The forge, `quantize` and
// `convert` all ask this one place, so a forged Q4_K_M file and a file we
// quantize to Q4_K_M come out with the same per-tensor types.
//
// The rules (docs/forge.md has the resulting census per profile):
//   * Only matrices named "*weight" with two or more dims are quantized;
//     norms, biases, position embeddings, MoE router weights stay F32.
//   * Q4_K_M: Q4_K by default; the output matrix (or the token embedding
//     when there is no output matrix) Q6_K; attn_v and ffn_down Q6_K on
//     "more bits" layers (the first and last eighth and every third layer
//     between); fused attn_qkv Q5_K. A row whose length is not a multiple
//     of the chosen type's block falls back: Q4_K→Q5_0, Q5_K→Q5_1,
//     Q6_K→Q8_0 (the output matrix goes straight to Q8_0), then F16.
//   * MXFP4_MOE: expert stacks (3-D) MXFP4, every other matrix Q8_0.
//   * A plain type T: every quantizable matrix T (F16 when its rows do
//     not split into T's blocks).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace eh::tools {

enum class Recipe {
    Plain,      // one type for every quantizable matrix
    Q4_K_M,
    MXFP4_MOE,
};

struct QuantTarget {
    Recipe recipe = Recipe::Plain;
    uint32_t type = 0;  // eh_tensor_type for Plain
    std::string name() const;
    // general.file_type value (llama_ftype) a file of this target carries.
    uint32_t file_type() const;
};

// Parses "Q4_K_M", "MXFP4_MOE", or a tensor type name ("Q8_0", "F16", "MXFP4").
// Throws eh::Error(InvalidRequest) listing what is accepted.
QuantTarget parse_quant_target(std::string_view s);
// Every accepted spelling, for help text.
std::string quant_target_names();

// Facts about the whole model the rules need.
struct ModelFacts {
    uint32_t n_layer = 0;
    bool has_output = true;  // an output.weight tensor exists (untied head)
};

// True when llama.cpp would quantize this tensor at all.
bool is_quantizable(std::string_view name, std::span<const uint64_t> dims);

// The type the tensor gets. `source_type` is returned for tensors that are
// not quantized.
uint32_t choose_type(const QuantTarget& target, const ModelFacts& facts, std::string_view name,
                     std::span<const uint64_t> dims, uint32_t source_type);

// llama.cpp's "more bits" layers of a Q4_K_M / Q5_K_M file.
bool use_more_bits(int layer, int n_layers);

// Layer index from a "blk.N." name, or -1.
int layer_of(std::string_view name);

}  // namespace eh::tools
