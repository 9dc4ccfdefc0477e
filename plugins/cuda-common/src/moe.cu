// MoE routing and expert products (see moe.hpp). One warp per output row
// of one (token, slot); lanes take 32-element chunks of the row in turn. A
// slot whose id is negative (expert parallelism's mark for another rank's
// pair, moe_expert_range.hpp) is skipped by both products.
#include <string>

#include <engine_host/plugin_abi.hpp>

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/kernels.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/moe.hpp"
#include "moe_common.cuh"
#include "ehcuda/mxfp4.cuh"
#include "ehcuda/mxfp4_layout.hpp"
#include "matmul_common.cuh"

namespace ehcuda {
namespace {

using moe_detail::DevMat;
using moe_detail::row_ptr;
using moe_detail::to_dev;

constexpr int kWarps = 4;
constexpr int kMaxK = 32;

__device__ __forceinline__ void load_x(const float* x, int c, float (&v)[32]) {
    const float4* p = reinterpret_cast<const float4*>(x + 32 * c);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float4 g = p[i];
        v[4 * i] = g.x; v[4 * i + 1] = g.y; v[4 * i + 2] = g.z; v[4 * i + 3] = g.w;
    }
}

template <int T>
__device__ __forceinline__ float row_dot(const uint8_t* w, const float* x, int nch, int lane) {
    float acc = 0.0f;
    for (int c = lane; c < nch; c += 32) {
        float wv[32], xv[32];
        load_any_chunk<T>(w, c, wv);
        load_x(x, c, xv);
#pragma unroll
        for (int j = 0; j < 32; ++j) acc = fmaf(wv[j], xv[j], acc);
    }
    return detail::warp_sum(acc);
}

constexpr int kRouteWarps = 4;  // tokens per block; the routing itself: route_warp (moe_common.cuh)

__global__ void __launch_bounds__(kRouteWarps * 32) route_kernel(const float* logits, int ntok, int n_expert, int k,
                                                                  int32_t* ids, float* w) {
    pdl_entry();
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
    if (t >= ntok) return;
    int my_id;
    float my_w;
    route_warp(logits + size_t(t) * n_expert, n_expert, k, lane, my_id, my_w);
    if (lane < k) {
        ids[size_t(t) * k + lane] = my_id;
        w[size_t(t) * k + lane] = my_w;
    }
}

// Dot products of kRows consecutive rows of one expert with one input row:
// each input chunk is loaded once for all of them, and kRows independent
// weight loads are in flight per lane. Sums are warp-reduced.
template <int T, int R>
__device__ __forceinline__ void rows_dot(const DevMat& m, int e, int r0, int nr, const float* x, int lane,
                                         float (&out)[R]) {
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.0f;
    const int nch = m.cols / 32;
    const uint8_t* w0 = row_ptr(m, e, r0);
    for (int c = lane; c < nch; c += 32) {
        float xv[32];
        load_x(x, c, xv);
#pragma unroll
        for (int i = 0; i < R; ++i) {
            if (i < nr) {
                float wv[32];
                load_any_chunk<T>(w0 + size_t(i) * m.row_bytes, c, wv);
#pragma unroll
                for (int j = 0; j < 32; ++j) acc[i] = fmaf(wv[j], xv[j], acc[i]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) out[i] = detail::warp_sum(acc[i]);
}

// Rows per warp in the expert kernels: 4 for batches (each input chunk
// serves four rows), 1 for decode (more warps, more loads in flight).
int rows_per_warp(int ntok) { return ntok >= 8 ? 4 : 1; }

// grid.x: (token, slot) pairs (fastest), grid.y: groups of kWarps * kRows rows.
template <int TG, int TU, int kRows>
__global__ void __launch_bounds__(kWarps * 32) gate_up_kernel(const float* x, int ldx, int k, const int32_t* ids,
                                                              DevMat g, DevMat u, float alpha, float limit,
                                                              float* act) {
    const int ts = blockIdx.x;
    const int r0 = (blockIdx.y * kWarps + (threadIdx.x >> 5)) * kRows;
    const int lane = threadIdx.x & 31;
    if (r0 >= g.rows) return;
    const int nr = min(kRows, g.rows - r0);
    const int t = ts / k;
    const int e = ids[ts];
    if (e < 0) return;  // (another rank's pair: its act row is never read)
    const float* xr = x + size_t(t) * ldx;
    float gs[kRows], us[kRows];
    rows_dot<TG, kRows>(g, e, r0, nr, xr, lane, gs);
    rows_dot<TU, kRows>(u, e, r0, nr, xr, lane, us);
    if (lane < nr) {
        // lane i writes row r0 + i (register arrays indexed by a constant)
        float gv = 0.0f, uv = 0.0f;
#pragma unroll
        for (int i = 0; i < kRows; ++i)
            if (i == lane) { gv = gs[i]; uv = us[i]; }
        const int r = r0 + lane;
        if (g.bias) gv += g.bias[size_t(e) * g.bias_stride + r];
        if (u.bias) uv += u.bias[size_t(e) * u.bias_stride + r];
        act[size_t(ts) * g.rows + r] = expert_swiglu(gv, uv, alpha, limit);
    }
}

// grid.x: tokens (fastest), grid.y: groups of kWarps * kRows output rows;
// each warp walks the token's k slots in rank order.
template <int T, int kRows>
__global__ void __launch_bounds__(kWarps * 32) down_kernel(const float* act, int k, const int32_t* ids,
                                                           const float* wts, DevMat d, float* h, int ldh) {
    const int t = blockIdx.x;
    const int r0 = (blockIdx.y * kWarps + (threadIdx.x >> 5)) * kRows;
    const int lane = threadIdx.x & 31;
    if (r0 >= d.rows) return;
    const int nr = min(kRows, d.rows - r0);
    float out[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) out[i] = 0.0f;
    for (int s = 0; s < k; ++s) {
        const int ts = t * k + s;
        const int e = ids[ts];
        if (e < 0) continue;  // (another rank's pair: no term)
        const float w = wts[ts];
        float y[kRows];
        rows_dot<T, kRows>(d, e, r0, nr, act + size_t(ts) * d.cols, lane, y);
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
            const float b = d.bias && i < nr ? d.bias[size_t(e) * d.bias_stride + r0 + i] : 0.0f;
            out[i] = fmaf(w, y[i] + b, out[i]);
        }
    }
    if (lane < nr) {
        float v = 0.0f;
#pragma unroll
        for (int i = 0; i < kRows; ++i)
            if (i == lane) v = out[i];
        h[size_t(t) * ldh + r0 + lane] += v;
    }
}

template <int T>
__global__ void __launch_bounds__(kWarps * 32) dense_kernel(const float* x, int ldx, DevMat w, float* y, int ldy,
                                                            int accumulate) {
    const int t = blockIdx.x;
    const int r = blockIdx.y * kWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= w.rows) return;
    float s = row_dot<T>(row_ptr(w, 0, r), x + size_t(t) * ldx, w.cols / 32, lane);
    if (w.bias) s += w.bias[r];
    if (lane == 0) {
        float* dst = y + size_t(t) * ldy + r;
        *dst = accumulate ? *dst + s : s;
    }
}

template <class F>
void type_dispatch(uint32_t type, F&& f) {
    detail::host_dispatch_mxfp4(type, "moe", f);
}

}  // namespace

bool moe_type_supported(uint32_t type) { return type == EH_TYPE_MXFP4 || matmul_type_supported(type); }

size_t moe_row_bytes(uint32_t type, int64_t cols) {
    if (type == EH_TYPE_MXFP4) return mxfp4_device_row_bytes(cols);
    return row_bytes(type, cols);
}

void moe_route(const float* logits, int ntok, int n_expert, int k, int32_t* ids, float* weights,
               cudaStream_t stream) {
    if (ntok <= 0) return;
    if (k < 1 || k > kMaxK || k > n_expert) throw ehp::Error(EH_UNSUPPORTED, "moe: expert_used_count must be 1..32 and <= expert_count");
    if (n_expert > kMaxRouteExperts) throw ehp::Error(EH_UNSUPPORTED, "moe: expert_count must be <= 1024");
    launch("route_kernel", route_kernel, (ntok + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, stream, logits, ntok,
           n_expert, k, ids, weights);
    EHC_LAUNCHED("route_kernel");
}

void moe_gate_up(const float* x, int ldx, int ntok, int k, const int32_t* ids, const ExpertMat& gate,
                 const ExpertMat& up, float alpha, float limit, float* act, cudaStream_t stream) {
    if (ntok <= 0) return;
    const DevMat g = to_dev(gate, "moe gate"), u = to_dev(up, "moe up");
    if (g.rows != u.rows || g.cols != u.cols) throw ehp::Error(EH_INTERNAL, "moe: gate and up shapes differ");
    const int R = rows_per_warp(ntok);
    const int per_block = kWarps * R;
    const dim3 grid(unsigned(ntok * k), unsigned((g.rows + per_block - 1) / per_block));
    auto go = [&](auto k4, auto k1) {
        if (R == 4) k4<<<grid, kWarps * 32, 0, stream>>>(x, ldx, k, ids, g, u, alpha, limit, act);
        else k1<<<grid, kWarps * 32, 0, stream>>>(x, ldx, k, ids, g, u, alpha, limit, act);
    };
    if (gate.type == up.type)
        type_dispatch(gate.type, [&]<int T>() { go(gate_up_kernel<T, T, 4>, gate_up_kernel<T, T, 1>); });
    else
        type_dispatch(gate.type, [&]<int TG>() {
            type_dispatch(up.type, [&]<int TU>() { go(gate_up_kernel<TG, TU, 4>, gate_up_kernel<TG, TU, 1>); });
        });
    EHC_LAUNCHED("gate_up_kernel");
}

void moe_down(const float* act, int ntok, int k, const int32_t* ids, const float* weights,
              const ExpertMat& down, float* h, int ldh, cudaStream_t stream) {
    if (ntok <= 0) return;
    const DevMat d = to_dev(down, "moe down");
    const int R = rows_per_warp(ntok);
    const int per_block = kWarps * R;
    const dim3 grid(unsigned(ntok), unsigned((d.rows + per_block - 1) / per_block));
    type_dispatch(down.type, [&]<int T>() {
        if (R == 4) down_kernel<T, 4><<<grid, kWarps * 32, 0, stream>>>(act, k, ids, weights, d, h, ldh);
        else down_kernel<T, 1><<<grid, kWarps * 32, 0, stream>>>(act, k, ids, weights, d, h, ldh);
    });
    EHC_LAUNCHED("down_kernel");
}

void dense_gemv(const float* x, int ldx, int ntok, const ExpertMat& w, float* y, int ldy, bool accumulate,
                cudaStream_t stream) {
    if (ntok <= 0) return;
    const DevMat d = to_dev(w, "dense gemv");
    const dim3 grid(unsigned(ntok), unsigned((d.rows + kWarps - 1) / kWarps));
    type_dispatch(w.type, [&]<int T>() { dense_kernel<T><<<grid, kWarps * 32, 0, stream>>>(x, ldx, d, y, ldy, accumulate ? 1 : 0); });
    EHC_LAUNCHED("dense_kernel");
}

}  // namespace ehcuda
