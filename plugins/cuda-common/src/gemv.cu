// Weight-streaming GEMV for decode (and prefill of up to 8 tokens): one warp
// per output row; lanes take 32-element chunks of the row in turn, decode
// them in registers and dot them with every token's input, so each weight
// byte is read from device memory exactly once per call.
#include <string>

#include "ehcuda/check.hpp"
#include "matmul_common.cuh"

namespace ehcuda {
namespace detail {

DevArgs to_dev(const MatmulArgs& a) {
    if (a.nseg < 1 || a.nseg > 3) throw ehp::Error(EH_INTERNAL, "matmul: nseg out of range");
    if (a.cols <= 0 || a.cols % 32) throw ehp::Error(EH_INTERNAL, "matmul: cols must be a positive multiple of 32");
    if (a.ntok < 1) throw ehp::Error(EH_INTERNAL, "matmul: ntok < 1");
    if (!a.x || !a.y) throw ehp::Error(EH_INTERNAL, "matmul: null input/output");
    if (a.ldx % 4 || a.cols * (a.xmode == XMode::SwiGLU ? 2 : 1) > a.ldx)
        throw ehp::Error(EH_INTERNAL, "matmul: ldx too small or not a multiple of 4");
    DevArgs d{};
    d.nseg = a.nseg;
    for (int s = 0; s < a.nseg; ++s) {
        const MatSeg& g = a.seg[s];
        if (!matmul_type_supported(g.w.type))
            throw ehp::Error(EH_UNSUPPORTED, "matmul: unsupported weight type " + ehp::type_name(g.w.type));
        if (g.w.cols != a.cols || g.w.row_bytes != row_bytes(g.w.type, a.cols))
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
    d.y = a.y;
    d.ldy = a.ldy;
    d.accumulate = a.accumulate ? 1 : 0;
    d.ntok = a.ntok;
    return d;
}

}  // namespace detail

using detail::DevArgs;

namespace {

constexpr int kWarps = 4;

template <int NT>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(DevArgs a) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * kWarps + (threadIdx.x >> 5);
    if (r >= a.total_rows) return;
    int s = 0, base = 0;
    while (s + 1 < a.nseg && r >= base + a.seg[s].rows) base += a.seg[s++].rows;
    const detail::DevSeg& g = a.seg[s];
    const int lr = r - base;
    const uint8_t* w = g.w + size_t(lr) * g.row_bytes;
    const int nch = a.cols / 32;

    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;

    dispatch_type(g.type, [&]<int T>() {
        for (int c = lane; c < nch; c += 32) {
            float v[32];
            load_chunk<T>(w, c, v);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                float xv[32];
                detail::load_x32(a, t, c, xv);
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < 32; ++j) sum = fmaf(v[j], xv[j], sum);
                acc[t] += sum;
            }
        }
    });

#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
    }
    if (lane == 0) {
        float b = g.bias ? g.bias[lr] : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            float* dst = a.y + size_t(t) * a.ldy + g.out_offset + lr;
            float val = acc[t] + b;
            *dst = a.accumulate ? *dst + val : val;
        }
    }
}

template <int NT>
void launch(const DevArgs& d, cudaStream_t stream) {
    dim3 grid((d.total_rows + kWarps - 1) / kWarps);
    gemv_kernel<NT><<<grid, kWarps * 32, 0, stream>>>(d);
    EHC_LAUNCHED("gemv_kernel");
}

}  // namespace

bool matmul_type_supported(uint32_t type) {
    switch (type) {
    case EH_TYPE_F32: case EH_TYPE_F16: case EH_TYPE_BF16: case EH_TYPE_Q4_0: case EH_TYPE_Q4_1:
    case EH_TYPE_Q5_0: case EH_TYPE_Q5_1: case EH_TYPE_Q8_0: case EH_TYPE_Q4_K: case EH_TYPE_Q5_K:
    case EH_TYPE_Q6_K:
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
    // Longer batches are split into groups of at most 8 tokens.
    for (int t0 = 0; t0 < a.ntok; t0 += 8) {
        DevArgs g = d;
        g.x = d.x + size_t(t0) * d.ldx;
        g.y = d.y + size_t(t0) * d.ldy;
        g.ntok = a.ntok - t0 < 8 ? a.ntok - t0 : 8;
        switch (g.ntok) {
        case 1: launch<1>(g, stream); break;
        case 2: launch<2>(g, stream); break;
        case 3: launch<3>(g, stream); break;
        case 4: launch<4>(g, stream); break;
        case 5: launch<5>(g, stream); break;
        case 6: launch<6>(g, stream); break;
        case 7: launch<7>(g, stream); break;
        default: launch<8>(g, stream); break;
        }
    }
}

void matmul(const MatmulArgs& a, cudaStream_t stream) {
    if (a.ntok <= 8)
        gemv(a, stream);
    else
        gemm(a, stream);
}

}  // namespace ehcuda
