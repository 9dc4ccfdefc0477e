// ABI 1.2's batched step for the llama family: the shared CUDA batch engine
// (ehcuda::BatchBase: paged KV pool, sequences, sampling) with this model's
// forward pass over a step's tokens from many sequences at once. Every
// matmul runs once over all the step's tokens (each weight read once per
// step); attention reads each token's own sequence through the block tables.
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

    Model& m_;
    const Config& c_;
    ehcuda::DeviceBuffer h_, xn_, qkv_, attn_, ff_, last_;
};

}  // namespace llama_cuda
