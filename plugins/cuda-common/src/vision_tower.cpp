#include "vision_tower.hpp"

#include <algorithm>
#include <cstring>

#include <engine_host/mmproj.hpp>

#include "vision_ops.hpp"

namespace ehcuda::vision {

void require_projector(const ehp::ModelView& v, const char* type, const char* refusal) {
    const std::string proj = ehp::mmproj::projector_type(v);
    if (proj != type) throw ehp::Error(EH_UNSUPPORTED, "mmproj projector type '" + proj + "' " + refusal);
}

void check_cublas(cublasStatus_t st, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    throw ehp::Error(st == CUBLAS_STATUS_ALLOC_FAILED ? EH_VRAM_OOM : EH_CUDA_ERROR,
                     std::string("image encoder: ") + what + " failed: " + cublasGetStatusName(st));
}

DeviceBuffer device_floats(const ehp::ModelView& v, const std::string& name, uint64_t n, MemoryLedger* ledger) {
    const std::vector<float> f = ehp::mmproj::floats(v, name, n);
    return upload(f.data(), f.size(), ledger);
}

Mat upload_mat(const std::vector<const eh_tensor*>& parts, const std::vector<std::string>& names, int rows_each,
               int cols, MemoryLedger* ledger) {
    Mat m;
    m.rows = rows_each * int(parts.size());
    m.cols = cols;
    m.half = std::all_of(parts.begin(), parts.end(), [](const eh_tensor* t) { return t->type == EH_TYPE_F16; });
    const size_t n = size_t(rows_each) * cols;
    if (m.half) {
        std::vector<uint16_t> all(n * parts.size());
        for (size_t i = 0; i < parts.size(); ++i) std::memcpy(&all[i * n], parts[i]->data, n * 2);
        m.buf = upload(all.data(), all.size(), ledger);
    } else {
        std::vector<float> all;
        all.reserve(n * parts.size());
        for (size_t i = 0; i < parts.size(); ++i) {
            const std::vector<float> f = ehp::mmproj::floats(*parts[i], names[i], n);
            all.insert(all.end(), f.begin(), f.end());
        }
        m.buf = upload(all.data(), all.size(), ledger);
    }
    return m;
}

Gemms::Gemms() {
    EHC_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    try {
        check_cublas(cublasCreate(&blas_), "cublasCreate");
        check_cublas(cublasSetStream(blas_, stream_), "cublasSetStream");
    } catch (...) {
        if (blas_) cublasDestroy(blas_);
        cudaStreamDestroy(stream_);
        throw;
    }
}

Gemms::~Gemms() {
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
}

void Gemms::linear_in(const Mat& w, const void* in, int n, float* y) const {
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType t = w.half ? CUDA_R_16F : CUDA_R_32F;
    check_cublas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, w.rows, n, w.cols, &one, w.buf.get(), t, w.cols, in, t,
                              w.cols, &zero, y, CUDA_R_32F, w.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
}

void Gemms::linear(const Mat& w, const float* x, int n, float* y, __half* xh) const {
    if (w.half) {
        to_half(x, size_t(n) * w.cols, xh, stream_);
        linear_in(w, xh, n, y);
    } else {
        linear_in(w, x, n, y);
    }
}

void Gemms::attention(const GemmAttention& a, const ScoreSoftmax& softmax) const {
    const int N = a.n, W = a.width, hd = a.width / a.n_head;
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType t = a.half ? CUDA_R_16F : CUDA_R_32F;
    const size_t esz = a.half ? 2 : 4;
    const char* q = static_cast<const char*>(a.qkv);
    const long long nn = (long long)N * N;
    for (int h0 = 0; h0 < a.n_head; h0 += a.per) {
        const int hg = std::min(a.per, a.n_head - h0);
        const char* qh = q + size_t(h0) * hd * esz;
        const char* kh = q + (size_t(W) + size_t(h0) * hd) * esz;
        const char* vh = q + (size_t(2) * W + size_t(h0) * hd) * esz;
        // scores (col-major keys x queries, i.e. row-major [query][key])
        check_cublas(cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, N, hd, &a.scale, kh, t, 3 * W, hd,
                                                qh, t, 3 * W, hd, &zero, a.scores, CUDA_R_32F, N, nn, hg,
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmStridedBatchedEx (scores)");
        const void* p = a.scores;
        if (a.half) {
            softmax(hg, nullptr, a.ph);
            p = a.ph;
        } else {
            softmax(hg, a.scores, nullptr);
        }
        check_cublas(cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_N, CUBLAS_OP_N, hd, N, N, &one, vh, t, 3 * W, hd, p, t,
                                                N, nn, &zero, a.att + size_t(h0) * hd, CUDA_R_32F, W, hd, hg,
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmStridedBatchedEx (values)");
    }
}

}  // namespace ehcuda::vision
