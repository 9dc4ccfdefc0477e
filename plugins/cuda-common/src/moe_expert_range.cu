// See moe_expert_range.hpp.
#include "ehcuda/check.hpp"
#include "ehcuda/moe_expert_range.hpp"

namespace ehcuda {
namespace {

// One thread per token: its pairs in slot order.
__global__ void keep_expert_range_kernel(int32_t* ids, float* weights, int ntok, int k, int first, int count) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= ntok) return;
    int32_t* id = ids + size_t(t) * k;
    float* w = weights + size_t(t) * k;
    int stand_in = 0;  // the local expert a foreign pair points at
    for (int s = 0; s < k; ++s) {
        const int local = id[s] - first;
        if (local >= 0 && local < count) {
            stand_in = local;
            break;
        }
    }
    for (int s = 0; s < k; ++s) {
        const int local = id[s] - first;
        if (local >= 0 && local < count) {
            id[s] = local;
        } else {
            id[s] = stand_in;
            w[s] = 0.0f;
        }
    }
}

}  // namespace

void moe_keep_expert_range(int32_t* ids, float* weights, int ntok, int k, int first, int count, cudaStream_t stream) {
    if (ntok <= 0) return;
    if (!ids || !weights || k <= 0 || count <= 0 || first < 0)
        throw ehp::Error(EH_INTERNAL, "moe_keep_expert_range: missing buffer, no slots or an empty range");
    constexpr int kThreads = 128;
    keep_expert_range_kernel<<<unsigned((ntok + kThreads - 1) / kThreads), kThreads, 0, stream>>>(ids, weights, ntok, k,
                                                                                                  first, count);
    EHC_LAUNCHED("keep_expert_range_kernel");
}

}  // namespace ehcuda
