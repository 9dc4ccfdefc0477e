// LoRA adapters (ABI 1.6) on llama-cuda: which of the model's matrices an
// adapter's pairs bind to (the "sites" of ehcuda::LoraSet), their upload,
// and the step's updates after each adapted matmul (LoraStep). Not with
// tensor parallelism (adapter_load refuses it by name).
#pragma once

#include <initializer_list>
#include <memory>

#include <ehcuda/batch.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/lora.hpp>

#include <engine_host/plugin_abi.h>

#include "model.hpp"

namespace llama_cuda {

// A layer's sites, in the order of its matmuls. kQ is the fused attn_qkv
// where the model has one, kGate the fused ffn_up (gate|up) of phi3.
enum LoraKind { kLoraQ = 0, kLoraK, kLoraV, kLoraOut, kLoraGate, kLoraUp, kLoraDown, kLoraPerLayer };
inline int lora_site(int layer, int kind) { return layer * kLoraPerLayer + kind; }
inline int lora_head_site(const Config& c) { return c.n_layer * kLoraPerLayer; }
inline int lora_sites(const Config& c) { return lora_head_site(c) + 1; }

// adapter_load: checks the view against the model (ehp::read_lora_adapter),
// binds every pair to its site and uploads it as FP16 (A as stored, B
// transposed; a llama served from a Hugging Face directory gets its q/k
// pairs' B rows put back in that order). Throws ehp::Error.
std::unique_ptr<ehcuda::LoraAdapter> load_adapter(Model& m, const eh_adapter_params& p);

// A step's updates: the sites given (those of one matmul input: q, k, v;
// gate, up; or one), whichever the model has, into the matmul's output
// rows; the table says which rows' adapters have a pair there.
class LoraStep {
public:
    // Rows go in launches of at most kRows; the scratch for them (u) is
    // allocated at the first step with an adapter, which runs eagerly
    // (never inside a graph capture), and never moves after.
    static constexpr int kRows = 1024;
    // Entries of at least this many tokens with an adapter (prefill chunks)
    // take cuBLAS (ehcuda::lora_apply_gemm), with `pw`'s handle and its FP16
    // activation buffer as scratch; the other rows the per-row kernels.
    static constexpr int kGemmMinRows = 32;
    void apply(const Model& m, std::initializer_list<int> sites, const int32_t* token_slot, const int32_t* row_token,
               int nrows, const float* x, int ldx, float* y, int ldy, ehcuda::MemoryLedger* ledger, cudaStream_t s,
               const ehcuda::StepSpan* spans = nullptr, int nspans = 0, ehcuda::PrefillWorkspace* pw = nullptr);

private:
    ehcuda::DeviceBuffer u_;
};

}  // namespace llama_cuda
