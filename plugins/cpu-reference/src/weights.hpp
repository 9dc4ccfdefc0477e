// Weights as the host mapped them: a matrix is a pointer into the model
// view plus its type and shape. Quantized rows are dequantized on the fly,
// one row at a time into a small per-thread scratch buffer; no FP32 copy of
// a quantized matrix is ever kept. Vectors (norms, biases, sinks) are small
// and are converted to float once at load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace cpuref {

class ThreadPool;

// A matrix of `rows` rows of `cols` values (ggml dims {cols, rows, ...}).
// A 3D expert tensor {cols, rows, n_expert} is the same thing with
// rows * n_expert rows; expert e owns rows [e*rows, (e+1)*rows).
struct Matrix {
    std::string name;
    const uint8_t* data = nullptr;
    uint32_t type = EH_TYPE_F32;
    uint64_t cols = 0;
    uint64_t rows = 0;       // rows per expert (all rows for a 2D matrix)
    uint64_t n_expert = 1;
    uint64_t row_bytes = 0;

    explicit operator bool() const { return data != nullptr; }
    const uint8_t* row(uint64_t r) const { return data + r * row_bytes; }
    // Dequantizes row r into out (cols floats).
    void dequantize_row(uint64_t r, float* out) const;
};

// Y[t][i] = dot(W row (row0 + i), X[t]) (+ bias[i]) for t < n_tokens,
// i < n_rows. X rows are x_stride floats apart, Y rows y_stride apart.
void matmul(ThreadPool& pool, const Matrix& w, uint64_t row0, uint64_t n_rows,
            const float* x, size_t n_tokens, size_t x_stride,
            float* y, size_t y_stride, const float* bias = nullptr);

// Plain dot product, written so the compiler can vectorize it.
float dot(const float* a, const float* b, size_t n);

}  // namespace cpuref
