#include "ehcuda/prefill_workspace.hpp"

#include <cublas_v2.h>

#include <algorithm>
#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/kernel_plan.hpp"

namespace ehcuda {
namespace {

// cuBLAS's own scratch, given explicitly so that it is on the ledger too.
// 4 MiB, not the 32 MiB suggested for Hopper: it is charged to every session
// and counts against the memory bound (weights + KV + 10 %).
constexpr size_t kCublasWorkspace = size_t(4) << 20;

void check_cublas(cublasStatus_t st, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    const eh_status code = st == CUBLAS_STATUS_ALLOC_FAILED ? EH_VRAM_OOM : EH_INTERNAL;
    throw ehp::Error(code, std::string(what) + " failed: " + cublasGetStatusName(st));
}

}  // namespace

PrefillWorkspace::PrefillWorkspace(const PrefillShape& shape, cudaStream_t stream, MemoryLedger* ledger)
    : shape_(shape), stream_(stream) {
    if (shape.max_tokens <= 0 || shape.max_cols <= 0) throw ehp::Error(EH_INTERNAL, "prefill workspace: empty shape");
    const KernelPlan& kp = plan();
    min_tokens_ = kp.prefill_min_tokens;
    if (kp.prefill_slab_mb > 0) shape_.slab_bytes = size_t(kp.prefill_slab_mb) << 20;
    if (kp.prefill_dense_slab_mb > 0) shape_.dense_slab_bytes = size_t(kp.prefill_dense_slab_mb) << 20;
    if (shape_.moe_experts <= 0) shape_.slab_bytes = std::min(shape_.slab_bytes, shape_.dense_slab_bytes);
    // At least 64 rows of the widest input fit the slab.
    shape_.slab_bytes = std::max(shape_.slab_bytes, size_t(std::max(shape_.max_cols, shape_.moe_ff + shape_.moe_embd)) * 2 * 64);
    const size_t T = size_t(shape_.max_tokens);
    size_t act = T * size_t(shape_.max_cols);
    if (shape_.moe_experts > 0) {
        if (shape_.moe_k <= 0 || shape_.moe_embd <= 0 || shape_.moe_ff <= 0)
            throw ehp::Error(EH_INTERNAL, "prefill workspace: bad MoE shape");
        const size_t P = T * size_t(shape_.moe_k);
        act = std::max(act, P * size_t(std::max(shape_.moe_embd, shape_.moe_ff)));
        moe_out_ = DeviceBuffer(P * size_t(std::max(2 * shape_.moe_ff, shape_.moe_embd)) * sizeof(float), ledger);
        moe_sorted_ = DeviceBuffer(P * sizeof(int32_t), ledger);
        moe_pos_ = DeviceBuffer(P * sizeof(int32_t), ledger);
        moe_offsets_ = DeviceBuffer(size_t(shape_.moe_experts + 1) * sizeof(int32_t), ledger);
    }
    slab_ = DeviceBuffer(shape_.slab_bytes, ledger);
    act_ = DeviceBuffer(act * sizeof(__half), ledger);
    cublas_ws_ = DeviceBuffer(kCublasWorkspace, ledger);
    try {
        if (shape_.moe_experts > 0)
            EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_offsets_), size_t(shape_.moe_experts + 1) * sizeof(int32_t)));
        check_cublas(cublasCreate(&handle_), "cublasCreate");
        check_cublas(cublasSetStream(handle_, stream_), "cublasSetStream");
        check_cublas(cublasSetWorkspace(handle_, cublas_ws_.get(), cublas_ws_.size()), "cublasSetWorkspace");
    } catch (...) {
        if (handle_) cublasDestroy(handle_);
        handle_ = nullptr;
        if (host_offsets_) cudaFreeHost(host_offsets_);
        host_offsets_ = nullptr;
        throw;
    }
}

PrefillWorkspace::~PrefillWorkspace() {
    if (handle_) cublasDestroy(handle_);
    if (host_offsets_) cudaFreeHost(host_offsets_);
}

size_t PrefillWorkspace::dense_slab_halves() const {
    const size_t dense = std::max(shape_.dense_slab_bytes / sizeof(__half), size_t(shape_.max_cols) * 64);
    return std::min(slab_halves(), dense);
}

size_t PrefillWorkspace::device_bytes() const {
    return cublas_ws_.size() + slab_.size() + act_.size() + moe_out_.size() + moe_sorted_.size() + moe_pos_.size() +
           moe_offsets_.size();
}

}  // namespace ehcuda
