// Error plumbing for CUDA calls: every runtime call and every launch is
// checked, and a failure becomes an ehp::Error the plugin boundary turns into
// a status. Allocation failures map to VRAM_OOM so a request can fail alone.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include <engine_host/plugin_abi.hpp>

namespace ehcuda {

[[noreturn]] void throw_cuda(cudaError_t err, const char* what, const char* file, int line);

inline void check(cudaError_t err, const char* what, const char* file, int line) {
    if (err != cudaSuccess) throw_cuda(err, what, file, line);
}

// Checks the launch just made (configuration errors show up here).
void check_launch(const char* kernel, const char* file, int line);

}  // namespace ehcuda

#define EHC_CHECK(call) ::ehcuda::check((call), #call, __FILE__, __LINE__)
#define EHC_LAUNCHED(name) ::ehcuda::check_launch(name, __FILE__, __LINE__)
