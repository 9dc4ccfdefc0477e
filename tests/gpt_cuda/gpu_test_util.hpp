// Helpers shared by the gpt-cuda kernel tests: GPU presence, host <-> device
// copies of vectors, weight rows as the loader leaves them on the device
// (MXFP4 rewritten into the device layout), Gaussian test data, the MoE
// kernels' expert matrices and call arguments.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <engine_host/quant_blocks.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/moe.hpp>
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

// A matrix of experts as moe.hpp reads it: `rows` x `cols` of `type` an
// expert, from row `row0` of each expert's `expert_rows` rows at `data`
// (gate and up fused: 2 x rows an expert, up from row0 = rows), with bias
// [expert][bias_stride] (or none).
inline ehcuda::ExpertMat expert_mat(uint32_t type, int rows, int cols, const void* data, int expert_rows,
                                    const float* bias = nullptr, int bias_stride = 0, int row0 = 0) {
    ehcuda::ExpertMat m;
    m.data = data;
    m.type = type;
    m.rows = rows;
    m.cols = cols;
    m.row_bytes = ehcuda::moe_row_bytes(type, cols);
    m.expert_stride = m.row_bytes * size_t(expert_rows);
    m.row0 = row0;
    m.bias = bias;
    m.bias_stride = bias_stride;
    return m;
}

// Fused gate|up rows of `type` as a file stores them, [X][2F][E] (each
// expert's F gate rows, then its F up rows), as two device tensors [X][F][E]
// (gate, up): how a loader leaves experts whose gate and up come apart.
inline std::pair<ehcuda::DeviceBuffer, ehcuda::DeviceBuffer> split_gate_up(uint32_t type,
                                                                             const std::vector<uint8_t>& gu, int X,
                                                                             int F, int E) {
    const size_t frb = ehp::quant::row_bytes(type, size_t(E)), half = size_t(F) * frb;
    std::vector<uint8_t> gs(size_t(X) * half), us(size_t(X) * half);
    for (size_t e = 0; e < size_t(X); ++e) {
        std::memcpy(&gs[e * half], &gu[2 * e * half], half);
        std::memcpy(&us[e * half], &gu[(2 * e + 1) * half], half);
    }
    return {dev_rows(type, gs, size_t(X) * F, E), dev_rows(type, us, size_t(X) * F, E)};
}

// Gate and up of X experts whose fused gate|up rows `gu` (as a file stores
// them, [X][2F][E]) are on the device at `fused_dev`: with `fused` those
// rows (each expert's F gate rows, then its F up rows), else two tensors
// [X][F][E] of the same values (split_gate_up, held here); bias [X][2F],
// gate's then up's.
struct GateUp {
    std::pair<ehcuda::DeviceBuffer, ehcuda::DeviceBuffer> split;
    ehcuda::ExpertMat gate, up;
};
inline GateUp gate_up_mats(uint32_t type, const std::vector<uint8_t>& gu, const ehcuda::DeviceBuffer& fused_dev,
                           bool fused, int X, int F, int E, const float* bias) {
    GateUp m;
    if (!fused) m.split = split_gate_up(type, gu, X, F, E);
    const int expert_rows = fused ? 2 * F : F;
    m.gate = expert_mat(type, F, E, fused ? fused_dev.get() : m.split.first.get(), expert_rows, bias, 2 * F);
    m.up = expert_mat(type, F, E, fused ? fused_dev.get() : m.split.second.get(), expert_rows, bias + F, 2 * F,
                      fused ? F : 0);
    return m;
}

// What every MoE call of these tests passes alike (MoeDecodeArgs,
// MoeGroupedArgs, MoeDecodeMmaArgs): the tokens' k experts and weights in
// rank order, the matrices, gpt-oss's clamped SwiGLU (alpha 1.702, limit
// 7), the scratch, the rows accumulated into. (The input is each call's
// own: x, or x16.)
template <class Args, class Ids, class Weights>
void set_moe_call(Args& a, int k, Ids* ids, Weights* weights, const ehcuda::ExpertMat& g, const ehcuda::ExpertMat& u,
                  const ehcuda::ExpertMat& d, const ehcuda::DeviceBuffer& scratch, float* h) {
    a.k = k;
    a.ids = ids;
    a.weights = weights;
    a.gate = g;
    a.up = u;
    a.down = d;
    a.alpha = 1.702f;
    a.limit = 7.0f;
    a.scratch = scratch.get();
    a.scratch_bytes = scratch.size();
    a.h = h;
}

// A grouped call of ntok tokens over n_expert experts (x and h rows packed:
// leading dimensions gate.cols and down.rows).
inline ehcuda::MoeGroupedArgs grouped_args(const float* x, int ntok, int k, int n_expert, const int32_t* ids,
                                           const float* weights, const ehcuda::ExpertMat& g,
                                           const ehcuda::ExpertMat& u, const ehcuda::ExpertMat& d,
                                           const ehcuda::DeviceBuffer& scratch, float* h) {
    ehcuda::MoeGroupedArgs a;
    set_moe_call(a, k, ids, weights, g, u, d, scratch, h);
    a.x = x;
    a.ldx = g.cols;
    a.ntok = ntok;
    a.n_expert = n_expert;
    a.ldh = d.rows;
    return a;
}

}  // namespace gpttest

#define REQUIRE_GPU() \
    if (!gpttest::have_gpu()) GTEST_SKIP() << "no CUDA device"
