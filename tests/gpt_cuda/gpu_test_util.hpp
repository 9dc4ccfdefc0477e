// Helpers shared by the gpt-cuda kernel tests: GPU presence, host <-> device
// copies of vectors, Gaussian test data.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include <ehcuda/device_memory.hpp>

namespace gpttest {

inline bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A device copy of v with 64 zeroed bytes after it (MXFP4 rows are read a
// word past their end).
template <class T>
ehcuda::DeviceBuffer dev(const std::vector<T>& v) {
    ehcuda::DeviceBuffer b(v.size() * sizeof(T) + 64);
    cudaMemset(b.get(), 0, b.size());
    cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return b;
}

// The first n elements of b, after the device has finished.
template <class T>
std::vector<T> host(const ehcuda::DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
}

inline std::vector<float> randn(std::mt19937& rng, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

}  // namespace gpttest

#define REQUIRE_GPU() \
    if (!gpttest::have_gpu()) GTEST_SKIP() << "no CUDA device"
