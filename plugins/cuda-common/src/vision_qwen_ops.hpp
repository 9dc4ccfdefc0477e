// Qwen2.5-VL's tower kernels (vision_qwen_ops.cu), for vision_qwen.cpp.
// Rows are dense: row t of a [rows][n] buffer at t * n. Patches are in the
// order the tower runs them (window order: vision_qwen.cpp), each with its
// (row, column) in the patch grid in d_rc (two ints a patch).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace ehcuda::vision::qwen {

// out[t][(c * patch + ky) * patch + kx] = the patch's pixel of three
// width x height planes.
void gather_patches(const float* pixels, int width, int height, int patch, const int32_t* d_rc, int n, float* out,
                    cudaStream_t s);
// out = x / rms(x) * w per row (the mean of squares summed in double, as
// cpu-reference does); with outh, written there as halves instead.
void rms_rows(const float* x, const float* w, float eps, int rows, int n, float* out, __half* outh, cudaStream_t s);
// The 2-D RoPE of every head of Q and K in rows of [q | k | v] (3 * width
// floats, in place): pair (i, i + hd / 2) of a head turned by cs / sn[t][i]
// (hd / 2 a patch). With qkvh, the whole rows also written there as halves.
void rope2d(float* qkv, int n, int width, int n_head, const float* cs, const float* sn, __half* qkvh, cudaStream_t s);
// Each of heads * n rows of n scores (query row r % n) to its softmax over
// the keys of its query's window (d_win[key] == d_win[query]; every key
// when d_win is null), into outf (may be the scores) or, when null, outh.
void window_softmax(const float* scores, int heads, int n, const int32_t* d_win, float* outf, __half* outh,
                    cudaStream_t s);
// out[t][i] = silu(gu[t][i] + b[i]) * (gu[t][ff + i] + b[ff + i]); with
// outh, written there as halves instead.
void swiglu_bias(const float* gu, const float* bias, int rows, int ff, float* out, __half* outh, cudaStream_t s);
// y[t][e] = gelu_erf(y[t][e] + b[e]) in place; with outh, written there as
// halves instead (y unchanged).
void bias_gelu_erf(float* y, const float* bias, int rows, int n, __half* outh, cudaStream_t s);

}  // namespace ehcuda::vision::qwen
