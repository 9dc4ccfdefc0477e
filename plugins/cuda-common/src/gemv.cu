// Weight-streaming GEMV for decode (and prefill of up to 8 tokens): one warp
// per group of R output rows (or KS warps per group, split over K, for short
// long-K matrices); lanes take 32-element chunks of the rows in turn, decode
// them in registers and dot them with every token's input, so each weight
// byte is read from device memory exactly once per call. A single token's
// input is staged once per block: int16 codes + scale per chunk for
// quantized weights (integer dot products), FP32 otherwise.
//
// The path of a call is its route (kernel_route.hpp, route_matmul: host
// code reading the installed KernelPlan, so the load's log and `inspect
// --kernels` name the same kernels): the generic kernel, the GEMM, or GEMV
// launches, each the bulk-copy kernel (gemv_bulk.cu), gemv_kernel over
// segments of one type in token groups of 8, 4, 2, 1 (launch_gemv<T, NT>)
// or over single-token segments of different types (launch_gemv_mixed).
// The launchers here only turn a route's launches into template arguments
// and grids.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/kernel_route.hpp"
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
    // (several tokens with a fused RMSNorm reach these kernels only as token
    // groups under bulk_group_norm: route_matmul sends the rest to the
    // generic kernel)
    if (a.xmode == XMode::RmsNorm && (a.ntok > kBulkMaxTokens || !a.norm_w))
        throw ehp::Error(EH_INTERNAL, "matmul: fused RMSNorm needs at most a token group and a norm weight");
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
    d.xq = a.prefill ? reinterpret_cast<uint8_t*>(a.prefill->act()) : nullptr;
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

// One register-kernel launch of the route: its rows per warp, split-K and
// input form.
template <int T, int NT>
void launch_gemv(const DevArgs& d, const KernelLaunch& k, cudaStream_t stream) {
    const int R = k.reg.rows_per_warp;
    const int groups = (d.total_rows + R - 1) / R;
    const bool split = k.reg.split_k;
    const int per_block = split ? 1 : kWarps;
    const GemvInput in = k.input;
    if (in != GemvInput::Float && !(NT == 1 && has_int_input_path<T>()))
        throw ehp::Error(EH_INTERNAL, "gemv: integer input for a launch without an integer dot product");
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
void launch_gemv_mixed(const DevArgs& d, const KernelLaunch& k, cudaStream_t stream) {
    const bool chunks = d.xmode == int(XMode::Chunks);
    const int nblk = (d.total_rows + kWarps - 1) / kWarps;
    auto go = [&](auto kernel, size_t smem) {
        if (chunks) smem = 0;
        allow_dynamic_smem(kernel, smem);
        launch("gemv_kernel", kernel, dim3(nblk), kWarps * 32, smem, stream, d);
    };
    switch (k.input) {
    case GemvInput::Int8: go(gemv_kernel<kMixedTypes, 1, 1, 1, 8>, staged_int_bytes<8>(d.cols)); break;
    case GemvInput::Int16: go(gemv_kernel<kMixedTypes, 1, 1, 1, 16>, staged_int_bytes<16>(d.cols)); break;
    case GemvInput::Int16x2: go(gemv_kernel<kMixedTypes, 1, 1, 1, 32>, staged_int_bytes<32>(d.cols)); break;
    default: throw ehp::Error(EH_INTERNAL, "gemv: mixed-type launch needs an integer input form");
    }
    EHC_LAUNCHED("gemv_kernel");
}

// The route's launches: each over its segments, `reps` times over
// successive token groups.
void launch_route(const DevArgs& d, const MatmulRoute& r, cudaStream_t stream) {
    for (const KernelLaunch& k : r) {
        DevArgs sub = d;
        if (k.seg0 != 0 || k.nseg != d.nseg) {
            sub.nseg = k.nseg;
            sub.total_rows = 0;
            for (int s = 0; s < k.nseg; ++s) {
                sub.seg[s] = d.seg[k.seg0 + s];
                sub.total_rows += sub.seg[s].rows;
            }
        }
        for (int i = 0; i < k.reps; ++i) {
            const int t0 = k.tok0 + i * k.ntok;
            DevArgs g = sub;
            g.x = d.x + size_t(t0) * d.ldx;
            g.y = d.y + size_t(t0) * d.ldy;
            g.ntok = k.ntok;
            switch (k.kernel) {
            case RouteKernel::GemvBulk:
            case RouteKernel::GemvBulkRing: detail::gemv_bulk(g, k, stream); break;
            case RouteKernel::GemvMixed: launch_gemv_mixed(g, k, stream); break;
            case RouteKernel::Gemv:
                detail::host_dispatch(g.seg[0].type, [&]<int T>() {
                    switch (k.ntok) {
                    case 8: launch_gemv<T, 8>(g, k, stream); break;
                    case 4: launch_gemv<T, 4>(g, k, stream); break;
                    case 2: launch_gemv<T, 2>(g, k, stream); break;
                    case 1: launch_gemv<T, 1>(g, k, stream); break;
                    default: throw ehp::Error(EH_INTERNAL, "gemv: a token group of " + std::to_string(k.ntok));
                    }
                });
                break;
            default: throw ehp::Error(EH_INTERNAL, std::string("gemv: a route to ") + route_kernel_name(k.kernel));
            }
        }
    }
}

DeviceTraits device_traits() { return DeviceTraits{detail::cc_major(), 0, detail::sm_count()}; }

// The route's view of a call.
MatmulShape matmul_shape(const MatmulArgs& a) {
    if (a.nseg < 1 || a.nseg > 3) throw ehp::Error(EH_INTERNAL, "matmul: nseg out of range");
    MatmulShape m;
    m.g = gemv_shape(a.seg, a.nseg);
    m.g.cols = a.cols;
    m.ntok = a.ntok;
    m.chunk_input = a.xmode == XMode::Chunks;
    m.rms_norm = a.xmode == XMode::RmsNorm;
    m.aligned = !matmul_needs_generic(a);
    m.prefill_min_tokens = a.prefill ? a.prefill->min_tokens() : 0;
    m.token_scratch = a.prefill ? a.prefill->act_halves() * sizeof(__half) : 0;
    return m;
}

void note_route(const MatmulShape& m, const MatmulRoute& r) {
    if (LaunchRecorder* rec = detail::launch_recorder()) rec->route(m, r);
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

bool gemv_takes_chunks(uint32_t type) { return takes_chunks(plan(), type); }

void gemv(const MatmulArgs& a, cudaStream_t stream) {
    const DevArgs d = detail::to_dev(a);
    const MatmulShape m = matmul_shape(a);
    const MatmulRoute r = route_gemv(plan(), device_traits(), m);
    note_route(m, r);
    launch_route(d, r, stream);
}

bool matmul_groups_tokens(const MatmulArgs& a) {
    if (a.nseg < 1 || a.nseg > 3 || matmul_needs_generic(a)) return false;
    return !can_implement_bulk_groups(plan(), device_traits(), matmul_shape(a));
}

// What route_matmul says: the weight-streaming GEMV for up to 8 tokens
// unless the prefill workspace takes that many (a batched step lowers its
// threshold to the plan's batch_gemv_per_token + 1), the GEMM (cuBLAS
// through the workspace, else the tensor-core kernel) for more, the generic
// kernel for inputs not in the fast kernels' form.
void matmul(const MatmulArgs& a, cudaStream_t stream) {
    const MatmulShape m = matmul_shape(a);
    const MatmulRoute r = route_matmul(plan(), device_traits(), m);
    note_route(m, r);
    switch (r.launch[0].kernel) {
    case RouteKernel::Generic: return matmul_generic(a, stream);
    case RouteKernel::Cublas:
    case RouteKernel::Wmma: return gemm(a, stream);
    default: return launch_route(detail::to_dev(a), r, stream);
    }
}

}  // namespace ehcuda
