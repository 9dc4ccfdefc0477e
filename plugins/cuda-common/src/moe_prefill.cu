// Grouped MoE prefill (see moe_prefill in moe.hpp). Per call:
//   1. group: block e writes the pairs routed to expert e, in pair order, at
//      offsets[e] .. offsets[e+1) of `sorted`, and pos[pair] = its place;
//   2. the offsets go to the host (the one synchronisation); meanwhile the
//      routed tokens' input rows are gathered, in sorted order, as FP16;
//   3. per used expert: gate|up dequantized into the slab, one cuBLAS GEMM
//      over that expert's rows -> FP32 [sorted][gate | up];
//   4. bias + clamped SwiGLU -> FP16 [sorted][ff] (reusing the input buffer);
//   5. per used expert: down -> FP32 [sorted][embd] (reusing the GEMM output);
//   6. h[t] += sum over slots s in rank order of w * (down + bias).
// Everything is ordered by one stream and no float is accumulated with
// atomics, so the result does not depend on scheduling.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/check.hpp"
#include "ehcuda/moe.hpp"
#include "ehcuda/prefill_workspace.hpp"
#include "mma.cuh"
#include "moe_common.cuh"
#include "prefill_gemm.hpp"

namespace ehcuda {
namespace {

constexpr int kGroupThreads = 256;

// Block e: expert e's pairs. A negative id (a pair expert parallelism
// routed to another rank, moe_expert_range.hpp) sorts before expert 0:
// offsets[0] is their count, block 0 places them at [0, offsets[0]) (only
// when there are any), so every place below P names a pair, and no
// expert's range holds them.
__global__ void __launch_bounds__(kGroupThreads) group_kernel(const int32_t* ids, int P, int n_expert,
                                                              int32_t* offsets, int32_t* sorted, int32_t* pos) {
    const int e = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    __shared__ int s_less;
    __shared__ int s_warp[kGroupThreads / 32];
    if (tid == 0) s_less = 0;
    __syncthreads();
    int less = 0;
    for (int i = tid; i < P; i += kGroupThreads) less += ids[i] < e;
    atomicAdd(&s_less, less);  // integer: exact in any order
    __syncthreads();
    // The pairs with is_mine(id), in pair order, from place `base` on;
    // returns the place after the last.
    auto place = [&](int base, auto is_mine) {
        for (int i0 = 0; i0 < P; i0 += kGroupThreads) {
            const int i = i0 + tid;
            const bool mine = i < P && is_mine(ids[i]);
            const unsigned m = __ballot_sync(0xffffffffu, mine);
            if (lane == 0) s_warp[warp] = __popc(m);
            __syncthreads();
            int before = 0, total = 0;
#pragma unroll
            for (int w = 0; w < kGroupThreads / 32; ++w) {
                before += w < warp ? s_warp[w] : 0;
                total += s_warp[w];
            }
            if (mine) {
                const int p = base + before + __popc(m & ((1u << lane) - 1u));
                sorted[p] = i;
                pos[i] = p;
            }
            base += total;
            __syncthreads();  // s_warp is rewritten next round
        }
        return base;
    };
    const int first = s_less;
    if (tid == 0) offsets[e] = first;
    if (e == 0 && first > 0) place(0, [](int id) { return id < 0; });
    const int end = place(first, [e](int id) { return id == e; });
    if (e == n_expert - 1 && tid == 0) offsets[n_expert] = end;
}

// x16[i] = x[sorted[i] / k] as FP16, eight elements per thread.
__global__ void gather_kernel(const float* x, int ldx, int cols, int k, const int32_t* sorted, int P, __half* x16) {
    const int per_row = cols / 8;
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(P) * per_row) return;
    const size_t i = idx / per_row;
    const int c = int(idx % per_row) * 8;
    const int t = sorted[i] / k;
    const float4* p = reinterpret_cast<const float4*>(x + size_t(t) * ldx + c);
    const float4 a = p[0], b = p[1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    detail::store_half8(x16 + i * cols + c, v);
}

// act[i][r] = expert_swiglu(gu[i][r] + bg[e][r], gu[i][ff + r] + bu[e][r]) for
// the expert e of sorted pair i, as FP16.
__global__ void swiglu_kernel(const float* gu, int ff, int P, const int32_t* sorted, const int32_t* ids,
                              const float* bg, int bg_stride, const float* bu, int bu_stride, float alpha, float limit,
                              __half* act) {
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(P) * ff) return;
    const size_t i = idx / ff;
    const int r = int(idx % ff);
    const int e = ids[sorted[i]];
    if (e < 0) return;  // (a pair of another rank's, never read)
    float g = gu[i * 2 * ff + r], u = gu[i * 2 * ff + ff + r];
    if (bg) g += bg[size_t(e) * bg_stride + r];
    if (bu) u += bu[size_t(e) * bu_stride + r];
    act[idx] = __float2half_rn(expert_swiglu(g, u, alpha, limit));
}

// h[t][r] += sum_s w[t*k+s] * (d[pos[t*k+s]][r] + bd[e][r]), s in rank order
// (the same sum, in the same order, as moe_down), over the slots whose id is
// not negative.
__global__ void combine_kernel(const float* d, int embd, int k, const int32_t* ids, const float* wts,
                               const int32_t* pos, const float* bd, int bd_stride, float* h, int ldh) {
    const int t = blockIdx.y;
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= embd) return;
    float out = 0.0f;
    for (int s = 0; s < k; ++s) {
        const int ts = t * k + s;
        const int e = ids[ts];
        if (e < 0) continue;  // (a pair of another rank's: no term)
        const float b = bd ? bd[size_t(e) * bd_stride + r] : 0.0f;
        out = fmaf(wts[ts], d[size_t(pos[ts]) * embd + r] + b, out);
    }
    h[size_t(t) * ldh + r] += out;
}

unsigned blocks_for(size_t n, unsigned per) { return unsigned((n + per - 1) / per); }

}  // namespace

namespace moe_detail {
void gather_half_rows(const float* x, int ldx, int cols, int k, const int32_t* sorted, int P, __half* x16,
                      cudaStream_t stream) {
    gather_kernel<<<blocks_for(size_t(P) * size_t(cols / 8), 256), 256, 0, stream>>>(x, ldx, cols, k, sorted, P, x16);
    EHC_LAUNCHED("gather_kernel");
}

void combine_sorted(const float* d, int embd, int ntok, int k, const int32_t* ids, const float* weights,
                    const int32_t* pos, const float* bias, int bias_stride, float* h, int ldh, cudaStream_t stream) {
    combine_kernel<<<dim3(blocks_for(size_t(embd), 256), unsigned(ntok)), 256, 0, stream>>>(d, embd, k, ids, weights,
                                                                                             pos, bias, bias_stride, h, ldh);
    EHC_LAUNCHED("combine_kernel");
}

void group_pairs(const int32_t* ids, int P, int n_expert, int32_t* offsets, int32_t* sorted, int32_t* pos,
                 cudaStream_t stream) {
    group_kernel<<<n_expert, kGroupThreads, 0, stream>>>(ids, P, n_expert, offsets, sorted, pos);
    EHC_LAUNCHED("group_kernel");
}
}  // namespace moe_detail

namespace {

bool shape_ok(const ExpertMat& m) {
    return m.data && moe_type_supported(m.type) && m.rows > 0 && m.cols > 0 && m.cols % 32 == 0 &&
           m.row_bytes == moe_row_bytes(m.type, m.cols);
}

// C[i][0, rows) (ld ldc) = W_e . X[i] for the cnt rows of x16: the expert's
// rows dequantized slab by slab (FP16 experts are read in place).
void expert_gemm(const PrefillWorkspace& ws, const ExpertMat& m, int rows, int e, const __half* x16, int cnt, float* c,
                 int ldc, cudaStream_t stream) {
    const uint8_t* base =
        static_cast<const uint8_t*>(m.data) + size_t(e) * m.expert_stride + size_t(m.row0) * m.row_bytes;
    if (m.type == EH_TYPE_F16) {
        prefill::gemm_f16(ws, rows, cnt, m.cols, reinterpret_cast<const __half*>(base), int(m.row_bytes / 2), x16,
                          m.cols, c, ldc, 0.0f, stream);
        return;
    }
    const int slab_rows = int(std::min<size_t>(ws.slab_halves() / size_t(m.cols), size_t(rows)));
    for (int r0 = 0; r0 < rows; r0 += slab_rows) {
        const int nr = std::min(slab_rows, rows - r0);
        prefill::dequant_rows(m.type, base + size_t(r0) * m.row_bytes, m.row_bytes, nr, m.cols, ws.slab(), stream);
        prefill::gemm_f16(ws, nr, cnt, m.cols, ws.slab(), m.cols, x16, m.cols, c + r0, ldc, 0.0f, stream);
    }
}

}  // namespace

bool moe_prefill(PrefillWorkspace* ws, const float* x, int ldx, int ntok, int k, int n_expert, const int32_t* ids,
                 const float* weights, const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, float alpha,
                 float limit, float* h, int ldh, cudaStream_t stream) {
    if (!ws || !ws->enabled_for(ntok) || k < 1 || n_expert < 1) return false;
    const PrefillShape& S = ws->shape();
    const size_t P = size_t(ntok) * size_t(k);
    if (n_expert > S.moe_experts || P > size_t(ws->moe_pairs())) return false;
    if (!shape_ok(gate) || !shape_ok(up) || !shape_ok(down)) return false;
    const int E = gate.cols, F = gate.rows;
    if (up.rows != F || up.cols != E || down.cols != F || down.rows != E || ldx % 4 || E % 8) return false;
    if (P * size_t(std::max(E, F)) > ws->act_halves() || P * size_t(std::max(2 * F, E)) > ws->moe_out_floats()) return false;
    if (ws->slab_halves() < size_t(std::max(E, F))) return false;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    EHC_CHECK(cudaStreamIsCapturing(stream, &cap));
    if (cap != cudaStreamCaptureStatusNone) return false;

    ws->note_use();
    int32_t* sorted = ws->moe_sorted();
    int32_t* pos = ws->moe_pos();
    int32_t* offsets = ws->moe_offsets();
    int32_t* host_off = ws->moe_offsets_host();
    __half* x16 = ws->act();
    float* out = ws->moe_out();

    moe_detail::group_pairs(ids, int(P), n_expert, offsets, sorted, pos, stream);
    EHC_CHECK(cudaMemcpyAsync(host_off, offsets, size_t(n_expert + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    moe_detail::gather_half_rows(x, ldx, E, k, sorted, int(P), x16, stream);
    EHC_CHECK(cudaStreamSynchronize(stream));
    // (host_off[0]: the pairs of negative id, skipped; an id past the experts
    // is in no range)
    if (host_off[0] < 0 || host_off[0] > int32_t(P) || host_off[n_expert] != int32_t(P))
        throw ehp::Error(EH_INTERNAL, "moe prefill: expert ids out of range");

    // gate|up stored as one tensor (gate rows then up rows of each expert)
    // dequantize and multiply as one matrix of 2F rows.
    const bool fused = gate.data == up.data && gate.type == up.type && gate.row_bytes == up.row_bytes &&
                       gate.expert_stride == up.expert_stride && up.row0 == gate.row0 + F;
    for (int e = 0; e < n_expert; ++e) {
        const int off = host_off[e], cnt = host_off[e + 1] - off;
        if (cnt <= 0) continue;
        const __half* xe = x16 + size_t(off) * E;
        float* ce = out + size_t(off) * 2 * F;
        if (fused) {
            expert_gemm(*ws, gate, 2 * F, e, xe, cnt, ce, 2 * F, stream);
        } else {
            expert_gemm(*ws, gate, F, e, xe, cnt, ce, 2 * F, stream);
            expert_gemm(*ws, up, F, e, xe, cnt, ce + F, 2 * F, stream);
        }
    }
    swiglu_kernel<<<blocks_for(P * size_t(F), 256), 256, 0, stream>>>(out, F, int(P), sorted, ids, gate.bias,
                                                                        gate.bias_stride, up.bias, up.bias_stride,
                                                                        alpha, limit, x16);
    EHC_LAUNCHED("swiglu_kernel");
    for (int e = 0; e < n_expert; ++e) {
        const int off = host_off[e], cnt = host_off[e + 1] - off;
        if (cnt <= 0) continue;
        expert_gemm(*ws, down, E, e, x16 + size_t(off) * F, cnt, out + size_t(off) * E, E, stream);
    }
    moe_detail::combine_sorted(out, E, ntok, k, ids, weights, pos, down.bias, down.bias_stride, h, ldh, stream);
    return true;
}

}  // namespace ehcuda
