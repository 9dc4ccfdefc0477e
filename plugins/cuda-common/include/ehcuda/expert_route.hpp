// What runs a MoE layer's routed experts in a step of N tokens (moe.hpp's
// kernels, as gpt-cuda's batch.cpp picks them), for the load's log and
// `engine-host inspect --kernels`; and the per-kind route lines of a list
// that mixes dense matrices and experts (model_matrices.hpp's
// gpt_matrices). Host code (eh_cuda_plan): the device's predicates are
// restated here from types and shapes, or passed in by the plugin.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "ehcuda/kernel_plan.hpp"

namespace ehcuda {

// A layer's experts and their router.
struct ExpertLayer {
    uint32_t gate_type = 0, up_type = 0, down_type = 0;
    int n_expert = 0, k = 0;   // experts, and experts a token
    int n_embd = 0, n_ff = 0;  // gate and up: n_ff x n_embd each; down: n_embd x n_ff
    uint32_t router_type = 0;  // ffn_gate_inp: n_expert x n_embd
};

// Which of moe.hpp's forms take these experts.
struct ExpertForms {
    bool decode = false;         // moe_decode (one token): moe_decode_supported
    bool grouped = false;        // moe_grouped: moe_grouped_supported
    bool tensor_cores = false;   // its passes on the tensor cores: moe_grouped_on_tensor_cores
    bool router_kernel = false;  // one token's router through moe_router_decode (gpt-cuda's router_decode)
};

// The forms from the types and shapes alone, as the predicates above
// decide them for a loader's aligned rows (gpt-cuda's arena).
ExpertForms expert_forms(const KernelPlan& p, const ExpertLayer& e);

// The grouped form a call of `ntok` tokens takes (moe_grouped.cu): the tile
// form when its pairs (ntok * k) average moe_tile_pass_tokens or more an
// expert, else the tensor-core passes where the experts have them, else
// the integer form.
enum class GroupedForm : uint8_t { Tiles, TensorCores, Integer };
GroupedForm grouped_form(const KernelPlan& p, const ExpertLayer& e, const ExpertForms& f, int ntok);
// Whether `pairs` (token, expert) pairs over n_expert experts average
// enough an expert for the tile form: moe_grouped.cu decides by it (for
// experts the tiles take), grouped_form above too.
bool tile_form_by_average(const KernelPlan& p, long pairs, int n_expert);
// Tokens per pass of the tensor-core form; moe_grouped_mma.cu's launch_rows
// runs the passes this says: 8 (MXFP4: moe_decode_pass_tokens), or wider
// past moe_wide_pass_tokens an expert on average (32 for MXFP4, 48 for the
// K-quants), 64 for MXFP4's gate|up past moe_long_pass_tokens.
int tensor_core_pass_tokens(const KernelPlan& p, uint32_t type, bool gate_up, int pairs, int n_expert);
// The pass widths launch_rows has kernels for (it instantiates exactly
// these and refuses any other): every value tensor_core_pass_tokens gives
// must be one (expert_route_test checks it over the plan's range).
constexpr bool tensor_core_pass_kernel(uint32_t type, bool gate_up, int tokens) {
    if (type == EH_TYPE_MXFP4) return tokens == 8 || tokens == 16 || tokens == 32 || (gate_up && tokens == 64);
    if (type == EH_TYPE_Q4_K || type == EH_TYPE_Q6_K) return tokens == 8 || tokens == 48;
    return false;
}

// One line's text (after "kind xN: ") for the experts' gate|up or down in
// a step of `ntok` tokens: the shape, then what runs it.
std::string describe_expert_step(const KernelPlan& p, const ExpertLayer& e, const ExpertForms& f, bool gate_up,
                                 int ntok);

// One matrix kind of a model's step: a dense matmul (route_step_matmul's
// route; its `kernel` at one token as MatrixKind's), or, experts.k > 0, a
// layer's experts (`mat.kind` names them, gate_up says which half).
struct StepMatrix {
    MatrixKind mat;
    ExpertLayer experts;
    ExpertForms forms;
    bool gate_up = false;
};

// route_lines for such a list: one line per kind and distinct route, in
// first-seen order, with the number of matrices it covers.
std::vector<std::string> step_route_lines(const KernelPlan& p, const DeviceTraits& dev,
                                          const std::vector<StepMatrix>& mats, int ntok, bool mirrored);

}  // namespace ehcuda
