#include "ehcuda/device_memory.hpp"

#include <cuda_runtime_api.h>

#include "ehcuda/check.hpp"

namespace ehcuda {

DeviceBuffer::DeviceBuffer(size_t bytes, MemoryLedger* ledger) : ledger_(ledger) {
    if (bytes == 0) return;
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw ehp::Error(err == cudaErrorMemoryAllocation ? EH_VRAM_OOM : EH_CUDA_ERROR,
                         "cudaMalloc(" + std::to_string(bytes) + " bytes) failed: " +
                             cudaGetErrorString(err));
    }
    ptr_ = p;
    size_ = bytes;
    if (ledger_) ledger_->add(size_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
        reset();
        ptr_ = std::exchange(o.ptr_, nullptr);
        size_ = std::exchange(o.size_, 0);
        ledger_ = std::exchange(o.ledger_, nullptr);
    }
    return *this;
}

void DeviceBuffer::reset() noexcept {
    if (ptr_) {
        cudaFree(ptr_);
        if (ledger_) ledger_->sub(size_);
    }
    ptr_ = nullptr;
    size_ = 0;
}

DeviceMemoryInfo device_memory_info(int device) {
    EHC_CHECK(cudaSetDevice(device));
    DeviceMemoryInfo info;
    EHC_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
    return info;
}

std::string device_name(int device) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return "cuda:" + std::to_string(device);
    }
    return prop.name;
}

void require_free_memory(int device, size_t required, const std::string& what) {
    DeviceMemoryInfo info = device_memory_info(device);
    if (required > info.free_bytes) {
        throw ehp::Error(EH_INSUFFICIENT_VRAM,
                         "insufficient VRAM: required " + std::to_string(required) +
                             " bytes, available " + std::to_string(info.free_bytes) +
                             " bytes (total " + std::to_string(info.total_bytes) + ") on device " +
                             std::to_string(device) + " (" + device_name(device) + ") for " + what);
    }
}

std::string check_device_resident(const std::vector<std::pair<const void*, std::string>>& ptrs) {
    for (const auto& [p, name] : ptrs) {
        cudaPointerAttributes attr{};
        cudaError_t err = cudaPointerGetAttributes(&attr, p);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            return name + ": cudaPointerGetAttributes failed: " + cudaGetErrorString(err);
        }
        if (attr.type != cudaMemoryTypeDevice)
            return name + ": not device memory (type " + std::to_string(int(attr.type)) + ")";
        if (attr.hostPointer != nullptr) return name + ": has a host mapping";
    }
    return "";
}

}  // namespace ehcuda
