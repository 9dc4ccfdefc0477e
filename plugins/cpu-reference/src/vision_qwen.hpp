// Qwen2.5-VL's vision tower from llama.cpp's mmproj GGUF (clip.projector_type
// "qwen2.5vl_merger"), for images of their own size: the picture cut into
// patch x patch squares (14), each embedded by the two temporal frames of
// the patch convolution (a still image is its own second frame, so the two
// kernels add), 2-D RoPE in every attention layer (the first quarter of a
// head's frequencies by the patch's row, the second by its column), window
// attention (patches see only their window of clip.vision.window_size
// pixels, 112 by default) on every layer but each n_wa_pattern-th, which
// attends over the whole image, RMSNorm and a SwiGLU MLP with biases, then
// the merger: RMSNorm per patch, each 2 x 2 square of patches concatenated
// and mapped by a GELU MLP to the text model's width. One row per 28 x 28
// tile, rows of tiles top to bottom. Written for clarity.
#pragma once

#include <cstdint>
#include <vector>

#include "vision.hpp"

namespace cpuref {

class QwenVlEncoder : public ImageEncoder {
public:
    // The tokens an image may take here (min_tokens / max_tokens of the
    // info): transformers' smallest default (56 x 56 pixels) and a cap that
    // keeps the plain CPU pass to seconds on the toy tower and minutes on
    // the real one (about 800,000 pixels).
    static constexpr uint32_t kMinTokens = 4, kMaxTokens = 1024;

    QwenVlEncoder(const eh_model_view* view, uint32_t text_n_embd, ThreadPool& pool);
    void encode(const float* pixels, uint32_t width, uint32_t height, float* out) const override;

private:
    struct Block {
        std::vector<float> ln1, ln2;
        mmproj::Attention attn;
        mmproj::Linear gate, up, down;  // SwiGLU
    };
    ThreadPool& pool_;
    uint32_t patch_ = 0, merge_ = 2, window_ = 0;  // window_: patches per window side
    uint32_t width_ = 0, ff_ = 0, n_head_ = 0, wa_pattern_ = 0;
    float eps_ = 1e-6f;
    std::vector<float> patch_w_;  // [width][3 * patch * patch]: the two frames' kernels added
    std::vector<Block> blocks_;
    std::vector<float> post_ln_;  // the merger's RMSNorm (ln_q)
    Matrix mm0_, mm2_;
    std::vector<float> mm0_b_, mm2_b_;
};

}  // namespace cpuref
