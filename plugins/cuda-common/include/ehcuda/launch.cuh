// Kernel launches with programmatic dependent launch (PDL, compute
// capability 9.0+). A decode step is a chain of ~200 small kernels; with PDL
// each one is scheduled while its predecessor still runs, so the chain stops
// paying a full launch gap per kernel (inside CUDA graphs too).
//
// The contract: every kernel launched through ehcuda::launch() starts with
// pdl_entry(), before it reads or writes any memory an earlier kernel on the
// stream touches. pdl_entry() waits until all earlier kernels have finished
// and their writes are visible. Weights (never written after load) may be
// read before it, and so may memory last written two or more kernels back:
// a kernel starts only once every block of the previous one has released
// or exited, a block releases only after its own wait, and that wait
// returned once the kernel before had finished (this needs one block of
// the previous kernel to have waited rather than exited early; every
// kernel here has such blocks). The decode attention reads earlier steps'
// KV-cache rows this way (kv_prefetch.cuh). A kernel
// that is not launched this way still runs fully ordered, and pdl_entry()
// is a no-op for it.
//
// The weight-streaming decode kernels (GEMV, FFN pair), the decode
// attention kernels and the small per-step kernels (norms, embedding,
// sampling) release their dependents once they are past their own wait
// (pdl_release): the next kernel's blocks are then scheduled as this one's
// free the multiprocessors, and the bulk GEMV and the FFN pair issue their
// weight copies while this one finishes, so one kernel's tail overlaps the
// next one's head. Measured on an H100 (decode tok/s, none -> these):
// Qwen2.5-0.5B 1,293 -> 1,424, Phi-3 532 -> 561, gpt-oss-20b 475 -> 464.
// Released at entry instead, a chain of kernels each released by the
// previous one's start sat waiting on the multiprocessors (decode 10 %
// slower); after the wait at most two kernels are resident. Not released:
// the MoE kernels (gpt-oss 463 with them releasing too; 469 when only the
// GEMV and FFN pair kernels release) and the prefill kernels (Qwen2.5-0.5B
// pp512 46,700 -> 41,000 when they did). gpt-oss's MoE and top-k kernels
// fetch nothing before their wait, so it gains nothing and pays ~2 %; the
// choice is per kernel, not per plugin. griddepcontrol.wait still waits
// for the previous kernel's completion and memory flush: a release changes
// no ordering, only when the next kernel's blocks may start.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "ehcuda/check.hpp"
#include "ehcuda/launch_record.hpp"

namespace ehcuda {

__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel's blocks start (see above); after pdl_entry().
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Off where the installed KernelPlan says so (pdl) or on devices before 9.0.
bool pdl_enabled();

namespace detail {
// The current device's multiprocessor count and compute capability major,
// queried once.
int sm_count();
int cc_major();
// For launches not made through launch() (<<<>>>, cuBLAS).
inline void note_launch(const char* kernel, dim3 grid, dim3 block, size_t smem) {
    if (LaunchRecorder* r = launch_recorder()) r->launch(kernel, grid.x * grid.y * grid.z, block.x * block.y * block.z, smem);
}
}  // namespace detail

// Lets `kernel` take `smem` bytes of dynamic shared memory. Past 48 KB of
// dynamic and static shared memory together a launch needs the opt-in; the
// margin covers the kernels' static arrays (barriers, reductions).
template <class... KArgs>
void allow_dynamic_smem(void (*kernel)(KArgs...), size_t smem) {
    if (smem > 40 * 1024)
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
              "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", __FILE__, __LINE__);
}

template <class... KArgs, class... Args>
void launch(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
    check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name, __FILE__, __LINE__);
    detail::note_launch(name, grid, block, smem);
}

}  // namespace ehcuda
