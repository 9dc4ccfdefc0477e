// Deterministic block-wide reductions: a fixed tree over warps, so the same
// inputs give the same bits run after run (no atomics).
#pragma once

namespace ehcuda::detail {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// All threads get the result. blockDim.x must be a multiple of 32, <= 1024.
__device__ __forceinline__ float block_sum(float v, float* shm /* >= 32 floats */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    float r = lane < nw ? shm[lane] : 0.0f;
    r = warp_sum(r);
    return r;
}

__device__ __forceinline__ float block_max(float v, float* shm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    float r = lane < nw ? shm[lane] : -INFINITY;
    r = warp_max(r);
    return r;
}

}  // namespace ehcuda::detail
