// See moe_expert_range.hpp.
#include "ehcuda/check.hpp"
#include "ehcuda/moe_expert_range.hpp"

namespace ehcuda {
namespace {

// One thread per pair.
__global__ void keep_expert_range_kernel(int32_t* ids, float* weights, int pairs, int first, int count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    const int local = ids[i] - first;
    if (local >= 0 && local < count) {
        ids[i] = local;
    } else {
        ids[i] = -1;
        weights[i] = 0.0f;
    }
}

}  // namespace

void moe_keep_expert_range(int32_t* ids, float* weights, int ntok, int k, int first, int count, cudaStream_t stream) {
    if (ntok <= 0) return;
    if (!ids || !weights || k <= 0 || count <= 0 || first < 0)
        throw ehp::Error(EH_INTERNAL, "moe_keep_expert_range: missing buffer, no slots or an empty range");
    constexpr int kThreads = 128;
    const int pairs = ntok * k;
    keep_expert_range_kernel<<<unsigned((pairs + kThreads - 1) / kThreads), kThreads, 0, stream>>>(ids, weights, pairs,
                                                                                                   first, count);
    EHC_LAUNCHED("keep_expert_range_kernel");
}

}  // namespace ehcuda
