// What runs a step's routed experts (expert_route.hpp). The grouped
// forms' thresholds (tile_form_by_average, tensor_core_pass_tokens) are
// the kernels' own: moe_grouped.cu and moe_grouped_mma.cu's launch_rows
// call them. The rest is restated from the kernels' choices: moe_decode.cu
// (one token), the forms' predicates, gpt-cuda's batch.cpp (when each is
// used).
#include "ehcuda/expert_route.hpp"

#include <algorithm>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/kernel_route.hpp"

namespace ehcuda {

namespace {

// moe_route's and moe_decode's bounds.
constexpr int kMaxSlots = 32;
constexpr int kMaxRouteExperts = 1024;

// moe_grouped_mma.cu's tensor-core types, and whether a matrix of `cols`
// inputs has whole segments for them (256 values; MXFP4 32).
bool mma_type(uint32_t t) { return t == EH_TYPE_MXFP4 || t == EH_TYPE_Q4_K || t == EH_TYPE_Q6_K; }
bool mma_cols(uint32_t t, int cols) { return mma_type(t) && cols % (t == EH_TYPE_MXFP4 ? 32 : 256) == 0; }

std::string count(int n, const char* one, const char* many) { return std::to_string(n) + " " + (n == 1 ? one : many); }

// "8", "2.5": pairs an expert on average.
std::string average(long pairs, int n_expert) {
    const long tenths = (pairs * 10 + n_expert / 2) / n_expert;
    std::string s = std::to_string(tenths / 10);
    if (tenths % 10) s += '.', s += char('0' + tenths % 10);
    return s;
}

// The grouped form's kernels for one call of `ntok` tokens.
std::string grouped_text(const KernelPlan& p, const ExpertLayer& e, const ExpertForms& f, bool gate_up, int ntok) {
    const long pairs = long(ntok) * e.k;
    std::string s = std::to_string(ntok) + " x top-" + std::to_string(e.k) + " = " + count(int(pairs), "pair", "pairs") +
                    ", " + average(pairs, e.n_expert) + " an expert if spread evenly (the form follows that average): ";
    switch (grouped_form(p, e, f, ntok)) {
    case GroupedForm::Tiles:
        s += "tile form (tile_kernel: 128 rows x 128 pairs of one expert a block, the weights decoded once a block, "
             "FP16 inputs, tensor cores)";
        break;
    case GroupedForm::TensorCores:
        s += "tensor-core passes of " +
             std::to_string(tensor_core_pass_tokens(p, gate_up ? e.gate_type : e.down_type, gate_up, int(pairs),
                                                    e.n_expert)) +
             " tokens an expert (mma_rows_kernel, FP16 inputs)";
        break;
    case GroupedForm::Integer:
        s += "integer form (grouped_rows_kernel: each weight chunk dotted with 8 tokens at a time, int16x2 input)";
        break;
    }
    return s;
}

}  // namespace

ExpertForms expert_forms(const KernelPlan& p, const ExpertLayer& e) {
    ExpertForms f;
    // moe_decode_supported: gate and up of one integer-path type, down too,
    // rows of whole warps, inputs of whole chunks, at most 32 a token
    f.decode = e.k >= 1 && e.k <= kMaxSlots && e.gate_type == e.up_type && int_input_type(e.gate_type) &&
               int_input_type(e.down_type) && e.n_ff > 0 && e.n_ff % 32 == 0 && e.n_embd > 0 && e.n_embd % 32 == 0;
    // moe_grouped_supported: the same, down mapping back to gate's inputs
    // (so by construction here)
    f.grouped = f.decode;
    // mma_experts: MXFP4, Q4_K or Q6_K throughout, gate and up of one type
    f.tensor_cores = e.gate_type == e.up_type && mma_cols(e.gate_type, e.n_embd) && mma_cols(e.down_type, e.n_ff);
    // gpt-cuda's router_decode: an F32 router that moe_router_decode takes
    f.router_kernel = p.moe_router_kernel && e.router_type == EH_TYPE_F32 && e.n_expert >= 1 &&
                      e.n_expert <= kMaxRouteExperts && e.k >= 1 && e.k <= 32 && e.k <= e.n_expert && e.n_embd > 0 &&
                      e.n_embd % 4 == 0;
    return f;
}

bool tile_form_by_average(const KernelPlan& p, long pairs, int n_expert) {
    return pairs >= long(p.moe_tile_pass_tokens) * n_expert;
}

GroupedForm grouped_form(const KernelPlan& p, const ExpertLayer& e, const ExpertForms& f, int ntok) {
    // (tile_experts: at most 1024 experts, types the MoE kernels decode,
    // which the grouped form's already are)
    if (e.n_expert <= kMaxRouteExperts && tile_form_by_average(p, long(ntok) * e.k, e.n_expert))
        return GroupedForm::Tiles;
    return f.tensor_cores ? GroupedForm::TensorCores : GroupedForm::Integer;
}

// ntok tokens routed k ways over n_expert experts average pairs / n_expert
// = ntok * k / n_expert each. (MXFP4's down products keep 32-token passes
// past moe_long_pass_tokens: two 16-warp blocks of those fit a
// multiprocessor where one 8-warp block of the 64-token pass does.)
int tensor_core_pass_tokens(const KernelPlan& p, uint32_t type, bool gate_up, int pairs, int n_expert) {
    const int per_expert = pairs / std::max(n_expert, 1);
    if (gate_up && type == EH_TYPE_MXFP4 && per_expert > p.moe_long_pass_tokens) return 64;
    if (per_expert > p.moe_wide_pass_tokens) return type == EH_TYPE_MXFP4 ? 32 : 48;
    return type == EH_TYPE_MXFP4 ? p.moe_decode_pass_tokens : 8;
}

std::string describe_expert_step(const KernelPlan& p, const ExpertLayer& e, const ExpertForms& f, bool gate_up,
                                 int ntok) {
    GemvShape g;
    g.nseg = gate_up ? 2 : 1;
    g.type[0] = gate_up ? e.gate_type : e.down_type;
    g.type[1] = e.up_type;
    g.rows[0] = g.rows[1] = gate_up ? e.n_ff : e.n_embd;
    g.cols = gate_up ? e.n_embd : e.n_ff;
    std::string s = shape_text(g) + " an expert, " + std::to_string(e.n_expert) + " experts, top-" +
                    std::to_string(e.k) + ": ";
    if (ntok == 1 && f.decode) {
        // moe_decode.cu: gate|up as the FFN pair kernel's register form over
        // the slots, down a slot per warp
        if (gate_up) {
            const int rw = p.pair_rows == 2 ? 2 : 4;
            return s + "moe_decode: gate_up_pair_kernel over the routed experts (register form, " +
                   std::to_string(32 / rw) + " warps of " + std::to_string(rw) +
                   " rows of gate and of up, int16x2 input, the pre-norm inside)" +
                   (p.moe_fused_route    ? ", routing fused into it"
                    : f.router_kernel ? ", routed first by router_decode_kernel (router GEMV + top-k)"
                                      : ", route_kernel first");
        }
        const int w = e.k < 8 ? 4 : 8, r = e.k < 8 ? 4 : p.moe_down_rows == 4 ? 4 : 8;
        return s + "moe_decode: down_decode_kernel (" + std::to_string(r) + " rows a block, its " + std::to_string(w) +
               " warps sharing the slots), input chunks from the gate|up kernel";
    }
    const int max = p.batch_moe_grouped_max;
    if (ntok >= 2 && f.grouped && max >= 2) {
        // batch.cpp: calls of at most batch_moe_grouped_max tokens
        s += "moe_grouped";
        if (gate_up) s += " after route_kernel (top-k)";
        s += ": ";
        if (ntok <= max) return s + grouped_text(p, e, f, gate_up, ntok);
        s += "calls of " + std::to_string(max) + " tokens: " + grouped_text(p, e, f, gate_up, max);
        if (ntok % max) s += "; and the last call " + grouped_text(p, e, f, gate_up, ntok % max);
        return s;
    }
    // batch.cpp's fallback for experts the grouped kernels do not take
    return s + (ntok >= 2 ? "moe_prefill (cuBLAS on experts converted to FP16, calls of 512 tokens) from " +
                                std::to_string(p.prefill_min_tokens) +
                                " tokens when the step is not captured in a graph, else "
                          : std::string()) +
           (gate_up ? "moe_gate_up (float kernels, a block per pair)" : "moe_down (float kernels, a block per pair)");
}

std::vector<std::string> step_route_lines(const KernelPlan& p, const DeviceTraits& dev,
                                          const std::vector<StepMatrix>& mats, int ntok, bool mirrored) {
    std::vector<std::pair<std::string, std::string>> items;
    for (const StepMatrix& m : mats) {
        if (m.experts.k > 0)
            items.emplace_back(m.mat.kind, describe_expert_step(p, m.experts, m.forms, m.gate_up, ntok));
        else  // route_lines' text for this one matrix, less its "kind x1: "
            items.emplace_back(m.mat.kind,
                               route_lines(p, dev, {m.mat}, ntok, mirrored).at(0).substr(m.mat.kind.size() + 5));
    }
    return count_kinds(items);
}

}  // namespace ehcuda
