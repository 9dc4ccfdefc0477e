// Hopper's bulk copy engine for weight tiles: one instruction moves a
// contiguous range of global memory into shared memory and signals an
// mbarrier when the bytes have landed. A warp issues its whole tile at once,
// so a tile's bytes are in flight without holding registers, before the
// kernel waits for its predecessor (weights are never written after load).
// sm_90 only; the host launches these kernels only on such devices.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "ehcuda/kernel_plan.hpp"  // kBulkMaxSmem: a block's shared bytes, past which the register forms serve

namespace ehcuda::detail {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread initialises the barrier for `arrivals` arrivals per phase (one
// per issuing thread); the fence makes the initialisation visible to the
// copy engine.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals = 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// The single arrival, announcing `bytes` of copies that complete on `bar`.
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}

// dst and src 16-byte aligned, bytes a positive multiple of 16.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#endif
}

// Orders this thread's earlier shared-memory reads before later writes of
// the copy engine (refilling a buffer the warp has just read).
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Blocks until the barrier's phase `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t done = 0;
    while (!done)
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(smem_u32(bar)), "r"(parity)
            : "memory");
#endif
}

// Bytes [src, src + bytes) of an array that ends at `limit` (reading past
// it is not allowed) to `dst` (16-byte aligned) at offset src % 16, so
// every address keeps its alignment modulo 16. One thread: it arrives on
// `bar` announcing the copy engine's bytes (the 16-byte aligned range) and
// stores itself the last < 16 bytes that would round past `limit`. The
// bytes are readable after mbar_wait on `bar` (and a __syncwarp for the
// other lanes of the issuing warp).
__device__ __forceinline__ void bulk_range_issue(uint64_t* bar, uint8_t* dst, const uint8_t* src, size_t bytes,
                                                 const uint8_t* limit) {
    const uintptr_t s = reinterpret_cast<uintptr_t>(src);
    const uintptr_t a0 = s & ~uintptr_t(15), end = s + bytes, lim = reinterpret_cast<uintptr_t>(limit);
    uintptr_t a1 = (end + 15) & ~uintptr_t(15);
    if (a1 > lim) a1 = end & ~uintptr_t(15);
    mbar_expect(bar, uint32_t(a1 - a0));
    if (a1 > a0) bulk_copy(dst, reinterpret_cast<const void*>(a0), uint32_t(a1 - a0), bar);
    for (uintptr_t p = a1; p < end; ++p) dst[p - a0] = *reinterpret_cast<const uint8_t*>(p);
}

}  // namespace ehcuda::detail
