// Gemma 3's image encoder on the GPU, from llama.cpp's multimodal projector
// GGUF ("mmproj", clip.projector_type "gemma3"): the SigLIP tower (patch
// embedding as a GEMM, learned position embeddings, pre-LayerNorm blocks of
// full attention over every patch and a GeLU(tanh) MLP, a final LayerNorm),
// the average pooling of the patch grid by clip.vision.projector.
// scale_factor (4 unless the file says otherwise) and the projector (an RMS
// norm with the stored 1 + w, then a linear map to the text model's width):
// what cpu-reference's vision.cpp computes, step for step. GEMMs on cuBLAS
// with FP32 accumulation; a matrix stored F16 is read as F16 (its inputs
// rounded to F16 for the GEMM, as llama.cpp does), F32 as F32, any other
// type dequantized to F32 at load. The attention over every patch: with
// F16 Q/K/V weights (heads of at most 80 dims, SigLIP's 72) one flash pass
// on the tensor cores (F16 inputs, FP32 softmax and accumulation);
// otherwise cuBLAS GEMMs of the scores, a softmax kernel and GEMMs of the
// values.
#pragma once

#include <cstdint>
#include <memory>

#include <engine_host/plugin_abi.h>

#include <ehcuda/device_memory.hpp>

namespace ehcuda {

class Gemma3Vision {
public:
    // Reads and uploads everything (device memory counted in `ledger`, on
    // the current device). Throws ehp::Error: EH_MODEL_LOAD_FAILED naming
    // the key or tensor of a file that does not fit (cpu-reference's
    // messages), EH_UNSUPPORTED for another projector type,
    // EH_VRAM_OOM when the device memory runs out.
    Gemma3Vision(const eh_model_view* view, uint32_t text_n_embd, MemoryLedger* ledger);
    ~Gemma3Vision();
    Gemma3Vision(const Gemma3Vision&) = delete;
    Gemma3Vision& operator=(const Gemma3Vision&) = delete;

    const eh_image_encoder_info& info() const;
    // One image: `pixels` three planes (R, G, B) of info().image_height rows
    // of image_width floats, normalised; `out` n_tokens * n_embd floats.
    // Both host memory; returns when `out` is written.
    void encode(const float* pixels, float* out);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ehcuda
