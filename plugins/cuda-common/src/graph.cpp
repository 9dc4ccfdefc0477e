#include "ehcuda/graph.hpp"

#include "ehcuda/check.hpp"

namespace ehcuda {

void CapturedGraph::capture(cudaStream_t stream, const std::function<void()>& body) {
    reset();
    EHC_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
        body();
    } catch (...) {
        cudaGraph_t g = nullptr;
        cudaStreamEndCapture(stream, &g);
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        throw;
    }
    EHC_CHECK(cudaStreamEndCapture(stream, &graph_));
    cudaError_t err = cudaGraphInstantiate(&exec_, graph_, 0);
    if (err != cudaSuccess) {
        exec_ = nullptr;
        reset();
        check(err, "cudaGraphInstantiate", __FILE__, __LINE__);
    }
}

void CapturedGraph::launch(cudaStream_t stream) const {
    if (!exec_) throw ehp::Error(EH_INTERNAL, "graph launched before capture");
    EHC_CHECK(cudaGraphLaunch(exec_, stream));
}

void CapturedGraph::reset() noexcept {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
}

Stream::Stream() { EHC_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
    if (s_) cudaStreamDestroy(s_);
}

}  // namespace ehcuda
