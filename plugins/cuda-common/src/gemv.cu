// Weight-streaming GEMV for decode (and prefill of up to 8 tokens): one warp
// per group of R output rows (or KS warps per group, split over K, for short
// long-K matrices); lanes take 32-element chunks of the rows in turn, decode
// them in registers and dot them with every token's input, so each weight
// byte is read from device memory exactly once per call. A single token's
// input is staged once per block: int16 codes + scale per chunk for
// quantized weights (integer dot products), FP32 otherwise.
//
// The path of a call: matmul() picks GEMV, GEMM or the generic kernel by
// token count and shape; gemv() sends segments of one type to
// gemv_same_type (token groups of 8, 4, 2, 1, one launch_gemv<T, NT> each)
// and single-token segments of different integer-path types to
// launch_gemv_mixed. Both first offer a single token to the bulk-copy
// kernel (gemv_bulk.cu: bulk_takes, then plan_bulk sizes it); what it does
// not take runs gemv_kernel with plan_register's rows per warp and split-K.
// The choosers are host code in kernel_plan.cpp, reading the installed
// KernelPlan, so the load's log names the same kernels.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/prefill_workspace.hpp"
#include "ehcuda/quant_dp4a.cuh"
#include "gemv_stage.cuh"
#include "matmul_common.cuh"

namespace ehcuda {
namespace detail {

DevArgs to_dev(const MatmulArgs& a) {
    if (a.nseg < 1 || a.nseg > 3) throw ehp::Error(EH_INTERNAL, "matmul: nseg out of range");
    if (a.cols <= 0 || a.cols % 32) throw ehp::Error(EH_INTERNAL, "matmul: cols must be a positive multiple of 32");
    if (a.ntok < 1) throw ehp::Error(EH_INTERNAL, "matmul: ntok < 1");
    if (a.xmode == XMode::RmsNorm && (a.ntok != 1 || !a.norm_w))
        throw ehp::Error(EH_INTERNAL, "matmul: fused RMSNorm needs one token and a norm weight");
    if (a.xmode == XMode::Chunks && (a.ntok != 1 || gemv_input() == GemvInput::Float ||
                                     reinterpret_cast<uintptr_t>(a.x) % 16))
        throw ehp::Error(EH_INTERNAL, "matmul: chunk input needs one token, an integer GemvInput and a 16-byte aligned x");
    if (!a.x || !a.y) throw ehp::Error(EH_INTERNAL, "matmul: null input/output");
    if (a.ldx % 4 || a.cols * (a.xmode == XMode::SwiGLU ? 2 : 1) > a.ldx)
        throw ehp::Error(EH_INTERNAL, "matmul: ldx too small or not a multiple of 4");
    DevArgs d{};
    d.nseg = a.nseg;
    for (int s = 0; s < a.nseg; ++s) {
        const MatSeg& g = a.seg[s];
        if (!matmul_type_supported(g.w.type))
            throw ehp::Error(EH_UNSUPPORTED, "matmul: unsupported weight type " + ehp::type_name(g.w.type));
        // (A K-quant with 64 columns has row_bytes 0 on both sides: it once
        // passed the shape check below, and the kernels read past the rows.)
        const size_t rb = row_bytes(g.w.type, a.cols);
        if (rb == 0)
            throw ehp::Error(EH_UNSUPPORTED, "matmul: a row of " + std::to_string(a.cols) + " is not whole blocks of " +
                                                 ehp::type_name(g.w.type));
        if (g.w.cols != a.cols || g.w.row_bytes != rb)
            throw ehp::Error(EH_INTERNAL, "matmul: weight shape does not match input");
        if (g.out_offset + g.w.rows > a.ldy)
            throw ehp::Error(EH_INTERNAL, "matmul: output does not fit ldy");
        d.seg[s] = DevSeg{static_cast<const uint8_t*>(g.w.data), g.w.row_bytes, g.bias,
                          int(g.w.type), g.w.rows, g.out_offset};
        d.total_rows += g.w.rows;
    }
    d.cols = a.cols;
    d.x = a.x;
    d.ldx = a.ldx;
    d.xmode = int(a.xmode);
    d.norm_w = a.norm_w;
    d.norm_eps = a.norm_eps;
    d.y = a.y;
    d.ldy = a.ldy;
    d.accumulate = a.accumulate ? 1 : 0;
    d.ntok = a.ntok;
    const KernelPlan& p = plan();
    d.prefetch = (p.entry_prefetch ? 2 : 0) | (p.early_regs ? 4 : 0);
    return d;
}

}  // namespace detail

using detail::DevArgs;

namespace {

using detail::load_staged32;
using detail::load_staged_int;
using detail::stage_x;
using detail::stage_x_int;
using detail::staged_bytes;
using detail::staged_int_bytes;

constexpr int kWarps = 4;

// T of a single-token launch whose segments (Q, K, V of different quantized
// types, as Qwen2.5's Q4_K_M files mix Q5_0 and Q8_0) share one launch and
// one staged input: each warp decodes its own segment's type through a
// warp-uniform switch, one row per warp.
constexpr int kMixedTypes = -1;

// Weight type T (a compile-time constant, so each kernel gets only the
// registers its own format needs), NT tokens, R consecutive rows per warp.
// With R > 1 (single-token decode of tall matrices) each lane decodes the
// same chunk index of R rows against one register copy of the input chunk:
// the input is read once per R rows and R independent weight loads are in
// flight per lane.
// XB: input staged as float (0) or as int8/int16/int16x2 codes (8/16/32;
// single token, quantized weights only). (Two chunks per lane per iteration was
// tried: slower on an H100, e.g. Phi-3 decode 352 -> 309 tok/s.)
template <int T, int NT, int R, int KS, int XB = 0>
__global__ void __launch_bounds__(kWarps * 32, NT == 1 ? 6 : 4) gemv_kernel(DevArgs a) {
    // KS warps share a group of R rows, each taking every KS-th run of 32
    // chunks (split-K for short, wide matrices that would leave SMs idle);
    // partial sums are combined through shared memory in warp order.
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int ks = warp % KS;

    const int r0 = (blockIdx.x * (kWarps / KS) + warp / KS) * R;
    const bool active = r0 < a.total_rows;
    int s = 0, base = 0;
    if (active)
        while (s + 1 < a.nseg && r0 >= base + a.seg[s].rows) base += a.seg[s++].rows;
    const detail::DevSeg& g = a.seg[s];
    const int lr0 = r0 - base;
    const int nr = active ? min(R, g.rows - lr0) : 0;  // segments hold whole groups of R rows
    const uint8_t* w = g.w + size_t(active ? lr0 : 0) * g.row_bytes;
    const int nch = active ? a.cols / 32 : 0;

    // (Prefetching the warp's whole rows to L2 here, before pdl_entry() and
    // the staging, was measured on an H100: no faster, gpt-oss decode 375 ->
    // 361 tok/s; not kept.) Weights are never written by earlier kernels.
    // (Mixed-type launches, Qwen2.5's QKV, look their warp's type up.)
    constexpr bool kRegsEarly =
        XB == 0 && NT == 1 && R == 1 && (T == EH_TYPE_F32 || T == EH_TYPE_F16 || T == EH_TYPE_BF16);
    const int c0 = ks * 32 + lane;
    const bool have0 = kRegsEarly && (a.prefetch & 4) && c0 < nch;
    float w0[kRegsEarly ? 32 : 1];
    if constexpr (kRegsEarly)
        if (have0) load_chunk<T>(w, c0, w0);
    if ((a.prefetch & 2) && !have0 && ks * 32 + lane < nch) {
        const int type = T == kMixedTypes ? g.type : T;
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r < nr) prefetch_l2(chunk_ptr(type, w + size_t(r) * g.row_bytes, ks * 32 + lane));
    }
    pdl_entry();
    pdl_release();

    extern __shared__ float4 xs_raw[];
    float* xs = reinterpret_cast<float*>(xs_raw);
    const uint8_t* xq = reinterpret_cast<const uint8_t*>(xs_raw);
    float xscale = 1.0f;  // the RMSNorm factor integer staging leaves to the sums
    if constexpr (XB != 0) {
        // A producer's chunks are read where they are (L2-resident, a few KB).
        if (a.xmode == int(XMode::Chunks)) xq = reinterpret_cast<const uint8_t*>(a.x);
        else xscale = stage_x_int<XB>(a, reinterpret_cast<uint8_t*>(xs_raw));
    } else if constexpr (NT == 1)
        stage_x(a, xs);

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;

    for (int c = ks * 32 + lane; c < nch; c += 32 * KS) {
        // (An L2 request for the next iteration's chunks here cost bandwidth
        // on an H100: F16 77 % -> 55 % of copy bandwidth, int16-input Q4_K
        // 56 % -> 52 %; removed.)
        if constexpr (XB != 0) {
            XChunk<XB> x;
            load_staged_int<XB>(xq, c, x);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r >= nr) continue;
                if constexpr (T == kMixedTypes) acc[r][0] += dot_chunk_int_any(g.type, w + size_t(r) * g.row_bytes, c, x);
                else acc[r][0] += dot_chunk_int<T>(w + size_t(r) * g.row_bytes, c, x);
            }
        } else if constexpr (NT > 1) {
            float v[32];
            load_chunk<T>(w, c, v);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                float xv[32];
                detail::load_x32(a, t, c, xv);
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < 32; ++j) sum = fmaf(v[j], xv[j], sum);
                acc[0][t] += sum;
            }
        } else {
            float xv[32];
            load_staged32(xs, c, xv);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r < nr) {
                    float v[32];
                    if (have0 && c == c0) {
#pragma unroll
                        for (int j = 0; j < 32; ++j) v[j] = w0[j];
                    } else {
                        load_chunk<T>(w + size_t(r) * g.row_bytes, c, v);
                    }
                    float sum = 0.0f;
#pragma unroll
                    for (int j = 0; j < 32; ++j) sum = fmaf(v[j], xv[j], sum);
                    acc[r][0] += sum;
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
        }
    if constexpr (KS > 1) {
        __shared__ float part[kWarps][R * NT];
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int t = 0; t < NT; ++t) part[warp][r * NT + t] = acc[r][t];
        __syncthreads();
        if (ks != 0) return;
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    float sum = 0.0f;
                    for (int k = 0; k < KS; ++k) sum += part[warp + k][r * NT + t];
                    acc[r][t] = sum;
                }
    }
    if (lane == 0 && active) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r >= nr) break;
#pragma unroll
            for (int t = 0; t < NT; ++t)
                // (__fmul_rn: no fused multiply-add with the bias, so the
                // FFN pair kernel, which scales the same way, gets the same bits)
                detail::store_out(a, g, t, lr0 + r, XB != 0 ? __fmul_rn(acc[r][t], xscale) : acc[r][t]);
        }
    }
}

template <int T, int NT>
void launch_gemv(const DevArgs& d, cudaStream_t stream) {
    if (NT == 1 && detail::gemv_bulk(d, stream)) return;
    // Rows per warp and split-K (kernel_plan.cpp, plan_register).
    const RegisterLaunch rl = plan_register(plan(), NT, detail::shape_of(d));
    const int R = rl.rows_per_warp;
    const int groups = (d.total_rows + R - 1) / R;
    const bool split = rl.split_k;
    const int per_block = split ? 1 : kWarps;
    const GemvInput in = NT == 1 && has_int_input_path<T>() ? gemv_input() : GemvInput::Float;
    const bool chunks = d.xmode == int(XMode::Chunks);
    if (chunks && in == GemvInput::Float)
        throw ehp::Error(EH_UNSUPPORTED, "matmul: chunk input needs a weight type with an integer dot product");
    const size_t smem = chunks                     ? 0
                        : in == GemvInput::Int8    ? staged_int_bytes<8>(d.cols)
                        : in == GemvInput::Int16   ? staged_int_bytes<16>(d.cols)
                        : in == GemvInput::Int16x2 ? staged_int_bytes<32>(d.cols)
                        : NT == 1                  ? staged_bytes(d.cols)
                                                   : 0;
    const int nblk = (groups + per_block - 1) / per_block;
    auto go = [&](auto kernel) {
        allow_dynamic_smem(kernel, smem);
        const dim3 grid(nblk);
        launch("gemv_kernel", kernel, grid, kWarps * 32, smem, stream, d);
    };
    // Rows per warp as a template argument.
    auto by_rows = [&]<int NT_, int KS, int XB>() {
        if (R == 4) go(gemv_kernel<T, NT_, (NT_ == 1 ? 4 : 1), KS, XB>);
        else if (R == 2) go(gemv_kernel<T, NT_, (NT_ == 1 ? 2 : 1), KS, XB>);
        else go(gemv_kernel<T, NT_, 1, KS, XB>);
    };
    if (split) {
        if constexpr (NT == 1 && has_int_input_path<T>()) {
            if (in == GemvInput::Int8) by_rows.template operator()<1, kWarps, 8>();
            else if (in == GemvInput::Int16) by_rows.template operator()<1, kWarps, 16>();
            else if (in == GemvInput::Int16x2) by_rows.template operator()<1, kWarps, 32>();
            else by_rows.template operator()<1, kWarps, 0>();
        } else {
            by_rows.template operator()<NT, kWarps, 0>();
        }
    } else if constexpr (NT == 1 && has_int_input_path<T>()) {
        if (in == GemvInput::Int8) by_rows.template operator()<1, 1, 8>();
        else if (in == GemvInput::Int16) by_rows.template operator()<1, 1, 16>();
        else if (in == GemvInput::Int16x2) by_rows.template operator()<1, 1, 32>();
        else by_rows.template operator()<1, 1, 0>();
    } else {
        by_rows.template operator()<NT, 1, 0>();
    }
    EHC_LAUNCHED("gemv_kernel");
}

// Single token, segments of different integer-path types: one launch (see
// kMixedTypes), one row per warp.
void launch_gemv_mixed(const DevArgs& d, cudaStream_t stream) {
    const bool chunks = d.xmode == int(XMode::Chunks);
    if (detail::gemv_bulk(d, stream)) return;
    const int nblk = (d.total_rows + kWarps - 1) / kWarps;
    auto go = [&](auto kernel, size_t smem) {
        if (chunks) smem = 0;
        allow_dynamic_smem(kernel, smem);
        launch("gemv_kernel", kernel, dim3(nblk), kWarps * 32, smem, stream, d);
    };
    switch (gemv_input()) {
    case GemvInput::Int8: go(gemv_kernel<kMixedTypes, 1, 1, 1, 8>, staged_int_bytes<8>(d.cols)); break;
    case GemvInput::Int16: go(gemv_kernel<kMixedTypes, 1, 1, 1, 16>, staged_int_bytes<16>(d.cols)); break;
    case GemvInput::Int16x2: go(gemv_kernel<kMixedTypes, 1, 1, 1, 32>, staged_int_bytes<32>(d.cols)); break;
    default: throw ehp::Error(EH_INTERNAL, "gemv: mixed-type launch needs an integer input form");
    }
    EHC_LAUNCHED("gemv_kernel");
}

// One launch per group of segments sharing a type.
void gemv_same_type(const DevArgs& d, cudaStream_t stream) {
    detail::host_dispatch(d.seg[0].type, [&]<int T>() {
        // Token groups of 8, 4, 2, 1 (each group reads the weights once).
        for (int t0 = 0; t0 < d.ntok;) {
            const int left = d.ntok - t0;
            const int nt = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
            DevArgs g = d;
            g.x = d.x + size_t(t0) * d.ldx;
            g.y = d.y + size_t(t0) * d.ldy;
            g.ntok = nt;
            switch (nt) {
            case 8: launch_gemv<T, 8>(g, stream); break;
            case 4: launch_gemv<T, 4>(g, stream); break;
            case 2: launch_gemv<T, 2>(g, stream); break;
            default: launch_gemv<T, 1>(g, stream); break;
            }
            t0 += nt;
        }
    });
}

}  // namespace

GemvInput gemv_input() { return plan().gemv_input; }

size_t gemv_chunk_bytes(int n) {
    const size_t chunks = size_t(n > 0 ? n : 0) / 32;
    switch (gemv_input()) {
    case GemvInput::Int8: return chunks * detail::kIntStride<8>;
    case GemvInput::Int16: return chunks * detail::kIntStride<16>;
    case GemvInput::Int16x2: return chunks * detail::kIntStride<32>;
    default: return 0;
    }
}

bool gemv_takes_chunks(uint32_t type) {
    return gemv_input() != GemvInput::Float && matmul_type_supported(type) && int_input_type(type);
}

bool matmul_type_supported(uint32_t type) {
    switch (type) {
    case EH_TYPE_F32: case EH_TYPE_F16: case EH_TYPE_BF16: case EH_TYPE_Q4_0: case EH_TYPE_Q4_1:
    case EH_TYPE_Q5_0: case EH_TYPE_Q5_1: case EH_TYPE_Q8_0: case EH_TYPE_Q4_K: case EH_TYPE_Q5_K:
    case EH_TYPE_Q6_K: case EH_TYPE_Q2_K: case EH_TYPE_Q3_K: case EH_TYPE_IQ4_NL: case EH_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

size_t row_bytes(uint32_t type, int64_t cols) {
    eh_type_traits t = eh_tensor_type_traits(type);
    if (!matmul_type_supported(type) || cols <= 0 || t.block_elems == 0 || cols % t.block_elems)
        return 0;
    return size_t(cols / t.block_elems) * t.block_bytes;
}

void gemv(const MatmulArgs& a, cudaStream_t stream) {
    DevArgs d = detail::to_dev(a);
    bool same = true;
    for (int s = 1; s < d.nseg; ++s) same &= d.seg[s].type == d.seg[0].type;
    if (same) {
        gemv_same_type(d, stream);
        return;
    }
    bool mixed = d.ntok == 1 && gemv_input() != GemvInput::Float && plan().gemv_mixed;
    for (int s = 0; s < d.nseg; ++s) mixed &= mixed_launch_type(uint32_t(d.seg[s].type));
    if (mixed) {
        launch_gemv_mixed(d, stream);
        return;
    }
    for (int s = 0; s < d.nseg; ++s) {
        DevArgs one = d;
        one.nseg = 1;
        one.seg[0] = d.seg[s];
        one.total_rows = d.seg[s].rows;
        gemv_same_type(one, stream);
    }
}

// Up to 8 tokens the weight-streaming GEMV, unless the prefill workspace
// takes that many (a batched step whose model keeps FP16 weight mirrors
// lowers its threshold to 3): then, as for more tokens, gemm() (cuBLAS
// through the workspace, else the WMMA kernel).
void matmul(const MatmulArgs& a, cudaStream_t stream) {
    if (a.xmode == XMode::Chunks) return gemv(a, stream);  // to_dev checks the single-token shape
    if (matmul_needs_generic(a)) return matmul_generic(a, stream);
    if (a.ntok <= 8 && !(a.prefill && a.prefill->enabled_for(a.ntok)))
        gemv(a, stream);
    else
        gemm(a, stream);
}

}  // namespace ehcuda
