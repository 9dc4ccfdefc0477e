// Test-only: a recorder that sees each matmul call's route and every kernel
// launch, so a GPU test (tests/cuda/route_launch_test.cpp) can check the
// launches against the routes. None is set in a plugin: set_launch_recorder
// is for tests that link eh_cuda_common, on one thread. Host code.
#pragma once

#include <cstddef>

#include "ehcuda/kernel_route.hpp"

namespace ehcuda {

class LaunchRecorder {
public:
    virtual ~LaunchRecorder() = default;
    virtual void route(const MatmulShape& m, const MatmulRoute& r) = 0;
    // blocks: the grid's x * y * z
    virtual void launch(const char* kernel, unsigned blocks, unsigned threads, size_t smem) = 0;
};
void set_launch_recorder(LaunchRecorder* r);  // nullptr: none

namespace detail {
LaunchRecorder* launch_recorder();
}  // namespace detail

}  // namespace ehcuda
