// ABI 1.6's image rows in llama-cuda's batched step (seq_embd_spans): the
// spans each sequence was given for its next step, taken when that step
// begins and dropped after it whatever happens; the rows copied over the
// step's token embeddings (after Gemma's embedding scale: rows are used as
// given); and for a span flagged EH_SPAN_BIDIRECTIONAL (Gemma 3's images)
// how far past its own position each token sees, which routes its entry's
// attention to ehcuda::attention_span. EH_SPAN_GRID lays a span out on its
// grid for M-RoPE (qwen2vl: mrope_positions.hpp places it from spans());
// on a model of one position axis the flag changes nothing, as the ABI says.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include <engine_host/plugin_abi.h>

#include <ehcuda/batch.hpp>
#include <ehcuda/device_memory.hpp>

namespace llama_cuda {

class ImageSteps {
public:
    // seq_embd_spans: kept for the sequence's next step (n 0 clears them).
    // The host keeps the rows valid until that step call returns.
    void set(const ehcuda::CudaSeq* seq, const eh_embd_span* spans, uint32_t n);
    // The sequence is released: its spans go.
    void forget(const ehcuda::CudaSeq* seq) { pending_.erase(seq); }
    // At a step's start: every entry's spans become the step's (and are no
    // longer pending), then are checked as cpu-reference checks them:
    // ehp::Error(EH_INVALID_ARGUMENT) naming the entry for a span that is
    // empty, has no rows, overlaps the one before, ends past the entry's
    // tokens, is a grid whose width does not divide it, or is on an
    // EH_STEP_CHAINED or EH_STEP_VERIFY entry. `ledger` counts the reach
    // buffer (max_tokens positions), allocated on the first span.
    void take(eh_step_entry* entries, uint32_t n, ehcuda::MemoryLedger* ledger, int max_tokens);
    // After the step call, whatever it did.
    void clear();
    // Whether the step has rows (then it runs eagerly: a captured graph
    // would replay the embeddings without them).
    bool any() const { return any_; }
    // In forward(), after the embeddings: the rows over their tokens of h
    // (rows of n_embd floats) and the bidirectional tokens' reach uploaded.
    void apply(const ehcuda::StepView& v, float* h, int n_embd, cudaStream_t s);
    // Whether entry i carries a bidirectional span, and each token's reach.
    bool bidirectional(int entry) const { return size_t(entry) < bidir_.size() && bidir_[size_t(entry)]; }
    // The first entry that carries a bidirectional span, or -1.
    int first_bidirectional() const;
    const int32_t* d_reach() const { return d_reach_.as<int32_t>(); }
    // Entry i's spans for the step taken (empty: none).
    const std::vector<eh_embd_span>& spans(uint32_t entry) const {
        static const std::vector<eh_embd_span> none;
        return entry < step_.size() ? step_[entry] : none;
    }

private:
    std::unordered_map<const ehcuda::CudaSeq*, std::vector<eh_embd_span>> pending_;
    std::vector<std::vector<eh_embd_span>> step_;  // per entry of the step
    std::vector<bool> bidir_;                      // per entry
    std::vector<int32_t> reach_;                   // per token of the step
    ehcuda::DeviceBuffer d_reach_;
    bool any_ = false;
};

}  // namespace llama_cuda
