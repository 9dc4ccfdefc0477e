// With EH_BENCH_PROFILE_STEP=K, decode step K of each timed loop runs inside
// cudaProfilerStart/Stop, so `ncu --profile-from-start off` (or nsys with
// --capture-range=cudaProfilerApi) sees the kernels of that one step.
#pragma once

#include <cuda_profiler_api.h>

#include <cstdlib>

namespace ehtest {

struct ProfiledStep {
    int k = std::getenv("EH_BENCH_PROFILE_STEP") ? std::atoi(std::getenv("EH_BENCH_PROFILE_STEP")) : -1;
    void begin(int i) const {
        if (i == k) cudaProfilerStart();
    }
    void end(int i) const {
        if (i == k) cudaProfilerStop();
    }
};

}  // namespace ehtest
