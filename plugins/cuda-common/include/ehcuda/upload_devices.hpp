// A tensor-parallel load's upload: the arenas of several GPUs (the model's
// and each rank's), each arena's items on a stream of its own GPU, one
// after another, the progress shared by bytes over [progress_lo,
// progress_hi] of `opt` (upload.hpp). The last arena's GPU is left current.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include <ehcuda/check.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/upload.hpp>

namespace ehcuda {

// (GPU ordinal, its arena's items) per arena.
using DeviceUploads = std::vector<std::pair<int, std::vector<UploadItem>>>;

inline void upload_on_devices(const DeviceUploads& uploads, const UploadOptions& opt) {
    size_t total = 0, done = 0;
    for (const auto& u : uploads)
        for (const UploadItem& it : u.second) total += it.bytes;
    const double whole = double(std::max<size_t>(total, 1)), span = double(opt.progress_hi - opt.progress_lo);
    for (const auto& [dev, items] : uploads) {
        size_t bytes = 0;
        for (const UploadItem& it : items) bytes += it.bytes;
        EHC_CHECK(cudaSetDevice(dev));
        Stream stream;
        UploadOptions up = opt;
        up.progress_lo = opt.progress_lo + float(span * double(done) / whole);
        up.progress_hi = opt.progress_lo + float(span * double(done + bytes) / whole);
        upload_weights(items, up, stream.get());
        done += bytes;
    }
}

}  // namespace ehcuda
