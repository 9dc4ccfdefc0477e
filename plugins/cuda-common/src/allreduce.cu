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

struct SignalPtrs {
    AllReduceSignal* sig[kMaxRanks];
};

__device__ __forceinline__ void store_release_sys(unsigned int* p, unsigned int v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int load_acquire_sys(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// allreduce_oneshot_kernel with the barrier of allreduce_oneshot_signal in
// front: the partials, written by earlier kernels of each rank's stream,
// are read (past L1) only once every rank's same block has said so.
__global__ void allreduce_signal_kernel(AllReduceArgs a, size_t n4, int self, SignalPtrs s) {
    pdl_entry();  // this rank's partial and output are final
    AllReduceSignal* mine = s.sig[self];
    __shared__ unsigned int epoch;
    if (threadIdx.x == 0) {
        epoch = mine->epoch[blockIdx.x] + 1;
        mine->epoch[blockIdx.x] = epoch;
    }
    __syncthreads();
    if (threadIdx.x < unsigned(a.nranks)) {
        const int r = int(threadIdx.x);
        __threadfence_system();
        store_release_sys(&s.sig[r]->flag[blockIdx.x][self], epoch);
        // (at least this call: a rank may already have raised the next
        // one's flag, never a later one, as that waits for ours; the
        // difference, not the value, so the count may wrap)
        while (int(load_acquire_sys(&mine->flag[blockIdx.x][r]) - epoch) < 0) {
        }
    }
    __syncthreads();
    pdl_release();
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    float* out = a.out[0];
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 t = __ldcg(reinterpret_cast<const float4*>(a.in[0]) + i);
        for (int r = 1; r < a.nranks; ++r) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(a.in[r]) + i);
            t.x += v.x;
            t.y += v.y;
            t.z += v.z;
            t.w += v.w;
        }
        float4* d = reinterpret_cast<float4*>(out) + i;
        if (a.accumulate) {
            const float4 h = *d;
            *d = make_float4(h.x + t.x, h.y + t.y, h.z + t.z, h.w + t.w);
        } else {
            *d = t;
        }
    }
    for (size_t i = n4 * 4 + size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n; i += stride) {
        float t = __ldcg(a.in[0] + i);
        for (int r = 1; r < a.nranks; ++r) t += __ldcg(a.in[r] + i);
        out[i] = a.accumulate ? out[i] + t : t;
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

void allreduce_oneshot_signal(const AllReduceArgs& a, int self, AllReduceSignal* const* signals, cudaStream_t stream) {
    if (a.nranks < 1 || a.nranks > kMaxRanks || a.nout != 1 || self < 0 || self >= a.nranks)
        throw ehp::Error(EH_INVALID_ARGUMENT, "allreduce_oneshot_signal: " + std::to_string(a.nranks) + " ranks, " +
                                                  std::to_string(a.nout) + " outputs (1), rank " + std::to_string(self));
    SignalPtrs s{};
    for (int r = 0; r < a.nranks; ++r) {
        if (!signals[r]) throw ehp::Error(EH_INVALID_ARGUMENT, "allreduce_oneshot_signal: no signal area for rank " + std::to_string(r));
        s.sig[r] = signals[r];
    }
    // (launched for n == 0 too: every rank's blocks must keep their epochs in step)
    bool vec = aligned16(a.out[0]);
    for (int r = 0; r < a.nranks; ++r) vec = vec && aligned16(a.in[r]);
    const size_t n4 = vec ? a.n / 4 : 0;
    const size_t work = n4 ? n4 : a.n;
    const int blocks = int(std::max<size_t>(1, std::min<size_t>((work + kThreads - 1) / kThreads, kSignalBlocks)));
    launch("allreduce_signal_kernel", allreduce_signal_kernel, dim3(blocks), dim3(kThreads), 0, stream, a, n4, self, s);
}

}  // namespace ehcuda
