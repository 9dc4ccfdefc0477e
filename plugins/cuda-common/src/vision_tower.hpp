// What the image towers (vision_gemma3.cpp, vision_qwen.cpp) share on the
// host (vision_tower.cpp): the projector check, uploads, the matrices (F16
// when every source tensor was F16, else F32), the stream and cuBLAS handle
// a tower runs on, its linear layers (cublasGemmEx, FP32 accumulation) and
// the GEMM path's attention (scores, a softmax the tower supplies, values).
#pragma once

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/check.hpp"
#include "ehcuda/device_memory.hpp"

namespace ehcuda::vision {

// The GEMM path's attention scores of this many bytes at most are held at
// once: heads are taken in groups that fit (one at a time past it), so a
// 4096-patch image (Gemma 3's 896 pixels) holds 4 of its 16 heads' scores.
constexpr size_t kScoreBytes = size_t(256) << 20;

// The mmproj file's clip.projector_type, which must be `type`: else
// EH_UNSUPPORTED, "mmproj projector type '<its type>' " + `refusal`.
void require_projector(const ehp::ModelView& v, const char* type, const char* refusal);

// A failed cuBLAS call as ehp::Error naming it: EH_VRAM_OOM when cuBLAS ran
// out of memory, else EH_CUDA_ERROR.
void check_cublas(cublasStatus_t st, const char* what);

template <class T>
DeviceBuffer upload(const T* data, size_t n, MemoryLedger* ledger) {
    DeviceBuffer b(n * sizeof(T), ledger);
    EHC_CHECK(cudaMemcpy(b.get(), data, n * sizeof(T), cudaMemcpyHostToDevice));
    return b;
}

// The n values of tensor `name` as floats, on the device.
DeviceBuffer device_floats(const ehp::ModelView& v, const std::string& name, uint64_t n, MemoryLedger* ledger);

// Row-major [rows][cols]: F16 when every source tensor was F16, else F32.
struct Mat {
    DeviceBuffer buf;
    bool half = false;
    int rows = 0, cols = 0;
};

// `parts` (rows_each x cols each, `names` theirs for the messages) stacked
// into one matrix: copied as they are when all are F16, else as floats.
Mat upload_mat(const std::vector<const eh_tensor*>& parts, const std::vector<std::string>& names, int rows_each,
               int cols, MemoryLedger* ledger);

// A GEMM's input goes to memory in its matrix's type: the kernel before it
// writes halves (xh) for an F16 matrix, floats (f) otherwise.
inline const void* input_of(const Mat& m, const __half* xh, const float* f) {
    return m.half ? static_cast<const void*>(xh) : static_cast<const void*>(f);
}

// The GEMM path's attention over n rows of qkv, [q | k | v] of `width`
// each (halves when `half`, else floats), heads of width / n_head dims.
struct GemmAttention {
    const void* qkv = nullptr;
    bool half = false;
    int n = 0, width = 0, n_head = 0;
    int per = 1;  // heads whose scores `scores` holds at once
    float scale = 1.0f;
    float* scores = nullptr;  // per * n * n floats
    __half* ph = nullptr;     // per * n * n halves when `half`
    float* att = nullptr;     // [n][width] out
};
// The tower's softmax over hg heads' scores (`scores` of GemmAttention, hg
// x n rows of n): in place (outf is scores), or as halves into outh.
using ScoreSoftmax = std::function<void(int hg, float* outf, __half* outh)>;

// A tower's non-blocking stream and the cuBLAS handle on it.
class Gemms {
public:
    Gemms();
    ~Gemms();
    Gemms(const Gemms&) = delete;
    Gemms& operator=(const Gemms&) = delete;

    cudaStream_t stream() const { return stream_; }
    cublasHandle_t blas() const { return blas_; }

    // y[n][w.rows] = in[n][w.cols] . w^T, `in` already in the matrix's type.
    void linear_in(const Mat& w, const void* in, int n, float* y) const;
    // The same from F32 rows x (rounded to F16 into xh first for an F16 matrix).
    void linear(const Mat& w, const float* x, int n, float* y, __half* xh) const;
    // att = softmax(q k^T * scale) v per head, `per` heads at a time.
    void attention(const GemmAttention& a, const ScoreSoftmax& softmax) const;

private:
    cudaStream_t stream_ = nullptr;
    cublasHandle_t blas_ = nullptr;
};

}  // namespace ehcuda::vision
