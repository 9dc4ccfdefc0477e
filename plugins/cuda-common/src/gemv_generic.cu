// Matmul for shapes the fast GEMV/GEMM kernels do not take: input widths
// that are not a multiple of 32 (stories260K's 172-wide FFN rows), inputs
// with an unaligned row stride or base. One warp per output row and token;
// lanes stride over the row, so any width works. It is a plain dot product
// per (row, token) with a fixed lane split and a fixed shuffle tree: correct
// and bitwise reproducible, not fast; the shapes that reach it are small.
//
// Float weights (F32/F16/BF16) are read element by element. Block-quantized
// weights always have whole 32-element chunks (legacy types: 32 a block;
// K-quants: 256), so lanes take whole chunks through load_chunk.
#include <cstdint>
#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "matmul_common.cuh"

namespace ehcuda {
namespace {

constexpr int kWarps = 4;  // output rows per block

struct GenSeg {
    const uint8_t* w;
    size_t row_bytes;
    const float* bias;
    int type;
    int rows;
    int out_offset;
};

struct GenArgs {
    GenSeg seg[3];
    int nseg;
    int total_rows;
    int cols;
    const float* x;
    int ldx;
    int xmode;
    const float* norm_w;
    float norm_eps;
    float* y;
    int ldy;
    int accumulate;
    int ntok;
};

// expf, not __expf: this path is about exactness, not speed.
__device__ __forceinline__ float silu_g(float v) { return v / (1.0f + expf(-v)); }

// Input element k of token t with the SwiGLU or RMSNorm fold applied
// (`scale` is the token's 1/rms for RmsNorm).
__device__ __forceinline__ float x_at(const GenArgs& a, const float* xr, int k, float scale) {
    if (a.xmode == int(XMode::SwiGLU)) return silu_g(xr[k]) * xr[k + a.cols];
    if (a.xmode == int(XMode::RmsNorm)) return xr[k] * scale * a.norm_w[k];
    return xr[k];
}

template <int T>
__device__ __forceinline__ float w_at(const uint8_t* row, int k) {
    if constexpr (T == EH_TYPE_F32) {
        return reinterpret_cast<const float*>(row)[k];
    } else if constexpr (T == EH_TYPE_F16) {
        return __half2float(reinterpret_cast<const __half*>(row)[k]);
    } else {
        const uint32_t bits = uint32_t(reinterpret_cast<const uint16_t*>(row)[k]) << 16;
        return __uint_as_float(bits);
    }
}

template <int T>
__device__ float row_dot(const GenArgs& a, const uint8_t* row, const float* xr, float scale, int lane) {
    float sum = 0.0f;
    if constexpr (T == EH_TYPE_F32 || T == EH_TYPE_F16 || T == EH_TYPE_BF16) {
        for (int k = lane; k < a.cols; k += 32) sum = fmaf(w_at<T>(row, k), x_at(a, xr, k, scale), sum);
    } else {
        for (int c = lane; c < a.cols / 32; c += 32) {
            float v[32];
            load_chunk<T>(row, c, v);
#pragma unroll
            for (int j = 0; j < 32; ++j) sum = fmaf(v[j], x_at(a, xr, 32 * c + j, scale), sum);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    return sum;
}

// grid.x: groups of kWarps rows (over all segments); grid.y strides tokens.
// All segments of a launch share the weight type T.
template <int T>
__global__ void __launch_bounds__(kWarps * 32) gemv_generic_kernel(GenArgs a) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * kWarps + (threadIdx.x >> 5);
    if (r >= a.total_rows) return;  // whole warps leave together
    int s = 0, base = 0;
    while (s + 1 < a.nseg && r >= base + a.seg[s].rows) base += a.seg[s++].rows;
    const GenSeg& g = a.seg[s];
    const int lr = r - base;
    const uint8_t* row = g.w + size_t(lr) * g.row_bytes;
    const float b = g.bias ? g.bias[lr] : 0.0f;
    for (int t = blockIdx.y; t < a.ntok; t += gridDim.y) {
        const float* xr = a.x + size_t(t) * a.ldx;
        float scale = 1.0f;
        if (a.xmode == int(XMode::RmsNorm)) {
            float ss = 0.0f;
            for (int k = lane; k < a.cols; k += 32) ss = fmaf(xr[k], xr[k], ss);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            scale = rsqrtf(ss / float(a.cols) + a.norm_eps);
        }
        const float val = row_dot<T>(a, row, xr, scale, lane) + b;
        if (lane == 0) {
            float* dst = a.y + size_t(t) * a.ldy + g.out_offset + lr;
            *dst = a.accumulate ? *dst + val : val;
        }
    }
}

GenArgs validate(const MatmulArgs& a) {
    if (a.nseg < 1 || a.nseg > 3) throw ehp::Error(EH_INTERNAL, "matmul_generic: nseg out of range");
    if (a.cols <= 0) throw ehp::Error(EH_INTERNAL, "matmul_generic: cols must be positive");
    if (a.ntok < 1) throw ehp::Error(EH_INTERNAL, "matmul_generic: ntok < 1");
    if (!a.x || !a.y) throw ehp::Error(EH_INTERNAL, "matmul_generic: null input/output");
    if (a.xmode == XMode::Chunks) throw ehp::Error(EH_INTERNAL, "matmul_generic: chunk input is for the single-token GEMV only");
    if (a.xmode == XMode::RmsNorm && !a.norm_w) throw ehp::Error(EH_INTERNAL, "matmul_generic: RMSNorm needs a norm weight");
    if (a.cols * (a.xmode == XMode::SwiGLU ? 2 : 1) > a.ldx)
        throw ehp::Error(EH_INTERNAL, "matmul_generic: ldx " + std::to_string(a.ldx) + " too small for cols " +
                                          std::to_string(a.cols));
    GenArgs d{};
    d.nseg = a.nseg;
    for (int s = 0; s < a.nseg; ++s) {
        const MatSeg& g = a.seg[s];
        if (!matmul_type_supported(g.w.type))
            throw ehp::Error(EH_UNSUPPORTED, "matmul: unsupported weight type " + ehp::type_name(g.w.type));
        const size_t rb = row_bytes(g.w.type, a.cols);
        if (rb == 0)
            throw ehp::Error(EH_UNSUPPORTED, "matmul: a row of " + std::to_string(a.cols) + " is not whole blocks of " +
                                                 ehp::type_name(g.w.type));
        if (g.w.cols != a.cols || g.w.row_bytes != rb) throw ehp::Error(EH_INTERNAL, "matmul_generic: weight shape does not match input");
        if (g.w.rows < 1 || g.out_offset < 0 || g.out_offset + g.w.rows > a.ldy)
            throw ehp::Error(EH_INTERNAL, "matmul_generic: output does not fit ldy");
        if (g.w.type != a.seg[0].w.type) throw ehp::Error(EH_INTERNAL, "matmul_generic: mixed types (split by caller)");
        d.seg[s] = GenSeg{static_cast<const uint8_t*>(g.w.data), rb, g.bias, int(g.w.type), g.w.rows, g.out_offset};
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
    return d;
}

void launch_one(const MatmulArgs& a, cudaStream_t stream) {
    const GenArgs d = validate(a);
    const dim3 grid((d.total_rows + kWarps - 1) / kWarps, unsigned(d.ntok < 65535 ? d.ntok : 65535));
    detail::host_dispatch(d.seg[0].type, [&]<int T>() {
        gemv_generic_kernel<T><<<grid, kWarps * 32, 0, stream>>>(d);
    });
    EHC_LAUNCHED("gemv_generic_kernel");
    detail::note_launch("gemv_generic_kernel", grid, dim3(kWarps * 32), 0);
}

}  // namespace

bool matmul_needs_generic(const MatmulArgs& a) {
    // The fast kernels read the input as float4 runs of 32-element chunks
    // (x, every token row and the SwiGLU up half 16-byte aligned) and take
    // only whole 32-element chunks of each weight row.
    if (a.cols <= 0 || a.cols % 32) return true;
    if (a.ldx % 4 || reinterpret_cast<uintptr_t>(a.x) % 16) return true;
    // (a fused RMSNorm of several tokens: the route's choice, route_matmul,
    // token groups under bulk_group_norm, else this kernel)
    return false;
}

void matmul_generic(const MatmulArgs& a, cudaStream_t stream) {
    bool same = true;
    for (int s = 1; s < a.nseg && s < 3; ++s) same &= a.seg[s].w.type == a.seg[0].w.type;
    if (same) {
        launch_one(a, stream);
        return;
    }
    for (int s = 0; s < a.nseg && s < 3; ++s) {
        MatmulArgs one = a;
        one.nseg = 1;
        one.seg[0] = a.seg[s];
        launch_one(one, stream);
    }
}

}  // namespace ehcuda
