// moe_route_decode (moe.hpp): one token's router logits and its routing in
// one launch. Block e computes expert e's logit: 4 warps split the router
// row's chunks (warp w takes every 4th run of 32) against the token's input
// staged once per block (the pre-norm folded in), the GEMV's split-K order
// and block size, so the logits are the GEMV's to the bit. The block that
// finishes last (a counter every block bumps after its logit is visible;
// that block returns it to zero, so a captured graph replays) routes with
// moe_route's top-k and softmax (route_token), instead of a second launch
// per layer.
#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/moe.hpp"
#include "gemv_stage.cuh"
#include "moe_common.cuh"

namespace ehcuda {
namespace {

constexpr int kWarps = 4;

template <int T>
__global__ void __launch_bounds__(kWarps * 32) route_decode_kernel(detail::DevArgs xa, const uint8_t* w, size_t row_bytes,
                                                                   const float* bias, int n_expert, int k,
                                                                   float* logits, int32_t* ids, float* wts,
                                                                   uint32_t* counter) {
    pdl_entry();
    extern __shared__ float4 xs_raw[];
    float* xs = reinterpret_cast<float*>(xs_raw);
    detail::stage_x(xa, xs);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.x;
    const uint8_t* row = w + size_t(e) * row_bytes;
    float acc = 0.0f;
    for (int c = warp * 32 + lane; c < xa.cols / 32; c += 32 * kWarps) {
        float wv[32], xv[32];
        load_chunk<T>(row, c, wv);
        detail::load_staged32(xs, c, xv);
        float sum = 0.0f;  // per chunk, then into acc, as the GEMV does
#pragma unroll
        for (int j = 0; j < 32; ++j) sum = fmaf(wv[j], xv[j], sum);
        acc += sum;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ float part[kWarps];
    __shared__ bool last;
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int i = 0; i < kWarps; ++i) sum += part[i];
        logits[e] = sum + (bias ? bias[e] : 0.0f);
        __threadfence();  // this block's logit before its count
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // every block's logit before reading them
    if (warp == 0) moe_detail::route_token(logits, n_expert, k, ids, wts);
    if (threadIdx.x == 0) *counter = 0;
}

}  // namespace

bool moe_route_decode_supported(const WeightRef& router, int k) {
    return matmul_type_supported(router.type) && router.rows >= 1 && router.rows <= moe_detail::kMaxExperts &&
           k >= 1 && k <= 32 && k <= router.rows && router.cols > 0 && router.cols % 32 == 0 &&
           router.row_bytes == row_bytes(router.type, router.cols);
}

void moe_route_decode(const RouteDecodeArgs& a, cudaStream_t stream) {
    if (!moe_route_decode_supported(a.router, a.k) || !a.router.data)
        throw ehp::Error(EH_INTERNAL, "moe_route_decode: router shape or type not supported (check moe_route_decode_supported)");
    if (!a.x || reinterpret_cast<uintptr_t>(a.x) % 16 || (a.norm_w && reinterpret_cast<uintptr_t>(a.norm_w) % 16) ||
        !a.logits || !a.ids || !a.weights || !a.counter)
        throw ehp::Error(EH_INTERNAL, "moe_route_decode: missing buffer, or input / norm weight not 16-byte aligned");
    detail::DevArgs xa{};
    xa.cols = a.router.cols;
    xa.x = a.x;
    xa.ldx = a.router.cols;
    xa.xmode = int(a.norm_w ? XMode::RmsNorm : XMode::Plain);
    xa.norm_w = a.norm_w;
    xa.norm_eps = a.norm_w ? a.norm_eps : 0.0f;
    xa.ntok = 1;
    const size_t smem = detail::staged_bytes(a.router.cols);
    detail::host_dispatch(int(a.router.type), [&]<int T>() {
        auto kernel = route_decode_kernel<T>;
        if (smem > 48 * 1024)
            EHC_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        launch("route_decode_kernel", kernel, unsigned(a.router.rows), kWarps * 32, smem, stream, xa,
               static_cast<const uint8_t*>(a.router.data), a.router.row_bytes, a.bias, a.router.rows, a.k, a.logits,
               a.ids, a.weights, a.counter);
    });
    EHC_LAUNCHED("route_decode_kernel");
}

}  // namespace ehcuda
