#include "weights.hpp"

#include <cstring>
#include <vector>

#include <engine_host/quant_blocks.hpp>

#include "thread_pool.hpp"

namespace cpuref {

void Matrix::dequantize_row(uint64_t r, float* out) const {
    ehp::quant::dequantize_row(type, row(r), out, cols);
}

float dot(const float* a, const float* b, size_t n) {
    // eight independent sums: lets the loop vectorize without -ffast-math
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
    float tail = 0.0f;
    for (; i < n; ++i) tail += a[i] * b[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + tail;
}

void matmul(ThreadPool& pool, const Matrix& w, uint64_t row0, uint64_t n_rows,
            const float* x, size_t n_tokens, size_t x_stride,
            float* y, size_t y_stride, const float* bias) {
    const size_t cols = static_cast<size_t>(w.cols);
    // F32 rows can be read in place when the mapping keeps floats aligned.
    const bool direct = w.type == EH_TYPE_F32 && (reinterpret_cast<uintptr_t>(w.data) % alignof(float)) == 0 &&
                        (w.row_bytes % alignof(float)) == 0;
    // roughly 64K multiply-adds per thread before splitting pays off
    const size_t work_per_row = cols * (n_tokens ? n_tokens : 1);
    const size_t min_rows = work_per_row >= 65536 ? 1 : 65536 / work_per_row;
    pool.parallel_for(static_cast<size_t>(n_rows), min_rows, [&](size_t begin, size_t end) {
        std::vector<float> scratch(direct ? 0 : cols);
        for (size_t i = begin; i < end; ++i) {
            const float* wr;
            if (direct) {
                wr = reinterpret_cast<const float*>(w.row(row0 + i));
            } else {
                w.dequantize_row(row0 + i, scratch.data());
                wr = scratch.data();
            }
            const float b = bias ? bias[i] : 0.0f;
            for (size_t t = 0; t < n_tokens; ++t) y[t * y_stride + i] = dot(wr, x + t * x_stride, cols) + b;
        }
    });
}

}  // namespace cpuref
