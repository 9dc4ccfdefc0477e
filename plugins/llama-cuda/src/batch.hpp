// ABI 1.2's batched step for the llama family: the shared CUDA batch engine
// (ehcuda::BatchBase: paged KV pool, sequences, sampling) with this model's
// forward pass over a step's tokens from many sequences at once (the matmul
// policy by token count is in batch.cpp); attention reads each token's own
// sequence through the block tables.
#pragma once

#include <ehcuda/batch.hpp>
#include <ehcuda/device_memory.hpp>

#include "model.hpp"

namespace llama_cuda {

class Batch : public ehcuda::BatchBase {
public:
    // Throws VRAM_OOM / INSUFFICIENT_VRAM (nothing left allocated).
    Batch(Model& model, const eh_kv_params& params);

private:
    void forward(const ehcuda::StepView& v) override;
    // A decode-only step's attention: RoPE, the K/V store and split-K
    // attention in one launch per layer (rope_attention_decode, paged).
    void decode_attention(const ehcuda::StepView& v, int layer, bool chunks);
    // Otherwise: RoPE + store for every token, then the paged attention.
    void prefill_attention(const ehcuda::StepView& v, int layer);
    int decode_splits(int rows) const;

    Model& m_;
    const Config& c_;
    ehcuda::DeviceBuffer h_, xn_, qkv_, attn_, ff_, last_;
    ehcuda::DeviceBuffer attn_scratch_, attn_counters_, attn_chunks_;
    bool fused_attn_ = false;
};

}  // namespace llama_cuda
