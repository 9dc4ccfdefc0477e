#include "ehcuda/prefill_slab.hpp"

#include <algorithm>

namespace ehcuda {

int whole_gemm_slab_mb(const std::vector<size_t>& call_bytes) {
    const size_t largest = call_bytes.empty() ? 0 : *std::max_element(call_bytes.begin(), call_bytes.end());
    if (largest <= kDefaultDenseSlabBytes) return 0;
    const size_t mb = (largest + (size_t(1) << 20) - 1) >> 20;
    return int(std::min(mb, size_t(kMaxWholeGemmSlabMb)));
}

}  // namespace ehcuda
