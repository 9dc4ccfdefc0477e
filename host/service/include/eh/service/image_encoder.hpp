// Images in (ABI 1.6): a plugin's image encoder, loaded from llama.cpp's
// multimodal projector GGUF ("mmproj") beside the model, and how the
// model's prompts hold an image. The service expands each image of a chat
// into the model's image tokens (ImagePrompt), the scheduler encodes it
// into rows and hands them to the step (seq_embd_spans) in place of those
// tokens' embeddings.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "eh/image/image.hpp"
#include "eh/loader/engine.hpp"

namespace eh::service {

// How an image sits in the model's prompt: `before`, `token` once per row
// the encoder gives it, `after` (control-token text, tokenized with
// parse_special); and the resampling filter its processor resizes with.
struct ImagePrompt {
    std::string before, token, after;
    image::Filter filter = image::Filter::Bilinear;
};

// The prompt form for a text model's architecture; Error(ModelLoadFailed) for
// one whose image prompt is not known here.
ImagePrompt image_prompt_for(const std::string& architecture);

// The checks ImageEncoder::load makes of what a plugin's image_encoder_load
// reported (`i` as the plugin filled it; members a plugin of `abi_minor`
// could not write are cleared first): Error(ModelLoadFailed) naming
// `mmproj_path` for sizes out of range, a grid (EH_SPAN_GRID) without a
// tile, tiles without image_encode_sized, or a projector of another kind
// than `architecture` reads.
void check_encoder_info(eh_image_encoder_info& i, uint32_t abi_minor, bool has_sized_call,
                        const std::string& architecture, const std::string& mmproj_path);

class ImageEncoder {
public:
    // Opens `mmproj_path` and has the model's plugin load it (before
    // kv_init). Error(NoPlugin) naming the plugin when it takes no
    // image (no ABI 1.6 image calls), the plugin's own error otherwise. The
    // file stays mapped as long as the model lives.
    static std::shared_ptr<ImageEncoder> load(std::shared_ptr<EngineModel> model, const std::string& mmproj_path,
                                              const std::string& architecture);

    const eh_image_encoder_info& info() const { return info_; }
    const ImagePrompt& prompt() const { return prompt_; }
    const std::string& path() const { return path_; }
    // Whether each image is read at its own size (ABI 1.8: info().tile != 0,
    // Qwen2.5-VL), and that size for an image of width x height pixels
    // (image::fit_to_tiles; ImageError past its limits); else every image
    // is image_width x image_height.
    bool sized() const { return info_.tile != 0; }
    image::TileSize size_for(uint32_t width, uint32_t height) const;
    // The rows an image of that size becomes.
    uint32_t tokens_for(const image::TileSize& s) const;
    // One image's rows (tokens_for x n_embd) from its normalised planes
    // (3 x height x width, the size size_for gave). Throws eh::Error.
    std::vector<float> encode(const std::vector<float>& pixels, uint32_t width, uint32_t height) const;

private:
    std::shared_ptr<EngineModel> model_;
    eh_image_encoder_info info_{};
    ImagePrompt prompt_;
    std::string path_;
};

// Whether a plugin's table has the 1.6 image calls.
bool plugin_takes_images(const eh_plugin_api& api);

}  // namespace eh::service
