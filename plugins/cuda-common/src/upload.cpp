#include "ehcuda/upload.hpp"

#include <chrono>
#include <cstring>

#include "ehcuda/check.hpp"

namespace ehcuda {
namespace {

// Pinned host staging buffer plus the event that says its DMA finished.
struct Staging {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
    ~Staging() {
        if (done) cudaEventDestroy(done);
        if (host) cudaFreeHost(host);
    }
};

}  // namespace

UploadStats upload_weights(const std::vector<UploadItem>& items, const UploadOptions& opt,
                           cudaStream_t stream) {
    auto t0 = std::chrono::steady_clock::now();
    size_t chunk = opt.chunk_bytes ? opt.chunk_bytes : (1u << 20);
    size_t total = 0;
    for (const auto& it : items) total += it.bytes;

    Staging stage[2];
    for (auto& s : stage) {
        EHC_CHECK(cudaMallocHost(&s.host, chunk));
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
        for (size_t off = 0; off < it.bytes; off += chunk) {
            if (opt.cancelled && opt.cancelled()) {
                cudaStreamSynchronize(stream);
                throw ehp::Error(EH_CANCELLED, "model load cancelled");
            }
            size_t n = it.bytes - off < chunk ? it.bytes - off : chunk;
            Staging& s = stage[which];
            // Wait until this staging buffer's previous DMA has drained.
            if (in_flight[which]) EHC_CHECK(cudaEventSynchronize(s.done));
            std::memcpy(s.host, src + off, n);
            EHC_CHECK(cudaMemcpyAsync(dst + off, s.host, n, cudaMemcpyHostToDevice, stream));
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

}  // namespace ehcuda
