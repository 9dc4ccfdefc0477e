#include "eh/service/image_encoder.hpp"

#include <fmt/format.h>

#include "eh/error.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/model_file.hpp"

namespace eh::service {

ImagePrompt image_prompt_for(const std::string& architecture) {
    // Gemma 3's processor puts "\n\n<start_of_image>", 256 image soft
    // tokens and "<end_of_image>\n\n" where its template wrote
    // <start_of_image>.
    if (architecture == "gemma3") return {"\n\n<start_of_image>", "<image_soft_token>", "<end_of_image>\n\n"};
    // Qwen2-VL / Qwen2.5-VL: the chat template writes
    // <|vision_start|><|image_pad|><|vision_end|> for an image, and the
    // processor repeats <|image_pad|> once per merged 28 x 28 tile; it
    // resizes with PIL's BICUBIC.
    if (architecture == "qwen2vl")
        return {"<|vision_start|>", "<|image_pad|>", "<|vision_end|>", image::Filter::Bicubic};
    throw Error(Code::ModelLoadFailed, fmt::format("--mmproj: images are taken for gemma3 and qwen2vl models only; this "
                                               "model's architecture is '{}'",
                                               architecture));
}

bool plugin_takes_images(const eh_plugin_api& api) {
    return loader::api_has_step(api) && api.abi_minor >= 6 && api.struct_size >= loader::api_table_size(6) &&
           api.image_encoder_load && api.image_encode && api.seq_embd_spans;
}

void check_encoder_info(eh_image_encoder_info& i, uint32_t abi_minor, bool has_sized_call, const std::string& architecture,
                        const std::string& mmproj_path) {
    if (abi_minor < 8) {  // not written by a 1.7 plugin; span flags it could not mean
        i.tile = i.min_tokens = i.max_tokens = 0;
        i.span_flags &= EH_SPAN_BIDIRECTIONAL;
    }
    if (i.tile && !has_sized_call)
        throw Error(Code::ModelLoadFailed, fmt::format("--mmproj {}: the plugin's encoder takes each image at its own "
                                                       "size but it has no image_encode_sized (ABI 1.8)",
                                                       mmproj_path));
    if ((i.span_flags & EH_SPAN_GRID) && !i.tile)
        throw Error(Code::ModelLoadFailed, fmt::format("--mmproj {}: the plugin puts images on a grid (EH_SPAN_GRID) "
                                                       "but reports no tile size",
                                                       mmproj_path));
    if (i.tile && (i.tile > 1024 || i.min_tokens == 0 || i.max_tokens < i.min_tokens || i.max_tokens > (1u << 20)))
        throw Error(Code::ModelLoadFailed, fmt::format("--mmproj {}: the plugin reported tiles of {} pixels, {}..{} per "
                                                       "image",
                                                       mmproj_path, i.tile, i.min_tokens, i.max_tokens));
    // Each text model reads the images of its own tower: Qwen2.5-VL's at their
    // own size on a grid, Gemma 3's at one size.
    if (architecture == "qwen2vl" && !(i.tile && (i.span_flags & EH_SPAN_GRID)))
        throw Error(Code::ModelLoadFailed, fmt::format("--mmproj {}: a qwen2vl model needs a Qwen2-VL / Qwen2.5-VL "
                                                       "projector (images at their own size, on a grid); this one "
                                                       "takes {}x{} pixels",
                                                       mmproj_path, i.image_width, i.image_height));
    if (architecture != "qwen2vl" && i.tile)
        throw Error(Code::ModelLoadFailed, fmt::format("--mmproj {}: a Qwen2-VL / Qwen2.5-VL projector (tiles of {} "
                                                       "pixels) cannot serve a {} model",
                                                       mmproj_path, i.tile, architecture));
    if (!i.image_width || !i.image_height || !i.n_tokens || !i.n_embd || i.image_width > 8192 || i.image_height > 8192)
        throw Error(Code::ModelLoadFailed, fmt::format("--mmproj {}: the plugin reported an encoder of {}x{} pixels, {} "
                                                       "tokens of {} floats",
                                                       mmproj_path, i.image_width, i.image_height, i.n_tokens, i.n_embd));
}

std::shared_ptr<ImageEncoder> ImageEncoder::load(std::shared_ptr<EngineModel> model, const std::string& mmproj_path,
                                                 const std::string& architecture) {
    const eh_plugin_api& api = model->api();
    const char* name = api.info && api.info() && api.info()->name ? api.info()->name : "?";
    if (!plugin_takes_images(api))
        throw Error(Code::NoPlugin, fmt::format("--mmproj: the engine plugin '{}' takes no images (it has no ABI 1.6 "
                                                   "image_encoder_load); serve images with the cpu-reference or llama-cuda plugin",
                                                   name));
    auto enc = std::shared_ptr<ImageEncoder>(new ImageEncoder());
    enc->prompt_ = image_prompt_for(architecture);
    std::shared_ptr<model::ModelFile> file = model::ModelFile::open(mmproj_path);
    enc->info_.struct_size = sizeof(enc->info_);
    const eh_status st = api.image_encoder_load(model->raw(), &file->view(), &enc->info_);
    if (st != EH_OK)
        throw Error(Code::ModelLoadFailed,
                    fmt::format("--mmproj {}: {}", mmproj_path, api.model_last_error(model->raw())));
    check_encoder_info(enc->info_, api.abi_minor, loader::api_has_sized_images(api), architecture, mmproj_path);
    model->keep_alive(std::move(file));  // the plugin may point into it until model_release
    enc->model_ = std::move(model);
    enc->path_ = mmproj_path;
    return enc;
}

image::TileSize ImageEncoder::size_for(uint32_t width, uint32_t height) const {
    if (!sized()) return {info_.image_width, info_.image_height};
    return image::fit_to_tiles(width, height, info_.tile, info_.min_tokens, info_.max_tokens);
}

uint32_t ImageEncoder::tokens_for(const image::TileSize& s) const {
    return sized() ? (s.width / info_.tile) * (s.height / info_.tile) : info_.n_tokens;
}

std::vector<float> ImageEncoder::encode(const std::vector<float>& pixels, uint32_t width, uint32_t height) const {
    if (pixels.size() != 3ull * width * height || (!sized() && (width != info_.image_width || height != info_.image_height)))
        throw Error(Code::Internal, "image_encode: the pixels are not the encoder's size");
    std::vector<float> rows(size_t(tokens_for({width, height})) * info_.n_embd);
    const eh_plugin_api& api = model_->api();
    const eh_status st = sized() ? api.image_encode_sized(model_->raw(), pixels.data(), width, height, rows.data())
                                 : api.image_encode(model_->raw(), pixels.data(), rows.data());
    if (st != EH_OK)
        throw Error(Code::Internal, fmt::format("image_encode: {}", api.model_last_error(model_->raw())));
    return rows;
}

}  // namespace eh::service
