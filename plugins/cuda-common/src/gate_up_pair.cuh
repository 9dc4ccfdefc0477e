// One token's gate and up projections side by side: a block owns 32 rows
// of both (8 warps x 4 rows of gate and the same 4 rows of up), against the
// token's input staged once per block as integer codes (pre-norm folded
// in), and combines each pair with the FFN's activation into one 32-element
// chunk of the down projection's input, written to memory already in the
// integer chunk layout (store_chunk_warp): the down projection reads it
// without staging, and no gate|up buffer goes through memory in float.
// Serves the MoE experts (moe_decode.cu: one block row per selected expert)
// and dense FFNs (ffn_decode.cu: one "expert", e = 0).
#pragma once

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "gemv_stage.cuh"
#include "moe_common.cuh"

namespace ehcuda::detail {

// RW rows of gate (and the same of up) per warp, 32 / RW warps: one
// 32-row chunk per block.

// silu(gate) * up: llama-family FFNs.
struct SwiGlu {
    __device__ float operator()(float g, float u) const { return silu(g) * u; }
};
// gpt-oss's clamped form (moe_common.cuh).
struct SwiGluOai {
    float alpha, limit;
    __device__ float operator()(float g, float u) const { return swiglu_oai(g, u, alpha, limit); }
};

// Grid (n_ff / 32, slots). Slot s uses expert ids[s] (ids NULL: expert 0)
// and writes chunk blockIdx.x of its row of chunks in `out`.
template <int TG, int TU, int Bits, int RW, class Act>
// (MXFP4 at RW 4: 3 blocks per SM, <= 85 registers, no spills; its reader
// otherwise took 95 and the MoE decode ran at 2 blocks per SM. The K-quant
// types would spill under that bound, so they keep theirs.)
__global__ void __launch_bounds__(32 / RW * 32, RW == 4 && TG == EH_TYPE_MXFP4 ? 3 : 1) gate_up_pair_kernel(DevArgs xa, const int32_t* ids,
                                                                       moe_detail::DevMat g, moe_detail::DevMat u,
                                                                       Act act, uint8_t* out) {
    const int slot = blockIdx.y, chunk = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = chunk * 32 + warp * RW;
    const int nch = xa.cols / 32;
    // A dense FFN (no expert ids, which an earlier kernel writes) knows its
    // rows before pdl_entry(): each lane asks L2 for its first chunk of them,
    // as the GEMV does, so the staging below overlaps that fetch.
    if constexpr (TG != EH_TYPE_MXFP4)
        if (!ids && (xa.prefetch & 2) && lane < nch) {
#pragma unroll
            for (int i = 0; i < RW; ++i) {
                prefetch_l2(chunk_ptr<TG>(moe_detail::row_ptr(g, 0, r0 + i), lane));
                prefetch_l2(chunk_ptr<TU>(moe_detail::row_ptr(u, 0, r0 + i), lane));
            }
        }
    pdl_entry();
    extern __shared__ int4 smem_raw[];
    uint8_t* xs = reinterpret_cast<uint8_t*>(smem_raw);
    __shared__ float vals[32];
    const int e = ids ? ids[slot] : 0;
    const uint8_t* gw = moe_detail::row_ptr(g, e, r0);
    const uint8_t* uw = moe_detail::row_ptr(u, e, r0);
    const float xscale = stage_x_int<Bits>(xa, xs);

    float ag[RW] = {}, au[RW] = {};
    for (int c = lane; c < nch; c += 32) {
        XChunk<Bits> x;
        load_staged_int<Bits>(xs, c, x);
#pragma unroll
        for (int i = 0; i < RW; ++i) {
            ag[i] += dot_chunk_int<TG>(gw + size_t(i) * g.row_bytes, c, x);
            au[i] += dot_chunk_int<TU>(uw + size_t(i) * u.row_bytes, c, x);
        }
    }
#pragma unroll
    for (int i = 0; i < RW; ++i) {
        // rounded before the bias as the GEMV does (__fmul_rn: no contraction)
        const float gv = __fmul_rn(warp_sum(ag[i]), xscale), uv = __fmul_rn(warp_sum(au[i]), xscale);
        if (lane == i) {
            const int r = r0 + i;
            vals[warp * RW + i] = act(gv + moe_detail::bias_of(g, e, r), uv + moe_detail::bias_of(u, e, r));
        }
    }
    __syncthreads();
    if (warp == 0) store_chunk_warp<Bits>(vals[lane], out + (size_t(slot) * gridDim.x + chunk) * kIntStride<Bits>);
}

// gate_up_pair_kernel<T, T, Bits, RW, Act> over `slots` block rows, for
// gate and up of one integer-path type (the caller checked) and g.rows % 32
// == 0; RW 4 or 2 (8 or 16 warps).
template <int Bits, int RW, class Act>
void launch_gate_up_pair(uint32_t type, const DevArgs& xa, const int32_t* ids, const moe_detail::DevMat& g,
                         const moe_detail::DevMat& u, Act act, uint8_t* out, int slots, cudaStream_t stream) {
    const size_t smem = staged_int_bytes<Bits>(xa.cols);
    int_type_dispatch(type, [&]<int T>() {
        auto kernel = gate_up_pair_kernel<T, T, Bits, RW, Act>;
        if (smem > 48 * 1024)
            EHC_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        launch("gate_up_pair_kernel", kernel, dim3(unsigned(g.rows / 32), unsigned(slots)), 32 / RW * 32, smem,
               stream, xa, ids, g, u, act, out);
    });
    EHC_LAUNCHED("gate_up_pair_kernel");
}

}  // namespace ehcuda::detail
