// Small helpers for GPU tests: typed device buffers and copies.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernels.hpp>

#include "test_plan.hpp"

namespace ehtest {

#define GPU_OK(x) ASSERT_EQ((x), cudaSuccess) << cudaGetErrorString(x)

template <class T>
ehcuda::DeviceBuffer to_device(const std::vector<T>& v) {
    ehcuda::DeviceBuffer b(v.size() * sizeof(T) + 16);
    cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return b;
}

template <class T>
std::vector<T> to_host(const ehcuda::DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    cudaDeviceSynchronize();
    cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
}

inline bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
    if (!::ehtest::have_gpu()) GTEST_SKIP() << "no CUDA device"

}  // namespace ehtest
