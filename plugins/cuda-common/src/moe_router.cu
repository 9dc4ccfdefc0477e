// One token's MoE router at decode, see moe_router_decode in moe.hpp: the
// router GEMV over the RMS-normalized input and the top-k selection of
// moe_route in one kernel.
//
// Block e computes logit e: its 4 warps split the row, each thread's share
// of the row loaded into registers before pdl_entry() (weights are never
// written), the input and the norm's sum of squares after it. The last
// block to finish (a counter, as the split attention merges) ranks the
// logits with route_warp, so the ids and weights are moe_route's for
// these logits, and resets the counter for the next launch. Without ids
// (the expert kernel routes for itself) the logits are all it writes.
//
// Why not the GEMV + route_kernel: a 128 x 2048 F32 router is 1 MB, read
// by 32 four-warp blocks (one row per warp) it left most multiprocessors
// idle, and the routing was a launch of its own; one row per block spreads
// the row over the whole GPU.
#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/moe.hpp"
#include "moe_common.cuh"

namespace ehcuda {
namespace {

constexpr int kRouterThreads = 128;
constexpr int kRouterLoads = 4;  // float4s of the row per thread held in registers (cols <= 2048); more in a loop

__global__ void __launch_bounds__(kRouterThreads) router_decode_kernel(MoeRouterArgs a) {
    __shared__ float red[32];
    __shared__ bool last;
    __shared__ float logits[kMaxRouteExperts];
    const int e = blockIdx.x, n4 = a.cols / 4;
    const float4* w4 = reinterpret_cast<const float4*>(a.w + size_t(e) * a.cols);
    float4 wr[kRouterLoads];
#pragma unroll
    for (int j = 0; j < kRouterLoads; ++j) {
        const int i = threadIdx.x + j * kRouterThreads;
        wr[j] = i < n4 ? w4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    pdl_entry();
    pdl_release();
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    const float4* g4 = reinterpret_cast<const float4*>(a.norm_w);
    // dot(w, x * g) and sum(x^2): the norm's scale comes last
    float dot = 0.0f, ss = 0.0f;
    auto add = [&](const float4& w, int i) {
        const float4 x = x4[i], g = g4[i];
        ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss))));
        dot = fmaf(w.x, x.x * g.x, fmaf(w.y, x.y * g.y, fmaf(w.z, x.z * g.z, fmaf(w.w, x.w * g.w, dot))));
    };
#pragma unroll
    for (int j = 0; j < kRouterLoads; ++j) {
        const int i = threadIdx.x + j * kRouterThreads;
        if (i < n4) add(wr[j], i);
    }
    for (int i = threadIdx.x + kRouterLoads * kRouterThreads; i < n4; i += kRouterThreads) add(w4[i], i);
    dot = detail::block_sum(dot, red);
    ss = detail::block_sum(ss, red);
    if (threadIdx.x == 0) {
        const float inv = rsqrtf(ss / float(a.cols) + a.norm_eps);
        a.logits[e] = dot * inv + (a.bias ? a.bias[e] : 0.0f);
        if (!a.ids) return;  // (uniform: the block's other threads leave below)
        __threadfence();
        last = atomicAdd(a.counter, 1) == a.n_expert - 1;
        if (last) *a.counter = 0;  // every block of this launch has counted
    }
    if (!a.ids) return;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = threadIdx.x; i < a.n_expert; i += kRouterThreads) logits[i] = __ldcg(a.logits + i);
    __syncthreads();
    if (threadIdx.x < 32) {
        int id;
        float wt;
        route_warp(logits, a.n_expert, a.k, threadIdx.x, id, wt);
        if (int(threadIdx.x) < a.k) {
            a.ids[threadIdx.x] = id;
            a.weights[threadIdx.x] = wt;
        }
    }
}

}  // namespace

bool moe_router_decode_supported(uint32_t type, int n_expert, int cols, int k) {
    return type == EH_TYPE_F32 && n_expert >= 1 && n_expert <= kMaxRouteExperts && k >= 1 && k <= 32 && k <= n_expert &&
           cols > 0 && cols % 4 == 0;
}

void moe_router_decode(const MoeRouterArgs& a, cudaStream_t stream) {
    if (!moe_router_decode_supported(EH_TYPE_F32, a.n_expert, a.cols, a.k))
        throw ehp::Error(EH_INTERNAL, "moe router: shapes not supported (check moe_router_decode_supported)");
    if (!a.x || !a.norm_w || !a.w || !a.logits || (a.ids && (!a.weights || !a.counter)))
        throw ehp::Error(EH_INTERNAL, "moe router: missing buffer");
    for (const void* p : {static_cast<const void*>(a.x), static_cast<const void*>(a.norm_w), static_cast<const void*>(a.w)})
        if (reinterpret_cast<uintptr_t>(p) % 16)
            throw ehp::Error(EH_INTERNAL, "moe router: input, norm weight and router rows must be 16-byte aligned");
    launch("router_decode_kernel", router_decode_kernel, unsigned(a.n_expert), kRouterThreads, 0, stream, a);
    EHC_LAUNCHED("router_decode_kernel");
}

}  // namespace ehcuda
