// Kernel launches with programmatic dependent launch (PDL, compute
// capability 9.0+). A decode step is a chain of ~200 small kernels; with PDL
// each one is scheduled while its predecessor still runs, so the chain stops
// paying a full launch gap per kernel (inside CUDA graphs too).
//
// The contract: every kernel launched through ehcuda::launch() starts with
// pdl_entry(), before it reads or writes any memory an earlier kernel on the
// stream touches. pdl_entry() waits until all earlier kernels have finished
// and their writes are visible. Weights (never written after load) may be
// read before it. A kernel that is not launched this way still runs fully
// ordered, and pdl_entry() is a no-op for it.
//
// No kernel triggers its dependents early (griddepcontrol.launch_dependents
// at entry): measured on an H100, that made decode 10 % slower (waiting
// blocks of the next kernels sat on the multiprocessors), so the next kernel
// is released when this one's blocks exit. (Triggering once a GEMV's or the
// FFN pair kernel's weight loads were issued, after their main loop, was
// measured too: gpt-oss 420 -> 425, Qwen and Phi-3 within noise either way.)
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "ehcuda/check.hpp"

namespace ehcuda {

__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Off with EHCUDA_PDL=0 (for measurements) or on devices before 9.0.
bool pdl_enabled();

namespace detail {
// The current device's multiprocessor count and compute capability major,
// queried once.
int sm_count();
int cc_major();
}  // namespace detail

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
}

}  // namespace ehcuda
