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

// How a matrix's values are laid out in the mapping.
enum class Layout {
    Rows,        // ggml: each output row is `cols` values (any block type)
    Transposed,  // column-major: for each input k, all outputs (HF GPT-2
                 // Conv1D, HF gpt-oss dense experts); F32/F16/BF16 only
    HfMxfp4      // HF gpt-oss MXFP4: U8 `blocks` (16 bytes per 32 values,
                 // value 2j in the low nibble of byte j, 2j+1 in the high)
                 // plus a separate U8 E8M0 `scales` tensor
};

// A matrix of `rows` rows of `cols` values: y = W x with W[rows][cols].
// Expert tensors hold n_expert such matrices; logical row e*rows + r is
// expert e's row r. Within an expert, logical row r lives at physical row
// r*row_step + row_offset of `phys_rows` stored rows: that selects the gate
// or up half of a fused gate_up tensor (first/second half in GGUF, even/odd
// rows in HF gpt-oss).
struct Matrix {
    std::string name;
    const uint8_t* data = nullptr;
    const uint8_t* scales = nullptr;  // HfMxfp4 only
    uint32_t type = EH_TYPE_F32;
    Layout layout = Layout::Rows;
    uint64_t cols = 0;
    uint64_t rows = 0;       // logical rows per expert (all rows for a 2D matrix)
    uint64_t n_expert = 1;
    uint64_t phys_rows = 0;  // stored rows per expert
    uint64_t row_step = 1, row_offset = 0;
    uint64_t row_bytes = 0;  // Rows layout: bytes of one stored row
    // Rows layout with each expert its own tensor (an HF Qwen3-MoE
    // checkpoint): expert e's stored rows start at expert_data[e] (data is
    // expert_data[0]). Empty: the experts follow each other from data.
    std::vector<const uint8_t*> expert_data;

    explicit operator bool() const { return data != nullptr; }
    // Stored row of logical row r (e*rows + r_in_expert).
    uint64_t physical_row(uint64_t r) const {
        const uint64_t e = r / rows, ri = r % rows;
        return e * phys_rows + ri * row_step + row_offset;
    }
    // Rows layout: the bytes of logical row r.
    const uint8_t* row(uint64_t r) const {
        if (expert_data.empty()) return data + physical_row(r) * row_bytes;
        const uint64_t e = r / rows;
        return expert_data[e] + (physical_row(r) - e * phys_rows) * row_bytes;
    }
    // Whether every stored row starts at a multiple of `align` bytes.
    bool rows_aligned(uintptr_t align) const {
        if (row_bytes % align != 0) return false;
        if (expert_data.empty()) return reinterpret_cast<uintptr_t>(data) % align == 0;
        for (const uint8_t* p : expert_data)
            if (reinterpret_cast<uintptr_t>(p) % align != 0) return false;
        return true;
    }
    // Dequantizes logical row r into out (cols floats), any layout.
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
