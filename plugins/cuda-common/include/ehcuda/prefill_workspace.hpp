// Scratch for the cuBLAS prefill path (issues 7 and 8): a cuBLAS handle bound
// to the session's stream, one FP16 "slab" that quantized weights are
// dequantized into a bounded number of rows at a time, an FP16 copy of the
// activations, and (for MoE models) the buffers that group routed tokens by
// expert. Every byte comes from DeviceBuffers on the session's ledger, so an
// allocation failure is VRAM_OOM and device_bytes_used stays truthful.
//
// The workspace keeps no FP16 copy of a whole weight tensor: the slab is
// reused by every matrix of every call (slab_bytes, 32 MiB by default, is the
// bound). A model may keep such copies itself (weight_mirror.hpp); the
// workspace then points at them and the GEMM skips the slab.
// Decode never uses the workspace (it runs the GEMV path in a CUDA graph).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ehcuda/device_memory.hpp"
#include "ehcuda/prefill_slab.hpp"

struct cublasContext;  // cublasHandle_t is cublasContext*

namespace ehcuda {

class WeightMirror;

struct PrefillShape {
    int max_tokens = 0;  // most tokens per matmul call (the session's batch)
    int max_cols = 0;    // widest matmul input (K) the dense path must take
    // Slab for MoE experts (whole gate|up of a gpt-oss expert, 33 MB FP16,
    // in one piece: one GEMM per expert instead of three).
    size_t slab_bytes = size_t(32) << 20;
    // Rows per slab for dense matmuls (prefill_slab.hpp says why 12 MiB;
    // gpt-oss experts were slower at 12 MiB, 4,824 vs 6,657 tok/s, hence two
    // sizes). Models without experts allocate only this much.
    // KernelPlan::prefill_slab_mb and prefill_dense_slab_mb override them:
    // llama-cuda sets them at load for models without mirrors
    // (whole_gemm_slab_mb).
    size_t dense_slab_bytes = kDefaultDenseSlabBytes;
    // MoE prefill (all 0 when the model has no experts).
    int moe_experts = 0;  // expert_count
    int moe_k = 0;        // experts per token
    int moe_embd = 0;     // expert input width (n_embd) = down's output rows
    int moe_ff = 0;       // expert hidden width (gate/up rows, down's input)
};

class PrefillWorkspace {
public:
    // Throws VRAM_OOM (nothing left allocated) or EH_INTERNAL when cuBLAS
    // cannot start. The handle issues all its work on `stream`.
    PrefillWorkspace(const PrefillShape& shape, cudaStream_t stream, MemoryLedger* ledger);
    ~PrefillWorkspace();
    PrefillWorkspace(const PrefillWorkspace&) = delete;
    PrefillWorkspace& operator=(const PrefillWorkspace&) = delete;

    // Calls with fewer tokens use the old kernels. 16 by default (below it
    // the WMMA kernel's single pass over the quantized weights wins; the
    // plan's prefill_min_tokens, 0 turns the path off). A
    // batched step with FP16 mirrors lowers it to as few as 2 tokens: matmul()
    // then takes cuBLAS instead of the multi-token GEMV.
    int min_tokens() const { return min_tokens_; }
    void set_min_tokens(int n) { min_tokens_ = n; }
    bool enabled_for(int ntok) const { return min_tokens_ > 0 && ntok >= min_tokens_ && ntok >= 2; }

    // The model's FP16 weight copies (not owned; it outlives the workspace),
    // or null: every quantized matrix goes through the slab.
    void set_mirror(const WeightMirror* m) { mirror_ = m; }
    const WeightMirror* mirror() const { return mirror_; }

    const PrefillShape& shape() const { return shape_; }
    cudaStream_t stream() const { return stream_; }
    cublasContext* cublas() const { return handle_; }
    __half* slab() const { return slab_.as<__half>(); }
    size_t slab_halves() const { return slab_.size() / sizeof(__half); }
    // The part of the slab a dense matmul uses per GEMM (see dense_slab_bytes).
    size_t dense_slab_halves() const;
    __half* act() const { return act_.as<__half>(); }
    size_t act_halves() const { return act_.size() / sizeof(__half); }
    // MoE pieces (null without experts): FP32 expert outputs, the pair order
    // (sorted -> pair, pair -> sorted), per-expert offsets [n_expert + 1] on
    // the device and their pinned host mirror.
    float* moe_out() const { return moe_out_.as<float>(); }
    size_t moe_out_floats() const { return moe_out_.size() / sizeof(float); }
    int32_t* moe_sorted() const { return moe_sorted_.as<int32_t>(); }
    int32_t* moe_pos() const { return moe_pos_.as<int32_t>(); }
    int32_t* moe_offsets() const { return moe_offsets_.as<int32_t>(); }
    int32_t* moe_offsets_host() const { return host_offsets_; }
    int moe_pairs() const { return shape_.moe_experts > 0 ? shape_.max_tokens * shape_.moe_k : 0; }

    size_t device_bytes() const;
    // Calls that took the cuBLAS path (dense matmuls and MoE layers): lets
    // tests and measurements see which path ran.
    uint64_t uses() const { return uses_; }
    void note_use() { ++uses_; }

private:
    PrefillShape shape_;
    cudaStream_t stream_;
    cublasContext* handle_ = nullptr;
    int min_tokens_ = 16;
    uint64_t uses_ = 0;
    const WeightMirror* mirror_ = nullptr;
    DeviceBuffer cublas_ws_, slab_, act_;
    DeviceBuffer moe_out_, moe_sorted_, moe_pos_, moe_offsets_;
    int32_t* host_offsets_ = nullptr;
};

}  // namespace ehcuda
