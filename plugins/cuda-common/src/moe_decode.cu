// Single-token MoE (decode), see moe_decode in moe.hpp. Two kernels:
//
//   gate|up: gate_up_pair_kernel (gate_up_pair.cuh), block (32-row chunk,
//            slot), int16x2 input with the pre-norm folded in; the
//            activations go back to memory already in the int16x2 chunk
//            layout, so the down kernel needs no staging of its own.
//   down:    block (R output rows) of W warps, warp w takes slots w,
//            w+W, ...; the slots' partial sums are combined in rank order
//            in shared memory (no atomics: reproducible) and added to h.
//            A slot whose id is negative (a pair expert parallelism routed
//            to another rank, moe_expert_range.hpp) is skipped by both:
//            no rows read, no term added.
//            Eight or more slots (Qwen3-MoE): 8 warps, one slot each, and
//            R = moe_down_rows (8: each lane's input chunk serves 8 rows);
//            fewer (gpt-oss): 4 warps of 4 rows.
//
// Integer dot products (quant_dp4a.cuh) with the int16x2 input form are
// ~2^-24 of the chunk's largest input from exact, so the experts'
// outputs, and the routing of the layers after them, match the float
// kernels of moe.cu; those stay for batches and for float expert types.
#include <algorithm>

#include "ehcuda/check.hpp"
#include "ehcuda/kernel_plan.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/moe.hpp"
#include "gate_up_pair.cuh"

namespace ehcuda {
namespace {

using detail::kIntStride;
using moe_detail::bias_of;
using moe_detail::DevMat;
using moe_detail::row_ptr;
using moe_detail::to_dev;

constexpr int kMaxSlots = 32;  // expert_used_count bound (moe_route's)
constexpr int kChunkBytes = kIntStride<32>;

// Blocks per multiprocessor each shape is compiled for (its register
// bound): enough that the grid of a 2048-row down projection is resident
// at once (256 blocks of 8 rows, 512 of 4).
template <int W, int R>
constexpr int down_min_blocks() {
    return W == 4 ? 6 : R == 8 ? 2 : 4;
}

template <int T, int W, int R>
__global__ void __launch_bounds__(W * 32, down_min_blocks<W, R>()) down_decode_kernel(const uint8_t* act_q, int k,
                                                                                    const int32_t* ids, const float* wts,
                                                                                    DevMat d, float* h) {
    pdl_entry();
    __shared__ float part[kMaxSlots][R];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * R;
    const int nr = min(R, d.rows - r0);
    const int nch = d.cols / 32;
    for (int s = warp; s < k; s += W) {
        const int e = ids[s];
        if (e < 0) continue;  // (a pair routed away from this rank: no rows, no term)
        const uint8_t* xq = act_q + size_t(s) * nch * kChunkBytes;
        const uint8_t* w = row_ptr(d, e, r0);
        float acc[R] = {};
        for (int c = lane; c < nch; c += 32) {
            XInt16x2 x;
            detail::load_staged_int<32>(xq, c, x);
#pragma unroll
            for (int i = 0; i < R; ++i)
                if (i < nr) acc[i] += dot_chunk_int<T>(w + size_t(i) * d.row_bytes, c, x);
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const float v = detail::warp_sum(acc[i]);
            if (lane == 0 && i < nr) part[s][i] = v + bias_of(d, e, r0 + i);
        }
    }
    __syncthreads();
    if (threadIdx.x < nr) {
        float sum = 0.0f;
        for (int s = 0; s < k; ++s)
            if (ids[s] >= 0) sum = fmaf(wts[s], part[s][threadIdx.x], sum);
        h[r0 + threadIdx.x] += sum;
    }
}

}  // namespace

size_t moe_decode_scratch_bytes(int k, int n_ff) { return size_t(std::max(k, 0)) * size_t(std::max(n_ff, 0) / 32) * kChunkBytes; }

bool moe_decode_supported(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, int k) {
    return k >= 1 && k <= kMaxSlots && gate.type == up.type && detail::int_type(gate.type) && detail::int_type(down.type) &&
           gate.rows == up.rows && gate.cols == up.cols && gate.rows % 32 == 0 && down.cols == gate.rows &&
           gate.cols % 32 == 0 && down.rows > 0;
}

void moe_decode(const MoeDecodeArgs& a, cudaStream_t stream) {
    if (!moe_decode_supported(a.gate, a.up, a.down, a.k))
        throw ehp::Error(EH_INTERNAL, "moe decode: expert shapes or types not supported (check moe_decode_supported)");
    const bool fused = a.logits != nullptr;
    if (fused && (!a.route_ids || !a.route_weights || a.n_expert < a.k || a.n_expert > kMaxRouteExperts))
        throw ehp::Error(EH_INTERNAL, "moe decode: routing needs route_ids, route_weights and k <= n_expert <= 1024");
    if (!a.x || (!fused && (!a.ids || !a.weights)) || !a.h || !a.scratch ||
        a.scratch_bytes < moe_decode_scratch_bytes(a.k, a.gate.rows))
        throw ehp::Error(EH_INTERNAL, "moe decode: missing buffer or scratch too small");
    const int32_t* ids = fused ? a.route_ids : a.ids;
    const float* weights = fused ? a.route_weights : a.weights;
    FusedRoute route;
    if (fused) route = FusedRoute{a.logits, a.n_expert, a.k, a.route_ids, a.route_weights};
    const DevMat g = to_dev(a.gate, "moe gate"), u = to_dev(a.up, "moe up"), d = to_dev(a.down, "moe down");
    if (d.cols != g.rows || reinterpret_cast<uintptr_t>(a.x) % 16 || (a.norm_w && reinterpret_cast<uintptr_t>(a.norm_w) % 16))
        throw ehp::Error(EH_INTERNAL, "moe decode: down's columns must be gate's rows; input 16-byte aligned");
    const detail::DevArgs xa = detail::single_token_input(a.x, g.cols, a.norm_w, a.norm_eps);
    uint8_t* act_q = static_cast<uint8_t*>(a.scratch);
    // 4 rows of gate and up per warp (8 warps a block) unless the plan's
    // pair_rows says 2 (16 warps)
    const auto act = detail::ExpertSwiGlu{a.alpha, a.limit};
    if (plan().pair_rows == 2)
        detail::launch_gate_up_pair<32, 2>(a.gate.type, xa, fused ? nullptr : a.ids, g, u, act, act_q, a.k, false, stream, route);
    else
        detail::launch_gate_up_pair<32, 4>(a.gate.type, xa, fused ? nullptr : a.ids, g, u, act, act_q, a.k, false, stream, route);
    detail::int_type_dispatch(a.down.type, [&]<int T>() {
        auto go = [&]<int W, int R>() {
            launch("moe down_decode_kernel", down_decode_kernel<T, W, R>, unsigned((d.rows + R - 1) / R), W * 32, 0,
                   stream, static_cast<const uint8_t*>(act_q), a.k, ids, weights, d, a.h);
        };
        if (a.k < 8) go.template operator()<4, 4>();
        else if (plan().moe_down_rows == 4) go.template operator()<8, 4>();
        else go.template operator()<8, 8>();
    });
    EHC_LAUNCHED("down_decode_kernel");
}

}  // namespace ehcuda
