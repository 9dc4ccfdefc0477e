// The image encoder's elementwise and row kernels (vision_ops.cu), for
// vision_gemma3.cpp and vision_qwen.cpp. Rows are dense: row t of a
// [rows][n] buffer at t * n.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace ehcuda::vision {

// Patch rows of (channel, row, column) from three size x size planes:
// out[(py * grid + px)][(c * patch + ky) * patch + kx].
void im2col(const float* pixels, int size, int patch, float* out, cudaStream_t s);
// x[t][e] = y[t][e] + bias[e] + pos[t][e].
void add_bias_pos(const float* y, const float* bias, const float* pos, int rows, int n, float* x, cudaStream_t s);
// y[t][e] += bias[e]; with outh, written there as halves instead (y unchanged).
void add_bias(float* y, const float* bias, int rows, int n, cudaStream_t s, __half* outh = nullptr);
// x[t][e] += y[t][e] + bias[e].
void add_residual(float* x, const float* y, const float* bias, int rows, int n, cudaStream_t s);
// u[t][e] = gelu_tanh(u[t][e] + bias[e]); with outh, written there as halves
// instead (u unchanged).
void bias_gelu(float* u, const float* bias, int rows, int n, cudaStream_t s, __half* outh = nullptr);
// out = LayerNorm(x) * w + b per row (biased variance, eps inside the root).
// With outh, written there as halves instead of to out (the next GEMM's
// input when its matrix is F16).
void layer_norm(const float* x, const float* w, const float* b, float eps, int rows, int n, float* out, cudaStream_t s,
                __half* outh = nullptr);
// n floats to halves.
void to_half(const float* x, size_t n, __half* out, cudaStream_t s);
// Each of `rows` rows of n scores to its softmax, into outf (may be s
// itself) or, when outf is null, outh.
void softmax_rows(const float* scores, int rows, int n, float* outf, __half* outh, cudaStream_t s);
// The grid x grid rows of x (width n) averaged over merge x merge squares
// into (grid / merge)^2 rows, row-major, each then RMS-normalised and
// multiplied by w: out[(oy * g + ox)][e].
void pool_rms(const float* x, int grid, int merge, int n, const float* w, float eps, float* out, cudaStream_t s);

// (vision_attention.cu) Whether flash_attention takes a tower of this
// width and head count: a head of at most 80 dims, a multiple of 8.
bool flash_takes(int width, int n_head);
// out[t][h * hd + d] = softmax(q_h k_h^T * scale) v_h over all n patches,
// from qkv rows of [q | k | v] (3 * width halves each). Mma: mma.sync with
// the scores and output in registers; Wmma: nvcuda::wmma through shared
// memory (simpler, slower).
enum class FlashKernel { Mma, Wmma };
void flash_attention(const __half* qkv, int n, int width, int n_head, float scale, float* out, cudaStream_t s,
                     FlashKernel kernel = FlashKernel::Mma);
// The same (mma.sync) within each of n_seg segments of rows: segment j is
// rows d_seg[j] .. d_seg[j + 1] - 1 (device, n_seg + 1 ascending ints), its
// patches attending to each other only (Qwen2.5-VL's window attention);
// max_rows bounds every segment's rows.
void flash_attention_segments(const __half* qkv, const int32_t* d_seg, int n_seg, int max_rows, int width, int n_head,
                              float scale, float* out, cudaStream_t s);

}  // namespace ehcuda::vision
