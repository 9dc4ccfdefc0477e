// Qwen2.5-VL's image encoder on the GPU, from llama.cpp's multimodal
// projector GGUF (clip.projector_type "qwen2.5vl_merger"): what
// cpu-reference's vision_qwen.cpp computes, step for step, for an image of
// its own size in 28 x 28 tiles (ABI 1.8's image_encode_sized). The patch
// embedding (the Conv3d's two temporal kernels added) as a GEMM, then each
// block: RMSNorm, Q/K/V with biases, the 2-D RoPE (a head's first quarter of
// frequencies by the patch's row, the second by its column), attention
// within 112-pixel windows (every n_wa_pattern-th block over the whole
// image), the output projection, RMSNorm and a SwiGLU MLP with biases; then
// the merger (RMSNorm per patch, each 2 x 2 square's four patches as one
// row, a GELU(erf) MLP to the text model's width). The tower runs its
// patches in window order (the order transformers' get_window_index gives,
// squares kept whole), so each window is a run of consecutive rows; the
// rows come back in tile order. GEMMs on cuBLAS with FP32 accumulation (an
// F16 matrix read as F16 with its input rounded to F16, as llama.cpp does;
// another type as F32); with F16 Q/K/V and heads of at most 80 dims (the
// 7B's 80) the attention is the flash pass (vision_attention.cu) over each
// window's rows, otherwise cuBLAS GEMMs of the scores and a softmax within
// the query's window.
#pragma once

#include <cstdint>
#include <memory>

#include <engine_host/plugin_abi.h>

#include <ehcuda/device_memory.hpp>

namespace ehcuda {

class QwenVlVision {
public:
    // The tiles an image may take: transformers' smallest (56 x 56 pixels)
    // and cpu-reference's cap (1,024 tiles, about 800,000 pixels), so both
    // engines see an image at the same size; the scratch for the largest is
    // allocated at load.
    static constexpr uint32_t kMinTokens = 4, kMaxTokens = 1024;

    // Reads and uploads everything (device memory counted in `ledger`, on
    // the current device). Throws ehp::Error: EH_MODEL_LOAD_FAILED naming
    // the key or tensor of a file that does not fit (cpu-reference's
    // checks), EH_UNSUPPORTED for another projector type, EH_VRAM_OOM.
    QwenVlVision(const eh_model_view* view, uint32_t text_n_embd, MemoryLedger* ledger);
    ~QwenVlVision();
    QwenVlVision(const QwenVlVision&) = delete;
    QwenVlVision& operator=(const QwenVlVision&) = delete;

    const eh_image_encoder_info& info() const;
    // One image of width x height pixels (multiples of info().tile, of
    // kMinTokens..kMaxTokens tiles; EH_INVALID_ARGUMENT naming
    // image_encode_sized otherwise): `pixels` three planes (R, G, B) of
    // height rows of width floats, normalised; `out` one row of n_embd
    // floats per tile, rows of tiles top to bottom. Both host memory;
    // returns when `out` is written.
    void encode(const float* pixels, uint32_t width, uint32_t height, float* out);
    // The last encode's device time (ms): the bench's figure.
    float last_ms() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ehcuda
