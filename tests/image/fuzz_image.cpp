// libFuzzer target for host/image: the first byte picks the path. Even:
// the rest is an image file, decoded under small limits and resized both
// ways, and to its tile size with the bicubic filter. Odd: the rest is a data URL, whose bytes are then decoded too.
// Any ImageError is a clean refusal; anything else (a crash, a leak, UB) is
// a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "eh/image/image.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    eh::image::Limits limits;
    limits.max_bytes = 1 << 20;
    limits.max_side = 1024;
    limits.max_pixels = 1 << 18;
    const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    try {
        std::string bytes = (data[0] & 1) ? eh::image::data_url_bytes(rest, limits) : std::string(rest);
        const eh::image::Rgb8 img = eh::image::decode(bytes, limits);
        const float mean[3] = {0.5f, 0.5f, 0.5f}, sd[3] = {0.5f, 0.5f, 0.5f};
        (void)eh::image::encoder_input(img, 7, 5, mean, sd);
        (void)eh::image::encoder_input(img, img.width + 3, img.height > 1 ? img.height / 2 : 1, mean, sd);
        // Qwen2.5-VL's path: its size in 28-pixel tiles (ImageError past 200:1), resampled bicubic.
        const eh::image::TileSize ts = eh::image::fit_to_tiles(img.width, img.height, 28, 4, 64);
        (void)eh::image::encoder_input(img, ts.width, ts.height, mean, sd, eh::image::Filter::Bicubic);
        (void)eh::image::digest(img);
    } catch (const eh::image::ImageError&) {
    }
    return 0;
}
