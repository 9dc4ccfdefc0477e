#include "ehcuda/check.hpp"

#include <cstdio>

namespace ehcuda {

void throw_cuda(cudaError_t err, const char* what, const char* file, int line) {
    // Clear the sticky-free "last error" so the next call starts clean.
    (void)cudaGetLastError();
    const char* base = file;
    for (const char* p = file; *p; ++p)
        if (*p == '/') base = p + 1;
    std::string msg = std::string(what) + " failed: " + cudaGetErrorName(err) + " (" +
                      cudaGetErrorString(err) + ") at " + base + ":" + std::to_string(line);
    eh_status st = (err == cudaErrorMemoryAllocation) ? EH_VRAM_OOM : EH_CUDA_ERROR;
    throw ehp::Error(st, msg);
}

void check_launch(const char* kernel, const char* file, int line) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw_cuda(err, kernel, file, line);
}

}  // namespace ehcuda
