// CUDA graph capture of a fixed sequence of launches (the decode step).
// Kernels read changing values (position, token) from device memory, so one
// captured graph is replayed for every step.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

namespace ehcuda {

class CapturedGraph {
public:
    CapturedGraph() = default;
    ~CapturedGraph() { reset(); }
    CapturedGraph(const CapturedGraph&) = delete;
    CapturedGraph& operator=(const CapturedGraph&) = delete;

    // Records everything `body` enqueues on `stream` (which must not be the
    // legacy default stream) and instantiates it. On failure nothing is kept
    // and the error is rethrown.
    void capture(cudaStream_t stream, const std::function<void()>& body);
    void launch(cudaStream_t stream) const;
    bool ready() const { return exec_ != nullptr; }
    void reset() noexcept;

private:
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
};

// RAII stream.
class Stream {
public:
    Stream();
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    cudaStream_t get() const { return s_; }

private:
    cudaStream_t s_ = nullptr;
};

}  // namespace ehcuda
