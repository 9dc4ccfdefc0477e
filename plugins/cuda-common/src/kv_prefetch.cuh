// Early KV-cache reads for the decode attention kernels (attention.cu,
// gpt_ops.cu): a decode step's attention reads cache rows that earlier steps
// wrote, so it may ask for them before its pdl_entry(), while the QKV
// projection before it still runs (see launch.cuh: memory last written two
// or more kernels back is complete once a kernel has started). Only the new
// position's row is written during the step, and it is not read from the
// cache before the wait.
#pragma once

#include <algorithm>

#include "ehcuda/kernel_plan.hpp"
#include "ehcuda/quant.cuh"

namespace ehcuda::detail {

// KernelPlan::attn_early: 0 reads nothing
// before the wait; 1 the first key group before it; 2 (default) also asks
// L2 for the rest of the block's keys. H100 bench -p 512 -n 128 -r 3, 0 ->
// 2: Qwen2.5-0.5B 1,453 -> 1,506-1,514 tok/s, Phi-3 564.5-564.9 ->
// 582.5-582.6, gpt-oss-20b 482.1 -> 487.8-489.2.
inline int attention_early() { return std::clamp(plan().attn_early, 0, 2); }

// KernelPlan::attn_pipe off: a warp of the llama
// decode attention issues its next key group's loads after scoring the
// current one rather than before. H100, bench -p 512 -n 128 -r 3, 0 -> 1:
// Phi-3 (two groups per warp) 597.0-597.4 -> 602.9-603.3 tok/s, Qwen2.5
// (one group) unchanged. The same in the sink attention's key loop
// (gpt_ops.cu) gave gpt-oss 490.5-490.8 -> 488.7-489.8 and was not kept.

// Asks L2 for the K and V rows of keys k0 .. k1 (inclusive) of KV head kvh
// (hd elements of C per row, rows kv_ld elements apart), one prefetch per 64
// bytes spread over the block's threads. Rows start 64-byte aligned for the
// head dims the fast kernels take, so no piece straddles a cache line.
template <class C>
__device__ __forceinline__ void prefetch_kv_rows(const C* k_cache, const C* v_cache, int kv_ld, int kvh, int hd, int k0,
                                                 int k1) {
    const int pieces = (hd * int(sizeof(C)) + 63) / 64;
    const int n = 2 * (k1 - k0 + 1) * pieces;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = i >> 1, key = k0 + j / pieces, piece = j % pieces;
        const C* row = ((i & 1) ? v_cache : k_cache) + size_t(key) * kv_ld + size_t(kvh) * hd;
        prefetch_l2(reinterpret_cast<const char*>(row) + 64 * piece);
    }
}

}  // namespace ehcuda::detail
