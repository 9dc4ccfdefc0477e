// Helpers shared by the gpt-cuda kernel tests: GPU presence, host <-> device
// copies of vectors, weight rows as the loader leaves them on the device
// (MXFP4 rewritten into the device layout), Gaussian test data.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <engine_host/quant_blocks.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/mxfp4_layout.hpp>

namespace gpttest {

inline bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A device copy of v with 64 zeroed bytes after it (rows of some types are
// read a word past their end).
template <class T>
ehcuda::DeviceBuffer dev(const std::vector<T>& v) {
    ehcuda::DeviceBuffer b(v.size() * sizeof(T) + 64);
    cudaMemset(b.get(), 0, b.size());
    cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return b;
}

// `rows` ggml MXFP4 rows of `cols` values (17 bytes per 32, as in a file),
// uploaded and rewritten into the device layout by mxfp4_repack_rows, as
// the loader does; 64 zeroed bytes after them.
inline ehcuda::DeviceBuffer dev_mxfp4(const std::vector<uint8_t>& ggml, size_t rows, int cols) {
    const size_t src_rb = ehcuda::mxfp4_file_row_bytes(cols), dst_rb = ehcuda::mxfp4_device_row_bytes(cols);
    EXPECT_EQ(ggml.size(), rows * src_rb);
    auto src = dev(ggml);
    ehcuda::DeviceBuffer b(rows * dst_rb + 64);
    cudaMemset(b.get(), 0, b.size());
    ehcuda::mxfp4_repack_rows(src.get(), b.get(), int64_t(rows), cols, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return b;
}

// Rows of `type` as a file stores them, on the device as the kernels read
// them (MXFP4: dev_mxfp4; every other type as is).
inline ehcuda::DeviceBuffer dev_rows(uint32_t type, const std::vector<uint8_t>& data, size_t rows, int cols) {
    return type == EH_TYPE_MXFP4 ? dev_mxfp4(data, rows, cols) : dev(data);
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

// rows x cols of `type`: MXFP4 as random codes (every nibble, exponents
// near 2^0), the other types quantized from N(0, 0.05^2) values.
inline std::vector<uint8_t> random_quant_rows(uint32_t type, std::mt19937& rng, size_t rows, size_t cols) {
    const size_t rb = ehp::quant::row_bytes(type, cols);
    std::vector<uint8_t> b(rows * rb);
    if (type == EH_TYPE_MXFP4) {
        for (size_t i = 0; i < b.size() / 17; ++i) {
            b[i * 17] = uint8_t(120 + rng() % 8);
            for (int j = 1; j < 17; ++j) b[i * 17 + j] = uint8_t(rng());
        }
        return b;
    }
    for (size_t r = 0; r < rows; ++r) {
        const auto v = randn(rng, cols, 0.05f);
        EXPECT_TRUE(ehp::quant::quantize_row(type, v.data(), b.data() + r * rb, cols));
    }
    return b;
}

inline std::vector<float> dequant_rows(uint32_t type, const std::vector<uint8_t>& data, size_t rows, size_t cols) {
    std::vector<float> w(rows * cols);
    const size_t rb = ehp::quant::row_bytes(type, cols);
    for (size_t r = 0; r < rows; ++r) ehp::quant::dequantize_row(type, data.data() + r * rb, &w[r * cols], cols);
    return w;
}

}  // namespace gpttest

#define REQUIRE_GPU() \
    if (!gpttest::have_gpu()) GTEST_SKIP() << "no CUDA device"
