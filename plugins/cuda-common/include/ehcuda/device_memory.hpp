// Device memory: plain cudaMalloc only (never managed, mapped or host
// memory), with a ledger that counts every byte a model or session holds so
// the plugin can report what it really uses.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ehcuda {

// Bytes currently held through DeviceBuffers that point at this ledger.
class MemoryLedger {
public:
    void add(size_t n) { bytes_.fetch_add(n, std::memory_order_relaxed); }
    void sub(size_t n) { bytes_.fetch_sub(n, std::memory_order_relaxed); }
    size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

private:
    std::atomic<size_t> bytes_{0};
};

// One cudaMalloc'd allocation, freed on destruction. Throws ehp::Error with
// VRAM_OOM when the allocation fails (nothing is left allocated).
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(size_t bytes, MemoryLedger* ledger = nullptr);
    ~DeviceBuffer() { reset(); }
    DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void reset() noexcept;
    void* get() const { return ptr_; }
    template <class T> T* as() const { return static_cast<T*>(ptr_); }
    size_t size() const { return size_; }
    explicit operator bool() const { return ptr_ != nullptr; }

private:
    void* ptr_ = nullptr;
    size_t size_ = 0;
    MemoryLedger* ledger_ = nullptr;
};

// Bump allocator over one DeviceBuffer; every piece is 256-byte aligned.
// Plan first (reserve), then allocate once, then carve (take).
class DeviceArena {
public:
    static constexpr size_t kAlign = 256;
    static size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

    // Sizing pass: returns the offset the piece will get.
    size_t reserve(size_t bytes) {
        size_t off = planned_;
        planned_ += align_up(bytes ? bytes : 1);
        return off;
    }
    size_t planned_bytes() const { return planned_; }
    void allocate(MemoryLedger* ledger) { buf_ = DeviceBuffer(planned_, ledger); }
    void* at(size_t offset) const { return static_cast<char*>(buf_.get()) + offset; }
    const DeviceBuffer& buffer() const { return buf_; }

private:
    size_t planned_ = 0;
    DeviceBuffer buf_;
};

struct DeviceMemoryInfo {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
};
DeviceMemoryInfo device_memory_info(int device);

// Throws INSUFFICIENT_VRAM naming required and available bytes, the device
// and `what` (the model path) when `required` does not fit in free memory.
void require_free_memory(int device, size_t required, const std::string& what);

// Residency: every pointer must be device memory (cudaMemoryTypeDevice) with
// no host mapping. Returns "" when all are resident, else the first reason.
std::string check_device_resident(const std::vector<std::pair<const void*, std::string>>& ptrs);

std::string device_name(int device);

}  // namespace ehcuda
