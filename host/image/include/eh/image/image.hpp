// Images in a request: a data: URL's bytes, decoded (PNG through libpng,
// JPEG through libjpeg-turbo) to 8-bit RGB, and resized and normalised into
// what a vision encoder takes. The server never downloads: an http(s) URL
// is refused. Every limit a request can hit is a number here, and every
// refusal an ImageError whose message says which and why.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace eh::image {

class ImageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct Limits {
    size_t max_bytes = 20u << 20;             // one image's encoded bytes, after base64 decoding
    uint32_t max_side = 8192;                 // pixels, width or height
    uint64_t max_pixels = 33'554'432;         // width * height (8192 x 4096)
    size_t max_images = 8;                    // per request
};

struct Rgb8 {
    uint32_t width = 0, height = 0;
    std::vector<uint8_t> rgb;                 // rows top to bottom, R G B per pixel
};

// The bytes a "data:image/...;base64,..." URL carries. ImageError for an
// http(s) URL (never fetched), any other scheme, a media type that is not
// image/*, a URL that is not base64, invalid base64, or more than
// limits.max_bytes.
std::string data_url_bytes(std::string_view url, const Limits& limits);

// PNG or JPEG (told by their signatures) to RGB: alpha is dropped,
// grey and palette images are expanded. ImageError for another format, a
// damaged file, or a size past max_side / max_pixels (checked from the
// header, before decoding).
Rgb8 decode(std::string_view bytes, const Limits& limits);

// PIL's resampling filters, as transformers' image processors name them:
// BILINEAR (a triangle, Gemma 3) and BICUBIC (Keys' cubic with a = -0.5 over
// two pixels each side, Qwen2-VL / Qwen2.5-VL).
enum class Filter { Bilinear, Bicubic };

// The image resized to width x height with PIL's `filter` (widened by the
// scale when shrinking, each pass rounded to 8 bits, as transformers' image
// processors resize; the aspect ratio is not kept, as Gemma 3's processor
// does not keep it), then as three planes (R, G, B) of (value / 255 - mean)
// / std. An image already of that size is not resampled.
std::vector<float> encoder_input(const Rgb8& img, uint32_t width, uint32_t height, const float mean[3],
                                 const float std[3], Filter filter = Filter::Bilinear);

// The size an encoder that takes any multiple of `tile` pixels reads an
// image of width x height at (transformers' Qwen2-VL smart_resize): each
// side rounded to the nearest multiple of the tile (halves to even); if that
// holds more than max_tokens tiles both sides shrink by one factor (rounded
// down to the tile, at least one tile), if fewer than min_tokens both grow
// (rounded up). The aspect ratio is kept to within a tile. ImageError for
// an image whose long side is more than kMaxAspect times its short side
// (transformers refuses those too), or that would still need more than
// max_tokens tiles.
inline constexpr uint32_t kMaxAspect = 200;
struct TileSize {
    uint32_t width = 0, height = 0;  // pixels, multiples of the tile
};
TileSize fit_to_tiles(uint32_t width, uint32_t height, uint32_t tile, uint32_t min_tokens, uint32_t max_tokens);

// Lower-case hex SHA-256 of the decoded image (its size and pixels): two
// requests share a cached prefix through an image only when this matches.
std::string digest(const Rgb8& img);

}  // namespace eh::image
