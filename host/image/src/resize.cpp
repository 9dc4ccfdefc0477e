#include <algorithm>
#include <cmath>
#include <string>

#include "eh/image/image.hpp"

namespace eh::image {
namespace {

// PIL's fixed-point resampling (ImagingResample): each output pixel is a
// normalised filter-weighted average (triangle, or cubic) over the input
// pixels within support * max(scale, 1) of its centre, with integer coefficients of 22
// fraction bits, rounded and clipped to 8 bits after the pass.
constexpr int kBits = 22;

struct Taps {
    std::vector<int> first, count;
    std::vector<int32_t> k;  // count[i] coefficients of output i, kmax apart
    int kmax = 0;
};

double triangle(double x) { return x < 1.0 ? 1.0 - x : 0.0; }

// PIL's bicubic_filter (a = -0.5), of |x|.
double cubic(double x) {
    constexpr double a = -0.5;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

Taps taps(int in, int out, Filter filter) {
    const double base = filter == Filter::Bicubic ? 2.0 : 1.0;
    const double scale = double(in) / double(out), fs = std::max(scale, 1.0), support = base * fs;
    Taps t;
    t.kmax = int(std::ceil(support)) * 2 + 1;
    t.first.resize(size_t(out));
    t.count.resize(size_t(out));
    t.k.assign(size_t(out) * size_t(t.kmax), 0);
    std::vector<double> w(size_t(t.kmax));
    for (int i = 0; i < out; ++i) {
        const double centre = (i + 0.5) * scale;
        const int lo = std::max(int(centre - support + 0.5), 0);
        const int hi = std::min(int(centre + support + 0.5), in);
        const int n = std::min(hi - lo, t.kmax);
        double sum = 0;
        for (int x = 0; x < n; ++x) {
            const double d = std::abs((x + lo - centre + 0.5) / fs);
            sum += (w[size_t(x)] = filter == Filter::Bicubic ? cubic(d) : triangle(d));
        }
        for (int x = 0; x < n; ++x) {
            const double v = sum != 0.0 ? w[size_t(x)] / sum : 0.0;
            t.k[size_t(i) * size_t(t.kmax) + size_t(x)] = int32_t(v < 0 ? v * (1 << kBits) - 0.5 : v * (1 << kBits) + 0.5);
        }
        t.first[size_t(i)] = lo;
        t.count[size_t(i)] = n;
    }
    return t;
}

uint8_t clip8(int64_t v) { return uint8_t(std::clamp<int64_t>(v >> kBits, 0, 255)); }

// One pass along x (horizontal) or y over an RGB image.
Rgb8 pass(const Rgb8& src, uint32_t out_n, bool horizontal, Filter filter) {
    const int in = int(horizontal ? src.width : src.height);
    const Taps t = taps(in, int(out_n), filter);
    Rgb8 dst;
    dst.width = horizontal ? out_n : src.width;
    dst.height = horizontal ? src.height : out_n;
    dst.rgb.resize(size_t(dst.width) * dst.height * 3);
    for (uint32_t y = 0; y < dst.height; ++y)
        for (uint32_t x = 0; x < dst.width; ++x) {
            const uint32_t i = horizontal ? x : y;
            const int32_t* k = &t.k[size_t(i) * size_t(t.kmax)];
            for (int c = 0; c < 3; ++c) {
                int64_t acc = int64_t(1) << (kBits - 1);
                for (int j = 0; j < t.count[i]; ++j) {
                    const uint32_t sx = horizontal ? uint32_t(t.first[i] + j) : x, sy = horizontal ? y : uint32_t(t.first[i] + j);
                    acc += int64_t(src.rgb[(size_t(sy) * src.width + sx) * 3 + size_t(c)]) * k[j];
                }
                dst.rgb[(size_t(y) * dst.width + x) * 3 + size_t(c)] = clip8(acc);
            }
        }
    return dst;
}

}  // namespace

std::vector<float> encoder_input(const Rgb8& img, uint32_t width, uint32_t height, const float mean[3],
                                 const float std[3], Filter filter) {
    Rgb8 tmp;
    const Rgb8* cur = &img;
    if (cur->width != width) {
        tmp = pass(*cur, width, true, filter);
        cur = &tmp;
    }
    Rgb8 tmp2;
    if (cur->height != height) {
        tmp2 = pass(*cur, height, false, filter);
        cur = &tmp2;
    }
    const size_t n = size_t(width) * height;
    std::vector<float> out(3 * n);
    for (size_t i = 0; i < n; ++i)
        for (size_t c = 0; c < 3; ++c) out[c * n + i] = (float(cur->rgb[i * 3 + c]) / 255.0f - mean[c]) / std[c];
    return out;
}

TileSize fit_to_tiles(uint32_t width, uint32_t height, uint32_t tile, uint32_t min_tokens, uint32_t max_tokens) {
    if (width == 0 || height == 0 || tile == 0) throw ImageError("an image of no pixels");
    const double w = width, h = height, f = tile;
    if (std::max(w, h) / std::min(w, h) > kMaxAspect)
        throw ImageError("image of " + std::to_string(width) + "x" + std::to_string(height) +
                         " pixels: its long side is more than " + std::to_string(kMaxAspect) + " times its short side");
    const double min_px = double(min_tokens) * f * f, max_px = double(max_tokens) * f * f;
    double hb = std::nearbyint(h / f) * f, wb = std::nearbyint(w / f) * f;  // halves to even, as Python's round
    if (hb * wb > max_px) {
        const double beta = std::sqrt(h * w / max_px);
        hb = std::max(f, std::floor(h / beta / f) * f);
        wb = std::max(f, std::floor(w / beta / f) * f);
    } else if (hb * wb < min_px) {
        const double beta = std::sqrt(min_px / (h * w));
        hb = std::ceil(h * beta / f) * f;
        wb = std::ceil(w * beta / f) * f;
    }
    const double tokens = (hb / f) * (wb / f);
    if (tokens > max_tokens || tokens < min_tokens)
        throw ImageError("image of " + std::to_string(width) + "x" + std::to_string(height) + " pixels: it fits no size of " +
                         std::to_string(min_tokens) + ".." + std::to_string(max_tokens) + " tiles of " +
                         std::to_string(tile) + " pixels");
    return {uint32_t(wb), uint32_t(hb)};
}

}  // namespace eh::image
