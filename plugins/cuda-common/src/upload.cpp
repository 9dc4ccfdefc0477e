#include "ehcuda/upload.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/device_memory.hpp"
#include "ehcuda/mxfp4_layout.hpp"
#include "ehcuda/options.hpp"

namespace ehcuda {
namespace {

// Pinned host staging buffer, the device staging buffer of MXFP4 rows, and
// the event that says the work reading them (DMA, repack) has finished.
struct Staging {
    void* host = nullptr;
    DeviceBuffer dev;
    cudaEvent_t done = nullptr;
    ~Staging() {
        if (done) cudaEventDestroy(done);
        if (host) cudaFreeHost(host);
    }
};

// Source bytes of one MXFP4 row of an item, after checking the item.
size_t mxfp4_src_row(const UploadItem& it) {
    const size_t rb = mxfp4_file_row_bytes(it.mxfp4_cols);
    if (rb == 0)
        throw ehp::Error(EH_INTERNAL, "upload: MXFP4 item with " + std::to_string(it.mxfp4_cols) +
                                          " columns (not a positive multiple of 32)");
    if (it.bytes % rb)
        throw ehp::Error(EH_INTERNAL, "upload: MXFP4 item of " + std::to_string(it.bytes) +
                                          " bytes is not whole rows of " + std::to_string(rb));
    if (reinterpret_cast<uintptr_t>(it.dst) % 16) throw ehp::Error(EH_INTERNAL, "upload: MXFP4 destination is not 16-byte aligned");
    return rb;
}

}  // namespace

UploadStats upload_weights(const std::vector<UploadItem>& items, const UploadOptions& opt,
                           cudaStream_t stream) {
    auto t0 = std::chrono::steady_clock::now();
    const size_t chunk = opt.chunk_bytes ? opt.chunk_bytes : (1u << 20);
    size_t total = 0, cap = chunk;
    bool any_mxfp4 = false;
    for (const auto& it : items) {
        total += it.bytes;
        if (it.mxfp4_cols > 0) {
            cap = std::max(cap, mxfp4_src_row(it));  // at least one whole row
            any_mxfp4 = true;
        }
    }

    Staging stage[2];
    for (auto& s : stage) {
        EHC_CHECK(cudaMallocHost(&s.host, cap));
        if (any_mxfp4) s.dev = DeviceBuffer(cap);
        EHC_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    }
    bool in_flight[2] = {false, false};

    auto report = [&](size_t done) {
        if (!opt.progress) return;
        float f = total ? float(double(done) / double(total)) : 1.0f;
        opt.progress(opt.progress_lo + (opt.progress_hi - opt.progress_lo) * f);
    };

    size_t done = 0;
    int last_percent = -1;
    int which = 0;
    report(0);
    for (const auto& it : items) {
        const char* src = static_cast<const char*>(it.src);
        char* dst = static_cast<char*>(it.dst);
        // MXFP4: whole source rows per chunk (at least one).
        const size_t src_row = it.mxfp4_cols > 0 ? mxfp4_src_row(it) : 0;
        const size_t dst_row = it.mxfp4_cols > 0 ? mxfp4_device_row_bytes(it.mxfp4_cols) : 0;
        const size_t step = src_row ? std::max<size_t>(1, chunk / src_row) * src_row : chunk;
        for (size_t off = 0; off < it.bytes; off += step) {
            if (opt.cancelled && opt.cancelled()) {
                cudaStreamSynchronize(stream);
                throw ehp::Error(EH_CANCELLED, "model load cancelled");
            }
            size_t n = it.bytes - off < step ? it.bytes - off : step;
            Staging& s = stage[which];
            // Wait until this staging buffer's previous DMA (and repack) has drained.
            if (in_flight[which]) EHC_CHECK(cudaEventSynchronize(s.done));
            std::memcpy(s.host, src + off, n);
            if (src_row) {
                EHC_CHECK(cudaMemcpyAsync(s.dev.get(), s.host, n, cudaMemcpyHostToDevice, stream));
                mxfp4_repack_rows(s.dev.get(), dst + off / src_row * dst_row, int64_t(n / src_row), it.mxfp4_cols,
                                  stream);
            } else {
                EHC_CHECK(cudaMemcpyAsync(dst + off, s.host, n, cudaMemcpyHostToDevice, stream));
            }
            EHC_CHECK(cudaEventRecord(s.done, stream));
            in_flight[which] = true;
            which ^= 1;
            done += n;
            int percent = total ? int(done * 100 / total) : 100;
            if (percent != last_percent) {
                last_percent = percent;
                report(done);
            }
        }
    }
    EHC_CHECK(cudaStreamSynchronize(stream));
    report(total);
    UploadStats st;
    st.bytes = total;
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
}

size_t upload_chunk_option(const Options& options) {
    return size_t(options.integer("upload_chunk_bytes", int64_t(UploadOptions{}.chunk_bytes), 4096, int64_t(1) << 30));
}

}  // namespace ehcuda
