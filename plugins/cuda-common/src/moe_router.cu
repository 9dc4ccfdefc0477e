// The MoE router over the RMS-normalized input: one token's at decode with
// moe_route's top-k selection in the same kernel (moe_router_decode,
// moe.hpp), and any number of tokens' with the same per-token arithmetic
// (moe_router_rows, moe_invariant.hpp).
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
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/moe.hpp"
#include "ehcuda/moe_invariant.hpp"
#include "moe_common.cuh"

namespace ehcuda {
namespace {

constexpr int kRouterThreads = 128;
constexpr int kRouterLoads = 4;  // float4s of the row per thread held in registers (cols <= 2048); more in a loop

// The per-call part of router_kernel: the tokens, and the normalised rows
// to write (moe_router_rows).
struct RowsOut {
    int ntok = 1, ldx = 0, per_block = 1;
    float* xn = nullptr;
    __half* xn16 = nullptr;
};

// block_sum (block_reduce.cuh) of N values at once, one barrier pair for
// all: value j's total in every thread, the bits block_sum gives it (the
// same warp sums over the same partials). shm: N * 32 floats.
template <int N>
__device__ __forceinline__ void block_sums(float (&v)[N], float* shm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = detail::warp_sum(v[j]);
    __syncthreads();  // (the previous round's reads of shm are done)
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < N; ++j) shm[j * 32 + warp] = v[j];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = detail::warp_sum(lane < nw ? shm[j * 32 + lane] : 0.0f);
}

// Block (expert group, token group): logits of experts blockIdx.x * EB ..
// + EB for tokens blockIdx.y * per_block .. + per_block, TB tokens at a
// time (each weight load serves TB tokens, each input load EB experts).
// Per (token, expert) the sums are fixed by the thread layout alone
// (thread i takes the row's float4s i, i + 128, ... in order, then
// block_sum's tree), not by EB, TB, the token group or where the row's
// values come from, so every instance gives a logit the same bits. Regs
// (EB and TB 1): the thread's first float4s of its row in registers before
// pdl_entry() (weights are never written). Block (0, y) also writes the
// tokens' normalised rows where asked. With a.ids (one token, EB 1): the
// last block ranks the logits (below).
template <int EB, int TB, bool Regs>
__global__ void __launch_bounds__(kRouterThreads) router_kernel(MoeRouterArgs a, RowsOut o) {
    static_assert(!Regs || (EB == 1 && TB == 1));
    constexpr int kSums = TB * (EB + 1);  // [tt][q] dots, then [tt] sums of squares
    __shared__ float red[kSums * 32];
    __shared__ bool last;
    __shared__ float logits[kMaxRouteExperts];
    const int e0 = blockIdx.x * EB, n4 = a.cols / 4;
    float4 wr[Regs ? kRouterLoads : 1];
    if constexpr (Regs) {
        const float4* w4 = reinterpret_cast<const float4*>(a.w + size_t(e0) * a.cols);
#pragma unroll
        for (int j = 0; j < kRouterLoads; ++j) {
            const int i = threadIdx.x + j * kRouterThreads;
            wr[j] = i < n4 ? w4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    pdl_entry();
    pdl_release();
    const float4* g4 = reinterpret_cast<const float4*>(a.norm_w);
    const int t0 = blockIdx.y * o.per_block, t1 = min(o.ntok, t0 + o.per_block);
    for (int tb = t0; tb < t1; tb += TB) {
        const int nt = min(TB, t1 - tb);
        const float4* x4[TB];
#pragma unroll
        for (int tt = 0; tt < TB; ++tt)
            x4[tt] = reinterpret_cast<const float4*>(a.x + size_t(tb + min(tt, nt - 1)) * o.ldx);
        // dot(w, x * g) and sum(x^2): the norm's scale comes last
        float sums[kSums] = {};
        auto add = [&](int i, const float4 (&w)[EB]) {
            const float4 g = g4[i];
#pragma unroll
            for (int tt = 0; tt < TB; ++tt) {
                const float4 x = x4[tt][i];
                float& ss = sums[TB * EB + tt];
                ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss))));
#pragma unroll
                for (int q = 0; q < EB; ++q) {
                    float& d = sums[tt * EB + q];
                    d = fmaf(w[q].x, x.x * g.x, fmaf(w[q].y, x.y * g.y, fmaf(w[q].z, x.z * g.z, fmaf(w[q].w, x.w * g.w, d))));
                }
            }
        };
        int i = threadIdx.x;
        if constexpr (Regs) {
#pragma unroll
            for (int j = 0; j < kRouterLoads; ++j, i += kRouterThreads) {
                if (i < n4) {
                    const float4 w[EB] = {wr[j]};
                    add(i, w);
                }
            }
        }
        for (; i < n4; i += kRouterThreads) {
            float4 w[EB];
#pragma unroll
            for (int q = 0; q < EB; ++q)
                w[q] = e0 + q < a.n_expert ? reinterpret_cast<const float4*>(a.w + size_t(e0 + q) * a.cols)[i]
                                           : make_float4(0.f, 0.f, 0.f, 0.f);
            add(i, w);
        }
        block_sums(sums, red);
#pragma unroll
        for (int tt = 0; tt < TB; ++tt) {
            if (tt >= nt) break;
            const int t = tb + tt;
            const float inv = rsqrtf(sums[TB * EB + tt] / float(a.cols) + a.norm_eps);
            if (threadIdx.x == 0) {
#pragma unroll
                for (int q = 0; q < EB; ++q) {
                    const int e = e0 + q;
                    if (e < a.n_expert)
                        a.logits[size_t(t) * a.n_expert + e] = sums[tt * EB + q] * inv + (a.bias ? a.bias[e] : 0.0f);
                }
            }
            if (blockIdx.x == 0 && (o.xn || o.xn16)) {
                for (int c = threadIdx.x; c < n4; c += kRouterThreads) {
                    const float4 x = x4[tt][c], g = g4[c];
                    const float v[4] = {x.x * inv * g.x, x.y * inv * g.y, x.z * inv * g.z, x.w * inv * g.w};
                    if (o.xn) reinterpret_cast<float4*>(o.xn + size_t(t) * a.cols)[c] = make_float4(v[0], v[1], v[2], v[3]);
                    if (o.xn16) {
                        __half2* h2 = reinterpret_cast<__half2*>(o.xn16 + size_t(t) * a.cols + size_t(c) * 4);
                        h2[0] = __floats2half2_rn(v[0], v[1]);
                        h2[1] = __floats2half2_rn(v[2], v[3]);
                    }
                }
            }
        }
    }
    if (!a.ids) return;
    // One token's routing: the last block to finish ranks the logits.
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(a.counter, 1) == a.n_expert - 1;
        if (last) *a.counter = 0;  // every block of this launch has counted
    }
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

// A call of many tokens: blocks of 8 experts taking the tokens 4 at a
// time (a token's row read once for 8 experts, an expert's row once for
// 4 tokens: a 2048-token step's router is a GEMM's worth of loads).
constexpr int kRowsExperts = 8, kRowsTokens = 4;

void check_args(const MoeRouterArgs& a, const char* what) {
    if (!a.x || !a.norm_w || !a.w || !a.logits || (a.ids && (!a.weights || !a.counter)))
        throw ehp::Error(EH_INTERNAL, std::string(what) + ": missing buffer");
    for (const void* p : {static_cast<const void*>(a.x), static_cast<const void*>(a.norm_w), static_cast<const void*>(a.w)})
        if (reinterpret_cast<uintptr_t>(p) % 16)
            throw ehp::Error(EH_INTERNAL, std::string(what) + ": input, norm weight and router rows must be 16-byte aligned");
}

}  // namespace

bool moe_router_decode_supported(uint32_t type, int n_expert, int cols, int k) {
    return type == EH_TYPE_F32 && n_expert >= 1 && n_expert <= kMaxRouteExperts && k >= 1 && k <= 32 && k <= n_expert &&
           cols > 0 && cols % 4 == 0;
}

void moe_router_decode(const MoeRouterArgs& a, cudaStream_t stream) {
    if (!moe_router_decode_supported(EH_TYPE_F32, a.n_expert, a.cols, a.k))
        throw ehp::Error(EH_INTERNAL, "moe router: shapes not supported (check moe_router_decode_supported)");
    check_args(a, "moe router");
    RowsOut o;
    o.ldx = a.cols;
    launch("router_decode_kernel", router_kernel<1, 1, true>, unsigned(a.n_expert), kRouterThreads, 0, stream, a, o);
    EHC_LAUNCHED("router_decode_kernel");
}

bool moe_router_rows_supported(uint32_t type, int n_expert, int cols) {
    return type == EH_TYPE_F32 && n_expert >= 1 && n_expert <= kMaxRouteExperts && cols > 0 && cols % 4 == 0;
}

void moe_router_rows(const MoeRouterRowsArgs& r, cudaStream_t stream) {
    if (!moe_router_rows_supported(EH_TYPE_F32, r.n_expert, r.cols) || r.ntok < 1 || r.ldx < r.cols || r.ldx % 4 ||
        reinterpret_cast<uintptr_t>(r.xn16) % 16 || reinterpret_cast<uintptr_t>(r.xn) % 16)
        throw ehp::Error(EH_INTERNAL, "moe router rows: shapes not supported (check moe_router_rows_supported)");
    MoeRouterArgs a;
    a.x = r.x;
    a.norm_w = r.norm_w;
    a.norm_eps = r.norm_eps;
    a.w = r.w;
    a.bias = r.bias;
    a.n_expert = r.n_expert;
    a.cols = r.cols;
    a.logits = r.logits;
    check_args(a, "moe router rows");
    RowsOut o;
    o.ntok = r.ntok;
    o.ldx = r.ldx;
    o.xn = r.xn;
    o.xn16 = static_cast<__half*>(r.xn16);
    // Tokens per block: enough blocks to fill the GPU twice over, no more.
    const long blocks_e = long(r.n_expert);
    if (blocks_e * r.ntok <= 2048) {
        launch("router_rows_kernel", router_kernel<1, 1, true>, dim3(unsigned(r.n_expert), unsigned(r.ntok)),
               kRouterThreads, 0, stream, a, o);
    } else {
        const long ge = (blocks_e + kRowsExperts - 1) / kRowsExperts;
        o.per_block = kRowsTokens * int(std::clamp<long>(ge * r.ntok / (512 * kRowsTokens), 1, 8));
        launch("router_rows_kernel", router_kernel<kRowsExperts, kRowsTokens, false>,
               dim3(unsigned(ge), unsigned((r.ntok + o.per_block - 1) / o.per_block)), kRouterThreads, 0, stream, a, o);
    }
    EHC_LAUNCHED("router_rows_kernel");
}

}  // namespace ehcuda
