// Gemma 3's image encoder from llama.cpp's multimodal projector GGUF
// ("mmproj", clip.projector_type "gemma3"): a SigLIP vision transformer
// (patch embedding, learned position embeddings, pre-norm blocks of
// full attention and a GeLU MLP, a final layer norm), average pooling of
// the patch grid by clip.vision.projector.scale_factor (4: 64x64 patches
// become 256 tokens) and the projector (an RMS norm, then a linear map to the
// text model's width). Written for clarity, like the rest of this engine.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "mmproj.hpp"
#include "weights.hpp"

namespace cpuref {

class ThreadPool;

// What the plugin's image calls drive: an encoder loaded from an mmproj view.
class ImageEncoder {
public:
    virtual ~ImageEncoder() = default;
    const eh_image_encoder_info& info() const { return info_; }
    // pixels: 3 planes of height x width floats, normalised (the info's
    // fixed size, or with a tile any multiple of it); out: one row of
    // text_n_embd floats per token. Throws ehp::Error(EH_INVALID_ARGUMENT)
    // for a size it does not take.
    virtual void encode(const float* pixels, uint32_t width, uint32_t height, float* out) const = 0;

protected:
    eh_image_encoder_info info_{};
};

// The encoder clip.projector_type names (gemma3, qwen2.5vl_merger); throws
// ehp::Error(EH_UNSUPPORTED) for another type, EH_MODEL_LOAD_FAILED naming
// the key or tensor for a file that does not fit. `text_n_embd`: the text
// model's width, which the projection must produce. The view must outlive
// the encoder.
std::unique_ptr<ImageEncoder> load_image_encoder(const eh_model_view* view, uint32_t text_n_embd, ThreadPool& pool);

class VisionEncoder : public ImageEncoder {
public:
    VisionEncoder(const eh_model_view* view, uint32_t text_n_embd, ThreadPool& pool);
    void encode(const float* pixels, uint32_t width, uint32_t height, float* out) const override;

private:
    struct Block {
        std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
        mmproj::Attention attn;
        mmproj::Linear up, down;
    };
    ThreadPool& pool_;
    uint32_t size_ = 0, patch_ = 0, grid_ = 0, merge_ = 0;
    uint32_t width_ = 0, ff_ = 0, n_head_ = 0;
    float eps_ = 1e-6f;
    std::vector<float> patch_w_;   // [width][3 * patch * patch]: channel, row, column
    std::vector<float> patch_b_;   // [width]
    std::vector<float> pos_;       // [grid * grid][width]
    std::vector<Block> blocks_;
    std::vector<float> post_w_, post_b_;
    std::vector<float> soft_norm_; // the stored weight, 1 + Gemma's (the converter adds the 1)
    std::vector<float> proj_;      // [text_n_embd][width]: the projection, transposed to rows
    Matrix proj_m_;
};

}  // namespace cpuref
