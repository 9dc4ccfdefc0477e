#include "weights.hpp"

#include <cstring>
#include <vector>

#include <engine_host/quant_blocks.hpp>

#include "thread_pool.hpp"

namespace cpuref {

void Matrix::dequantize_row(uint64_t r, float* out) const {
    switch (layout) {
    case Layout::Rows:
        ehp::quant::dequantize_row(type, row(r), out, cols);
        return;
    case Layout::Transposed: {
        // expert e's values are [cols][phys_rows]; gather one column
        const uint64_t e = r / rows, p = physical_row(r) - e * phys_rows;
        const uint64_t base = e * cols * phys_rows + p;
        if (type == EH_TYPE_F32) {
            for (uint64_t k = 0; k < cols; ++k) std::memcpy(&out[k], data + (base + k * phys_rows) * 4, 4);
        } else if (type == EH_TYPE_F16) {
            const float* table = ehp::quant::fp16_table();
            for (uint64_t k = 0; k < cols; ++k) {
                uint16_t h;
                std::memcpy(&h, data + (base + k * phys_rows) * 2, 2);
                out[k] = table[h];
            }
        } else {
            for (uint64_t k = 0; k < cols; ++k) {
                uint16_t h;
                std::memcpy(&h, data + (base + k * phys_rows) * 2, 2);
                out[k] = ehp::quant::bf16_to_fp32(h);
            }
        }
        return;
    }
    case Layout::HfMxfp4: {
        const uint64_t nb = cols / 32, pr = physical_row(r);
        const uint8_t* blk = data + pr * nb * 16;
        const uint8_t* sc = scales + pr * nb;
        for (uint64_t b = 0; b < nb; ++b) {
            const float scale = ehp::quant::e8m0_to_fp32(sc[b]);
            for (int j = 0; j < 16; ++j) {
                const uint8_t byte = blk[b * 16 + static_cast<uint64_t>(j)];
                out[b * 32 + 2 * static_cast<uint64_t>(j)] = ehp::quant::e2m1_to_fp32(byte & 0x0F) * scale;
                out[b * 32 + 2 * static_cast<uint64_t>(j) + 1] = ehp::quant::e2m1_to_fp32(byte >> 4) * scale;
            }
        }
        return;
    }
    }
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
    const bool direct = w.layout == Layout::Rows && w.type == EH_TYPE_F32 && w.rows_aligned(alignof(float));
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
