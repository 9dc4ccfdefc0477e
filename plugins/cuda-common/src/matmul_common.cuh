// Pieces shared by the GEMV and GEMM kernels.
#pragma once

#include <string>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/kernel_route.hpp"
#include "ehcuda/kernels.hpp"
#include "ehcuda/quant.cuh"

namespace ehcuda::detail {

// Kernel-side copy of MatmulArgs (plain pointers, passed by value).
struct DevSeg {
    const uint8_t* w;
    size_t row_bytes;
    const float* bias;
    int type;
    int rows;
    int out_offset;
};

struct DevArgs {
    DevSeg seg[3];
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
    int prefetch;  // bit 1: first chunks to L2 at entry (KernelPlan::entry_prefetch);
                   // bit 2: float weights' first chunk into registers at entry (early_regs, gemv_kernel)
    uint8_t* xq;   // a token group's scratch for its inputs quantized once (BulkLaunch::prequant), or null
};

// Output element (token t, segment row lr) of a matmul: the row's dot
// product `sum` plus its bias, stored or added to y. The epilogue of every
// matmul kernel, so they round alike.
__device__ __forceinline__ void store_out(const DevArgs& a, const DevSeg& g, int t, int lr, float sum) {
    float* dst = a.y + size_t(t) * a.ldy + g.out_offset + lr;
    const float val = sum + (g.bias ? g.bias[lr] : 0.0f);
    *dst = a.accumulate ? *dst + val : val;
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

// Elements [32c, 32c+32) of token t's input, with the SwiGLU fold applied.
__device__ __forceinline__ void load_x32(const DevArgs& a, int t, int c, float (&v)[32]) {
    const float4* p = reinterpret_cast<const float4*>(a.x + size_t(t) * a.ldx + 32 * c);
    if (a.xmode == int(XMode::SwiGLU)) {
        const float4* u = reinterpret_cast<const float4*>(a.x + size_t(t) * a.ldx + a.cols + 32 * c);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float4 g = p[i], q = u[i];
            v[4 * i] = silu(g.x) * q.x; v[4 * i + 1] = silu(g.y) * q.y;
            v[4 * i + 2] = silu(g.z) * q.z; v[4 * i + 3] = silu(g.w) * q.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float4 g = p[i];
            v[4 * i] = g.x; v[4 * i + 1] = g.y; v[4 * i + 2] = g.z; v[4 * i + 3] = g.w;
        }
    }
}

DevArgs to_dev(const MatmulArgs& a);

// The shape of a launch as the plan's choosers (kernel_plan.hpp) take it.
inline GemvShape shape_of(const DevArgs& d) {
    GemvShape g;
    g.nseg = d.nseg;
    for (int s = 0; s < d.nseg; ++s) {
        g.type[s] = uint32_t(d.seg[s].type);
        g.rows[s] = d.seg[s].rows;
        g.row_bytes[s] = d.seg[s].row_bytes;
    }
    g.cols = d.cols;
    return g;
}

// Single-token GEMV through the bulk copy engine (gemv_bulk.cu): the
// route's launch `k` (kernel_route.hpp: can_implement_bulk, plan_bulk).
void gemv_bulk(const DevArgs& d, const KernelLaunch& k, cudaStream_t stream);

// Host-side type dispatch: f.template operator()<T>().
template <class F>
void host_dispatch(int type, F&& f) {
    switch (type) {
    case EH_TYPE_F32: f.template operator()<EH_TYPE_F32>(); break;
    case EH_TYPE_F16: f.template operator()<EH_TYPE_F16>(); break;
    case EH_TYPE_BF16: f.template operator()<EH_TYPE_BF16>(); break;
    case EH_TYPE_Q4_0: f.template operator()<EH_TYPE_Q4_0>(); break;
    case EH_TYPE_Q4_1: f.template operator()<EH_TYPE_Q4_1>(); break;
    case EH_TYPE_Q5_0: f.template operator()<EH_TYPE_Q5_0>(); break;
    case EH_TYPE_Q5_1: f.template operator()<EH_TYPE_Q5_1>(); break;
    case EH_TYPE_Q8_0: f.template operator()<EH_TYPE_Q8_0>(); break;
    case EH_TYPE_Q4_K: f.template operator()<EH_TYPE_Q4_K>(); break;
    case EH_TYPE_Q5_K: f.template operator()<EH_TYPE_Q5_K>(); break;
    case EH_TYPE_Q6_K: f.template operator()<EH_TYPE_Q6_K>(); break;
    case EH_TYPE_Q2_K: f.template operator()<EH_TYPE_Q2_K>(); break;
    case EH_TYPE_Q3_K: f.template operator()<EH_TYPE_Q3_K>(); break;
    case EH_TYPE_IQ4_NL: f.template operator()<EH_TYPE_IQ4_NL>(); break;
    case EH_TYPE_IQ4_XS: f.template operator()<EH_TYPE_IQ4_XS>(); break;
    default: throw ehp::Error(EH_UNSUPPORTED, "matmul: unsupported weight type " + std::to_string(type));
    }
}

// host_dispatch plus MXFP4: the stored types the MoE kernels and the
// prefill dequantization decode. EH_UNSUPPORTED names `what` otherwise.
template <class F>
void host_dispatch_mxfp4(uint32_t type, const char* what, F&& f) {
    if (type == EH_TYPE_MXFP4) {
        f.template operator()<EH_TYPE_MXFP4>();
        return;
    }
    if (!matmul_type_supported(type))
        throw ehp::Error(EH_UNSUPPORTED, std::string(what) + ": unsupported weight type " + ehp::type_name(type));
    host_dispatch(int(type), f);
}

// f.template operator()<T>() for the weight types with an integer-input
// dot product (quant_dp4a.cuh); false for any other type.
template <class F>
bool int_type_dispatch(uint32_t type, F&& f) {
    switch (type) {
    case EH_TYPE_Q4_0: f.template operator()<EH_TYPE_Q4_0>(); return true;
    case EH_TYPE_Q4_1: f.template operator()<EH_TYPE_Q4_1>(); return true;
    case EH_TYPE_Q5_0: f.template operator()<EH_TYPE_Q5_0>(); return true;
    case EH_TYPE_Q5_1: f.template operator()<EH_TYPE_Q5_1>(); return true;
    case EH_TYPE_Q8_0: f.template operator()<EH_TYPE_Q8_0>(); return true;
    case EH_TYPE_Q4_K: f.template operator()<EH_TYPE_Q4_K>(); return true;
    case EH_TYPE_Q5_K: f.template operator()<EH_TYPE_Q5_K>(); return true;
    case EH_TYPE_Q6_K: f.template operator()<EH_TYPE_Q6_K>(); return true;
    case EH_TYPE_Q2_K: f.template operator()<EH_TYPE_Q2_K>(); return true;
    case EH_TYPE_Q3_K: f.template operator()<EH_TYPE_Q3_K>(); return true;
    case EH_TYPE_IQ4_NL: f.template operator()<EH_TYPE_IQ4_NL>(); return true;
    case EH_TYPE_IQ4_XS: f.template operator()<EH_TYPE_IQ4_XS>(); return true;
    case EH_TYPE_MXFP4: f.template operator()<EH_TYPE_MXFP4>(); return true;
    default: return false;
    }
}

// The same set, as a test (has_int_input_path<T>() at compile time).
inline bool int_type(uint32_t type) { return int_input_type(type); }

}  // namespace ehcuda::detail
