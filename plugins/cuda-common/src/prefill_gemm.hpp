// Pieces of the cuBLAS prefill path shared by the dense matmul (gemm.cu)
// and the grouped MoE products (moe_prefill.cu).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ehcuda/kernels.hpp"
#include "ehcuda/prefill_workspace.hpp"

namespace ehcuda::prefill {

// Rows [0, rows) of a matrix stored at `base` (row r at base + r *
// row_bytes, any moe_type_supported type) into out[r][0, cols), FP16.
void dequant_rows(uint32_t type, const void* base, size_t row_bytes, int rows, int cols, __half* out,
                  cudaStream_t stream);

// C[t][i] (= c[t * ldc + i]) = beta * C + sum_k W[i][k] * X[t][k] for
// i < m, t < n: FP16 operands, FP32 accumulation and output.
void gemm_f16(const PrefillWorkspace& ws, int m, int n, int k, const __half* w, int ldw, const __half* x, int ldx,
              float* c, int ldc, float beta, cudaStream_t stream);

// The cuBLAS dense path of matmul(); false (nothing done) when it does not
// apply: no workspace, too few tokens, RmsNorm input, or shapes beyond the
// workspace.
bool gemm_cublas(const MatmulArgs& a, cudaStream_t stream);

}  // namespace ehcuda::prefill
