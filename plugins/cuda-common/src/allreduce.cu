// allreduce_oneshot (allreduce.hpp): float4 loads where every pointer and
// the length allow, a scalar tail otherwise.
#include <algorithm>
#include <cstdint>
#include <string>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/allreduce.hpp"
#include "ehcuda/launch.cuh"

namespace ehcuda {
namespace {

constexpr int kThreads = 256;

__global__ void allreduce_oneshot_kernel(AllReduceArgs a, size_t n4) {
    pdl_entry();
    pdl_release();
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 s = reinterpret_cast<const float4*>(a.in[0])[i];
        for (int r = 1; r < a.nranks; ++r) {
            const float4 v = reinterpret_cast<const float4*>(a.in[r])[i];
            s.x += v.x;
            s.y += v.y;
            s.z += v.z;
            s.w += v.w;
        }
        for (int o = 0; o < a.nout; ++o) {
            float4* d = reinterpret_cast<float4*>(a.out[o]) + i;
            if (a.accumulate) {
                const float4 h = *d;
                *d = make_float4(h.x + s.x, h.y + s.y, h.z + s.z, h.w + s.w);
            } else {
                *d = s;
            }
        }
    }
    for (size_t i = n4 * 4 + size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n; i += stride) {
        float s = a.in[0][i];
        for (int r = 1; r < a.nranks; ++r) s += a.in[r][i];
        for (int o = 0; o < a.nout; ++o) a.out[o][i] = a.accumulate ? a.out[o][i] + s : s;
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void allreduce_oneshot(const AllReduceArgs& a, cudaStream_t stream) {
    if (a.nranks < 1 || a.nranks > kMaxRanks || a.nout < 1 || a.nout > kMaxRanks)
        throw ehp::Error(EH_INVALID_ARGUMENT, "allreduce_oneshot: " + std::to_string(a.nranks) + " ranks, " +
                                                  std::to_string(a.nout) + " outputs (1.." +
                                                  std::to_string(kMaxRanks) + " each)");
    if (a.n == 0) return;
    bool vec = true;
    for (int r = 0; r < a.nranks; ++r) vec = vec && aligned16(a.in[r]);
    for (int o = 0; o < a.nout; ++o) vec = vec && aligned16(a.out[o]);
    const size_t n4 = vec ? a.n / 4 : 0;
    const size_t work = n4 ? n4 : a.n;
    const int blocks = int(std::min<size_t>((work + kThreads - 1) / kThreads, 1024));
    launch("allreduce_oneshot_kernel", allreduce_oneshot_kernel, dim3(blocks), dim3(kThreads), 0, stream, a, n4);
}

}  // namespace ehcuda
