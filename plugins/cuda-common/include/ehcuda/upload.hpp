// Weight upload from the host's read-only mmap view into device memory,
// through pinned staging buffers in bounded chunks. Two staging buffers
// alternate so the memcpy into one overlaps the DMA out of the other. The
// mapping itself is never registered or pinned: pages are only read.
// MXFP4 items go through a device staging buffer as well (two, alternating
// with the pinned ones) and are rewritten from there into the device layout
// (mxfp4_layout.hpp), in chunks of whole rows.
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
    size_t bytes;     // source bytes
    // > 0: src holds ggml MXFP4 rows of this many values (bytes a whole
    // number of them) and dst (16-byte aligned) gets them in the device
    // layout, mxfp4_device_row_bytes(mxfp4_cols) per row.
    int mxfp4_cols = 0;
};

struct UploadOptions {
    // Staging buffer size (each of two; for MXFP4 items at least one row).
    size_t chunk_bytes = 1u << 20;
    // Reported fractions are mapped into [progress_lo, progress_hi].
    float progress_lo = 0.0f;
    float progress_hi = 1.0f;
    // Called with a fraction at least at every whole percent crossed.
    std::function<void(float)> progress;
    // Polled before every chunk; true = stop (throws ehp::Error CANCELLED).
    std::function<bool()> cancelled;
};

class Options;  // options.hpp
// The load option "upload_chunk_bytes": 4 KiB .. 1 GiB (INVALID_ARGUMENT
// outside), default UploadOptions::chunk_bytes.
size_t upload_chunk_option(const Options& options);

struct UploadStats {
    size_t bytes = 0;  // source bytes
    double seconds = 0;
};

// Copies every item; throws on a CUDA error, cancellation or a malformed
// MXFP4 item (cols, byte count, alignment). The device buffers are left as
// they are on failure (the caller frees them).
UploadStats upload_weights(const std::vector<UploadItem>& items, const UploadOptions& opt,
                           cudaStream_t stream);

}  // namespace ehcuda
