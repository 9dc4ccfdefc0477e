// Weight upload from the host's read-only mmap view into device memory,
// through pinned staging buffers in bounded chunks. Two staging buffers
// alternate so the memcpy into one overlaps the DMA out of the other. The
// mapping itself is never registered or pinned: pages are only read.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace ehcuda {

struct UploadItem {
    const void* src;  // host (mmap) bytes
    void* dst;        // device bytes
    size_t bytes;
};

struct UploadOptions {
    size_t chunk_bytes = 1u << 20;  // staging buffer size (each of two)
    // Reported fractions are mapped into [progress_lo, progress_hi].
    float progress_lo = 0.0f;
    float progress_hi = 1.0f;
    // Called with a fraction at least at every whole percent crossed.
    std::function<void(float)> progress;
    // Polled before every chunk; true = stop (throws ehp::Error CANCELLED).
    std::function<bool()> cancelled;
};

struct UploadStats {
    size_t bytes = 0;
    double seconds = 0;
};

// Copies every item; throws on a CUDA error or cancellation. The device
// buffers are left as they are on failure (the caller frees them).
UploadStats upload_weights(const std::vector<UploadItem>& items, const UploadOptions& opt,
                           cudaStream_t stream);

}  // namespace ehcuda
