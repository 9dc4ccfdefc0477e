#include "images.hpp"

#include <string>

#include <engine_host/plugin_abi.hpp>

#include <ehcuda/check.hpp>

namespace llama_cuda {

using ehp::Error;

void ImageSteps::set(const ehcuda::CudaSeq* seq, const eh_embd_span* spans, uint32_t n) {
    if (n == 0) {
        pending_.erase(seq);
        return;
    }
    pending_[seq].assign(spans, spans + n);
}

void ImageSteps::take(eh_step_entry* entries, uint32_t n, ehcuda::MemoryLedger* ledger, int max_tokens) {
    clear();
    if (pending_.empty() || !entries || n == 0 || entries[0].struct_size < sizeof(eh_step_entry)) return;
    const uint32_t stride = entries[0].struct_size;
    step_.resize(n);
    bidir_.assign(n, false);
    for (uint32_t i = 0; i < n; ++i) {
        const eh_step_entry& e = ehp::step_entry(entries, stride, i);
        auto it = pending_.find(static_cast<const ehcuda::CudaSeq*>(e.seq));
        if (it == pending_.end()) continue;
        step_[i].swap(it->second);
        pending_.erase(it);
        any_ = true;
    }
    if (!any_) return;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; ++i) {
        const eh_step_entry& e = ehp::step_entry(entries, stride, i);
        const std::vector<eh_embd_span>& spans = step_[i];
        const std::string at = "step entry " + std::to_string(i) + ": ";
        total += e.n_tokens;
        if (spans.empty()) continue;
        if (e.flags & (EH_STEP_CHAINED | EH_STEP_VERIFY))
            throw Error(EH_INVALID_ARGUMENT, at + "embedding spans on an EH_STEP_CHAINED or EH_STEP_VERIFY entry");
        uint64_t next = 0;
        for (size_t j = 0; j < spans.size(); ++j) {
            const eh_embd_span& s = spans[j];
            if (s.count == 0 || !s.rows || s.first < next || uint64_t(s.first) + s.count > e.n_tokens)
                throw Error(EH_INVALID_ARGUMENT, at + "embedding span " + std::to_string(j) + " (first " +
                                                     std::to_string(s.first) + ", count " + std::to_string(s.count) +
                                                     ") is empty, has no rows, overlaps the one before or ends past the " +
                                                     std::to_string(e.n_tokens) + " tokens");
            if ((s.flags & EH_SPAN_GRID) && (s.grid_width == 0 || s.count % s.grid_width != 0))
                throw Error(EH_INVALID_ARGUMENT, at + "embedding span " + std::to_string(j) + " is a grid of width " +
                                                     std::to_string(s.grid_width) + " that does not divide its " +
                                                     std::to_string(s.count) + " positions");
            if (s.flags & EH_SPAN_BIDIRECTIONAL) bidir_[i] = true;
            next = uint64_t(s.first) + s.count;
        }
    }
    // (the step's own checks refuse a step past max_tokens; the reach is
    // only laid out for one that fits)
    if (total > uint64_t(max_tokens)) return;
    reach_.assign(size_t(total), 0);
    size_t t0 = 0;
    for (uint32_t i = 0; i < n; ++i) {
        for (const eh_embd_span& s : step_[i])
            if (s.flags & EH_SPAN_BIDIRECTIONAL)
                for (uint32_t k = 0; k < s.count; ++k) reach_[t0 + s.first + k] = int32_t(s.count - 1 - k);
        t0 += ehp::step_entry(entries, stride, i).n_tokens;
    }
    if (!d_reach_.get()) d_reach_ = ehcuda::DeviceBuffer(size_t(max_tokens) * sizeof(int32_t), ledger);
}

int ImageSteps::first_bidirectional() const {
    for (size_t i = 0; i < bidir_.size(); ++i)
        if (bidir_[i]) return int(i);
    return -1;
}

void ImageSteps::clear() {
    step_.clear();
    bidir_.clear();
    reach_.clear();
    any_ = false;
}

void ImageSteps::apply(const ehcuda::StepView& v, float* h, int n_embd, cudaStream_t s) {
    if (!any_) return;
    // (pageable sources: each copy has read its rows when it returns, so
    // the host may free them once the step call is back)
    for (int i = 0; i < v.nspans && size_t(i) < step_.size(); ++i)
        for (const eh_embd_span& sp : step_[size_t(i)])
            EHC_CHECK(cudaMemcpyAsync(h + (size_t(v.spans[i].first) + sp.first) * size_t(n_embd), sp.rows,
                                      size_t(sp.count) * size_t(n_embd) * sizeof(float), cudaMemcpyHostToDevice, s));
    if (!reach_.empty() && d_reach_.get())
        EHC_CHECK(cudaMemcpyAsync(d_reach_.get(), reach_.data(), reach_.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, s));
}

}  // namespace llama_cuda
