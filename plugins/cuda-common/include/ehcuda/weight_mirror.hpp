// FP16 copies of a model's quantized weight matrices, made once at load.
//
// The multi-token GEMM (cuBLAS, prefill_gemm.cu) needs FP16 operands. Without
// a mirror it dequantizes each matrix a 12 MiB slab at a time on every call:
// in a 64-sequence decode step that dequantization, and the many small GEMMs
// the slabs cut each matrix into, were most of the step (Phi-3-mini, H200:
// 404 slab dequantizations and 624 split-K reductions per step). With a
// mirror the GEMM reads the matrix whole, where it lies.
//
// The price is device memory: two bytes per weight (Qwen2.5-0.5B ~1 GB,
// Phi-3-mini ~7.6 GB), taken before the KV-cache pool is sized. The plugin
// decides per model (mirror_policy) and states the decision at load; the
// single-token decode path (GEMV) never reads the mirror.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ehcuda/device_memory.hpp"
#include "ehcuda/kernels.hpp"

namespace ehcuda {

class Options;  // options.hpp

class WeightMirror {
public:
    // Bytes a mirror of w takes (0 for FP16 weights, which need none, and
    // for types the dequantization does not take).
    static size_t bytes_for(const WeightRef& w);

    // Dequantizes w into a new FP16 buffer on `ledger` (VRAM_OOM when it
    // does not fit; nothing is added then). Adding a matrix twice is a no-op.
    void add(const WeightRef& w, cudaStream_t stream, MemoryLedger* ledger);

    // The FP16 copy of w's rows ([w.rows][w.cols], leading dimension
    // w.cols), or null when w is not mirrored. w may be a run of rows
    // inside a mirrored matrix (Phi-3's gate and up halves of one tensor).
    const __half* find(const WeightRef& w) const;

    size_t bytes() const { return bytes_; }
    size_t count() const { return by_start_.size(); }

private:
    struct Entry {
        const uint8_t* end;
        size_t row_bytes;
        int cols;
        DeviceBuffer copy;
    };
    std::map<const uint8_t*, Entry> by_start_;
    size_t bytes_ = 0;
};

// Whether a model mirrors its matrices: "on", "off", or "auto" (the
// default): on when the mirror takes at most a quarter of the device memory
// free after the weights, so that the KV-cache pool keeps the rest.
enum class MirrorPolicy { Auto, On, Off };
struct MirrorDecision {
    bool on = false;
    std::string why;  // one line for the load log
};
MirrorDecision mirror_policy(MirrorPolicy policy, size_t mirror_bytes, size_t free_bytes);
// A model's load step: decides by `policy` for `mats` against the device
// memory free now, and when on adds them all to `mirror` (on `ledger`,
// synchronising `stream`). Throws VRAM_OOM when "on" does not fit.
MirrorDecision build_mirror(WeightMirror& mirror, const std::vector<WeightRef>& mats, MirrorPolicy policy,
                            cudaStream_t stream, MemoryLedger* ledger);
// "auto" | "on" | "off" from a load's options key "fp16_weights" (absent:
// auto); INVALID_ARGUMENT naming the key otherwise.
MirrorPolicy mirror_policy_option(const Options& options);

}  // namespace ehcuda
