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

#include <algorithm>
#include <type_traits>

#include "block_reduce.cuh"
#include "bulk_copy.cuh"
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
// The experts' activation, plain or gpt-oss's clamped form (moe_common.cuh).
struct ExpertSwiGlu {
    float alpha, limit;
    __device__ float operator()(float g, float u) const { return expert_swiglu(g, u, alpha, limit); }
};

// How a warp's rows reach it. slots 0: each lane loads its chunks through
// registers, one chunk per row in flight (the latency bound measured on
// gemv_kernel). slots > 0 (sm_90): the rows arrive through the bulk copy
// engine (bulk_copy.cuh) in slices of 32 chunks, one per lane, `slots`
// slices per warp in flight; a row's chunks are still dotted in the same
// order (lane = chunk within the slice), so both forms give the same bits.
struct PairSlices {
    int slots;       // slices in flight per warp; 0: registers
    int row_stride;  // shared bytes per row of a slice, a multiple of 16
    int x_bytes;     // shared bytes of the staged input, a multiple of 16
};
constexpr int kPairSliceChunks = 32;
constexpr int kPairMaxSlots = 4;

// Blocks per multiprocessor the kernel is compiled for (its register
// bound). MXFP4 at RW 4: 3, <= 85 registers, no spills (its reader
// otherwise took 95 and the MoE decode ran at 2 blocks per SM; the K-quant
// types would spill under that bound, so they keep theirs). int16 input at
// RW 2 (16 warps): 2, <= 64 registers, so two blocks share a
// multiprocessor (at 72-107 registers one 512-thread block had it alone,
// and Qwen2.5-0.5B's 152 blocks took two waves), wherever ptxas -v shows
// no spills at 64: not Q5_K, Q6_K, Q3_K, Q5_0's bulk form nor Q2_K's register
// form (128 bytes of spills).
template <int TG, int Bits, int RW, bool Bulk>
constexpr int pair_min_blocks() {
    if (RW == 4 && TG == EH_TYPE_MXFP4) return 3;
    // The MoE decode's form (register, int16 input with residues, 8-warp
    // blocks): 2, <= 128 registers (Q4_K took 181, Q6_K 252: one block per
    // multiprocessor, so Qwen3-30B-A3B's 192 blocks ran in two waves), no
    // spills but for Q5_K.
    if (RW == 4 && Bits == 32 && !Bulk && TG != EH_TYPE_Q5_K) return 2;
    if (RW == 2 && Bits == 16 && TG != EH_TYPE_Q5_K && TG != EH_TYPE_Q6_K && TG != EH_TYPE_Q3_K &&
        !(Bulk && TG == EH_TYPE_Q5_0) && !(!Bulk && TG == EH_TYPE_Q2_K))
        return 2;
    return 1;
}

// Grid (n_ff / 32, slots). Slot s uses expert ids[s] (ids NULL: expert 0;
// route.logits set: the expert the block's own routing ranks s-th, see
// FusedRoute) and writes chunk blockIdx.x of its row of chunks in `out`;
// with the experts' activation, a negative ids[s] leaves the slot's chunks
// unwritten.
template <int TG, int TU, int Bits, int RW, class Act, bool Bulk>
__global__ void __launch_bounds__(32 / RW * 32, pair_min_blocks<TG, Bits, RW, Bulk>()) gate_up_pair_kernel(DevArgs xa, const int32_t* ids,
                                                                       FusedRoute route,
                                                                       moe_detail::DevMat g, moe_detail::DevMat u,
                                                                       Act act, uint8_t* out, PairSlices ps) {
    constexpr int kRows = 2 * RW;  // a warp's rows: RW of gate, then the same RW of up
    const int slot = blockIdx.y, chunk = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = chunk * 32 + warp * RW;
    const int nch = xa.cols / 32;
    extern __shared__ int4 smem_raw[];
    uint8_t* xs = reinterpret_cast<uint8_t*>(smem_raw);
    __shared__ float vals[32];
    __shared__ uint64_t bars[Bulk ? 32 / RW : 1][kPairMaxSlots];
    const int nsl = (nch + kPairSliceChunks - 1) / kPairSliceChunks;
    const int ns = Bulk ? min(ps.slots, nsl) : 1;  // (1: unused by the register form)
    uint8_t* mine = xs + ps.x_bytes + size_t(warp) * ns * kRows * ps.row_stride;
    // Lane i < kRows issues row i's slices.
    const uint8_t* my_row = nullptr;
    const uint8_t* my_limit = nullptr;
    // slice s into slot k (= s % ns, which the caller keeps as a counter:
    // ns is known at run time only, and a division per slice cost ~30
    // instructions of the loop's ~420)
    auto issue = [&](int s, int k) {
        const int c0 = s * kPairSliceChunks, c1 = min(nch, c0 + kPairSliceChunks);
        const bool gate = lane < RW;
        const size_t o0 = gate ? chunk_run_offset<TG>(c0) : chunk_run_offset<TU>(c0);
        const size_t o1 = c1 == nch ? (gate ? g.row_bytes : u.row_bytes)
                                    : (gate ? chunk_run_offset<TG>(c1) : chunk_run_offset<TU>(c1));
        bulk_range_issue(&bars[warp][k], mine + (size_t(k) * kRows + lane) * ps.row_stride, my_row + o0, o1 - o0,
                         my_limit);
    };
    if constexpr (Bulk) {
        // A dense FFN (the bulk form's only user): its rows are in flight
        // before pdl_entry(), as weights are never written.
        if (lane == 0)
            for (int k = 0; k < ns; ++k) mbar_init(&bars[warp][k], kRows);
        __syncwarp();
        if (lane < kRows) {
            const bool gate = lane < RW;
            my_row = gate ? moe_detail::row_ptr(g, 0, r0 + lane) : moe_detail::row_ptr(u, 0, r0 + lane - RW);
            my_limit = gate ? moe_detail::row_ptr(g, 0, g.rows) : moe_detail::row_ptr(u, 0, u.rows);
            for (int s = 0; s < ns; ++s) issue(s, s);
        }
    } else if constexpr (TG != EH_TYPE_MXFP4) {
        // A dense FFN (no expert ids, which an earlier kernel writes) knows
        // its rows before pdl_entry(): each lane asks L2 for its first chunk
        // of them, as the GEMV does, so the staging below overlaps that fetch.
        if (!ids && (xa.prefetch & 2) && lane < nch) {
#pragma unroll
            for (int i = 0; i < RW; ++i) {
                prefetch_l2(chunk_ptr<TG>(moe_detail::row_ptr(g, 0, r0 + i), lane));
                prefetch_l2(chunk_ptr<TU>(moe_detail::row_ptr(u, 0, r0 + i), lane));
            }
        }
    }
    pdl_entry();
    if (!ids && !route.logits) pdl_release();  // (a dense FFN; see launch.cuh)
    int e = ids ? ids[slot] : 0;
    if (route.logits) {
        // The block's own routing of the predecessor's logits (bitwise
        // moe_route's), published to the block by the barrier.
        __shared__ int32_t routed[32];
        if (warp == 0) {
            int id;
            float wt;
            route_warp(route.logits, route.n_expert, route.k, lane, id, wt);
            if (lane < route.k) {
                routed[lane] = id;
                if (blockIdx.x == 0 && blockIdx.y == 0) {
                    route.ids[lane] = id;
                    route.weights[lane] = wt;
                }
            }
        }
        __syncthreads();
        e = routed[slot];
    }
    // The experts' form: a slot routed away from this rank (expert
    // parallelism marks it -1, moe_expert_range.hpp) reads no rows and
    // writes no chunk; the down kernel skips it too. (A dense FFN's
    // instances have no such branch.)
    if constexpr (std::is_same_v<Act, ExpertSwiGlu>)
        if (e < 0) return;
    const uint8_t* gw = moe_detail::row_ptr(g, e, r0);
    const uint8_t* uw = moe_detail::row_ptr(u, e, r0);
    const float xscale = stage_x_int<Bits>(xa, xs);

    float ag[RW] = {}, au[RW] = {};
    if constexpr (Bulk) {
        int k = 0;           // s % ns
        uint32_t phase = 0;  // (s / ns) & 1
        for (int s = 0; s < nsl; ++s) {
            const int c0 = s * kPairSliceChunks, c = c0 + lane;
            mbar_wait(&bars[warp][k], phase);
            __syncwarp();
            if (c < nch) {
                XChunk<Bits> x;
                load_staged_int<Bits>(xs, c, x);
                const uint8_t* base = mine + size_t(k) * kRows * ps.row_stride;
                const size_t og = chunk_run_offset<TG>(c0), ou = chunk_run_offset<TU>(c0);
#pragma unroll
                for (int i = 0; i < RW; ++i) {
                    const uintptr_t mg = (reinterpret_cast<uintptr_t>(gw + size_t(i) * g.row_bytes) + og) & 15;
                    const uintptr_t mu = (reinterpret_cast<uintptr_t>(uw + size_t(i) * u.row_bytes) + ou) & 15;
                    ag[i] += dot_chunk_int<TG, true>(base + size_t(i) * ps.row_stride + mg, lane, x);
                    au[i] += dot_chunk_int<TU, true>(base + size_t(RW + i) * ps.row_stride + mu, lane, x);
                }
            }
            if (s + ns < nsl) {
                // this warp's reads of the slot before the copy engine's refill
                fence_async_shared();
                __syncwarp();
                if (lane < kRows) issue(s + ns, k);
            }
            if (++k == ns) {
                k = 0;
                phase ^= 1u;
            }
        }
    } else {
        for (int c = lane; c < nch; c += 32) {
            XChunk<Bits> x;
            load_staged_int<Bits>(xs, c, x);
#pragma unroll
            for (int i = 0; i < RW; ++i) {
                ag[i] += dot_chunk_int<TG>(gw + size_t(i) * g.row_bytes, c, x);
                au[i] += dot_chunk_int<TU>(uw + size_t(i) * u.row_bytes, c, x);
            }
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

// Slices per warp in flight for the bulk form (KernelPlan::pair_slots; 0
// gives the register form).
inline int pair_slots() { return std::clamp(plan().pair_slots, 0, kPairMaxSlots); }

// Whether the bulk form serves a dense FFN's gate and up of `cols` inputs:
// on sm_90 with the bulk kernels on (KernelPlan::gemv_bulk), for rows of more than
// one slice. Measured on an H100 (decode tok/s, register form -> bulk form
// with 2 slices in flight): Phi-3 (3 slices per row) 539 -> 562 at 4 rows
// per warp (535 at 2: 16-warp blocks take 100-128 registers per thread, one
// block per multiprocessor); Qwen2.5-0.5B (one slice) 1,405 -> 1,389 / 1,352.
// The MoE experts keep the register form: gpt-oss-20b 455 -> 431.
inline bool pair_bulk(int cols) {
    return plan().gemv_bulk && cc_major() >= 9 && pair_slots() > 0 && cols / 32 > kPairSliceChunks;
}

// Whether gate_up_pair_kernel at RW 2 (16 warps) for gate and up of `type`
// is compiled for two blocks per multiprocessor (pair_min_blocks).
inline bool pair_rw2_shares_sm(uint32_t type, int bits, bool bulk) {
    bool two = false;
    if (bits == 16)
        int_type_dispatch(type, [&]<int T>() {
            two = (bulk ? pair_min_blocks<T, 16, 2, true>() : pair_min_blocks<T, 16, 2, false>()) == 2;
        });
    return two;
}

// gate_up_pair_kernel<T, T, Bits, RW, Act, bulk> over `slots` block rows,
// for gate and up of one integer-path type (the caller checked) and g.rows
// % 32 == 0; RW 4 or 2 (8 or 16 warps). The bulk form (pair_bulk) serves
// dense FFNs only (ids NULL), takes no MXFP4 and falls back to the register
// form where its shared memory would not fit. With `warps_per_sm` set:
// no launch, the warps per multiprocessor this launch would run at.
template <int Bits, int RW, class Act>
void launch_gate_up_pair(uint32_t type, const DevArgs& xa, const int32_t* ids, const moe_detail::DevMat& g,
                         const moe_detail::DevMat& u, Act act, uint8_t* out, int slots, bool bulk,
                         cudaStream_t stream, const FusedRoute& route = {}, int* warps_per_sm = nullptr) {
    constexpr int kWarps = 32 / RW;
    const size_t x_bytes = (staged_int_bytes<Bits>(xa.cols) + 15) / 16 * 16;
    const int nsl = (xa.cols / 32 + kPairSliceChunks - 1) / kPairSliceChunks;
    if (bulk && (ids || route.logits)) throw ehp::Error(EH_INTERNAL, "gate_up_pair: the bulk form serves dense FFNs only");
    int_type_dispatch(type, [&]<int T>() {
        PairSlices ps{0, 0, int(x_bytes)};
        if constexpr (T != EH_TYPE_MXFP4) {
            if (bulk) {
                ps.row_stride = int((chunk_run_offset<T>(kPairSliceChunks) + 15) / 16 * 16 + 16);
                ps.slots = std::min(pair_slots(), nsl);
                while (ps.slots > 0 && x_bytes + size_t(kWarps) * ps.slots * 2 * RW * ps.row_stride > kBulkMaxSmem)
                    --ps.slots;
            }
        }
        const size_t smem = x_bytes + size_t(kWarps) * ps.slots * 2 * RW * ps.row_stride;
        auto go = [&](auto kernel) {
            allow_dynamic_smem(kernel, smem);
            if (warps_per_sm) {
                int blocks = 0;
                EHC_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, smem));
                *warps_per_sm = blocks * kWarps;
                return;
            }
            launch("gate_up_pair_kernel", kernel, dim3(unsigned(g.rows / 32), unsigned(slots)), kWarps * 32, smem,
                   stream, xa, ids, route, g, u, act, out, ps);
        };
        if constexpr (T != EH_TYPE_MXFP4)
            if (ps.slots > 0) return go(gate_up_pair_kernel<T, T, Bits, RW, Act, true>);
        go(gate_up_pair_kernel<T, T, Bits, RW, Act, false>);
    });
    if (!warps_per_sm) EHC_LAUNCHED("gate_up_pair_kernel");
}

}  // namespace ehcuda::detail
