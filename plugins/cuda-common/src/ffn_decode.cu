// gate_up_swiglu (kernels.hpp) and gate_up_geglu (gemma_ops.hpp): a dense
// FFN's gate and up for one token as gate_up_pair_kernel with a single
// "expert", combined by SwiGLU or by Gemma's GeLU(tanh) gate.
#include "ehcuda/check.hpp"
#include "ehcuda/gemma_ops.hpp"
#include "ehcuda/kernels.hpp"
#include "gate_up_pair.cuh"

namespace ehcuda {
namespace {

// gelu_tanh(gate) * up, as gemma_ops.cu's geglu_tanh (and cpu-reference).
struct GeGluTanh {
    __device__ float operator()(float g, float u) const {
        const float c = 0.7978845608028654f;  // sqrt(2/pi)
        return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * u;
    }
};

moe_detail::DevMat dense_mat(const MatSeg& s) {
    moe_detail::DevMat m{};
    m.data = static_cast<const uint8_t*>(s.w.data);
    m.row_bytes = s.w.row_bytes;
    m.bias = s.bias;
    m.rows = s.w.rows;
    m.cols = s.w.cols;
    return m;
}

GemvShape shape_of(const WeightRef& a, const WeightRef* b = nullptr) {
    GemvShape g;
    g.nseg = b ? 2 : 1;
    g.type[0] = a.type;
    g.rows[0] = a.rows;
    g.row_bytes[0] = a.row_bytes;
    if (b) {
        g.type[1] = b->type;
        g.rows[1] = b->rows;
        g.row_bytes[1] = b->row_bytes;
    }
    g.cols = a.cols;
    return g;
}

// Gate and up as gate_up_pair_kernel takes them (kernel_route.cpp,
// can_implement_pair), uploaded.
bool pair_supported(const WeightRef& gate, const WeightRef& up) {
    return gate.data && up.data && gate.cols == up.cols && !can_implement_pair(plan(), shape_of(gate, &up));
}

}  // namespace

bool gate_up_swiglu_supported(const WeightRef& gate, const WeightRef& up, const WeightRef& down) {
    const GemvShape d = shape_of(down);
    return gate.data && up.data && gate.cols == up.cols && !can_implement_pair(plan(), shape_of(gate, &up), &d);
}

namespace {

// Rows of gate and of up per warp of gate_up_swiglu's kernel.
int pair_rows_per_warp(const KernelPlan& kp, const WeightRef& gate, bool bulk) {
    // Register form: 2 rows of gate and of up per warp, 16 warps: on an
    // H100, Phi-3 decode 418 -> 459 tok/s and Qwen2.5-0.5B 1278 -> 1320
    // against 4 rows x 8 warps (the MoE's shape); 1 row x 32 warps: 1213 and
    // 446. Bulk form: 2 x 16 too where that kernel is compiled for two
    // blocks per multiprocessor (pair_rw2_shares_sm: 32 warps per SM, Phi-3
    // 606-607 -> 615 t/s on one H100), else 4 x 8 (a 16-warp block alone
    // on its multiprocessor: 535 against 562). KernelPlan::pair_rows fixes it.
    if (kp.pair_rows == 2 || kp.pair_rows == 4) return kp.pair_rows;
    const int bits = kp.gemv_input == GemvInput::Int16 ? 16 : 32;
    return bulk && !detail::pair_rw2_shares_sm(gate.type, bits, true) ? 4 : 2;
}

// gate_up_swiglu's (or, with Act GeGluTanh, gate_up_geglu's) launch (the
// caller checked the arguments), or with `warps_per_sm` set the warps per
// multiprocessor it would run at.
template <class Act = detail::SwiGlu>
void run_pair(const GateUpArgs& a, cudaStream_t stream, int* warps_per_sm) {
    detail::DevArgs xa = detail::single_token_input(a.x, a.cols, a.norm_w, a.norm_eps);
    const KernelPlan& kp = plan();
    xa.prefetch = kp.entry_prefetch ? 2 : 0;
    const moe_detail::DevMat g = dense_mat(a.gate), u = dense_mat(a.up);
    uint8_t* out = static_cast<uint8_t*>(a.out);
    const bool bulk = detail::pair_bulk(a.cols);
    const int bits = kp.gemv_input == GemvInput::Int16 ? 16 : 32;
    const int rows_per_warp = pair_rows_per_warp(kp, a.gate.w, bulk);
    auto go = [&]<int Bits>() {
        auto act = Act{};
        if (rows_per_warp == 4)
            detail::launch_gate_up_pair<Bits, 4>(a.gate.w.type, xa, nullptr, g, u, act, out, 1, bulk, stream, {},
                                                 warps_per_sm);
        else detail::launch_gate_up_pair<Bits, 2>(a.gate.w.type, xa, nullptr, g, u, act, out, 1, bulk, stream, {},
                                                  warps_per_sm);
    };
    if (bits == 16) go.template operator()<16>();
    else go.template operator()<32>();
}

}  // namespace

namespace {

void check_pair_args(const GateUpArgs& a) {
    if (!pair_supported(a.gate.w, a.up.w) || a.cols != a.gate.w.cols)
        throw ehp::Error(EH_INTERNAL, "gate_up_swiglu: shapes, types or input form not supported (check gate_up_swiglu_supported)");
    if (!a.x || reinterpret_cast<uintptr_t>(a.x) % 16 || (a.norm_w && reinterpret_cast<uintptr_t>(a.norm_w) % 16))
        throw ehp::Error(EH_INTERNAL, "gate_up_swiglu: input and norm weight must be 16-byte aligned");
    if (!a.out || reinterpret_cast<uintptr_t>(a.out) % 16 || a.out_bytes < gemv_chunk_bytes(a.gate.w.rows))
        throw ehp::Error(EH_INTERNAL, "gate_up_swiglu: output missing, unaligned or smaller than gemv_chunk_bytes(rows)");
}

}  // namespace

void gate_up_swiglu(const GateUpArgs& a, cudaStream_t stream) {
    check_pair_args(a);
    run_pair(a, stream, nullptr);
}

void gate_up_geglu(const GateUpArgs& a, cudaStream_t stream) {
    check_pair_args(a);
    run_pair<GeGluTanh>(a, stream, nullptr);
}

int gate_up_swiglu_warps_per_sm(const WeightRef& gate, const WeightRef& up) {
    if (!pair_supported(gate, up)) return 0;
    GateUpArgs a;
    a.gate.w = gate;
    a.up.w = up;
    a.cols = gate.cols;
    int warps = 0;
    run_pair(a, nullptr, &warps);
    return warps;
}

std::string gate_up_swiglu_describe(const WeightRef& gate, const WeightRef& up) {
    if (!pair_supported(gate, up)) return "not supported (gate|up GEMV, then the down GEMV stages the SwiGLU)";
    const KernelPlan& kp = plan();
    const bool bulk = detail::pair_bulk(gate.cols);
    const int rw = pair_rows_per_warp(kp, gate, bulk);
    return std::string("gate_up_pair_kernel with SwiGLU (") +
           (bulk ? "up to " + std::to_string(detail::pair_slots()) + " slices in flight per warp" : std::string("register form")) +
           ", " + std::to_string(rw) + " rows of gate and up per warp, " + std::to_string(32 / rw) + " warps/block, " +
           gemv_input_name(kp.gemv_input) + " output chunks)";
}

}  // namespace ehcuda
