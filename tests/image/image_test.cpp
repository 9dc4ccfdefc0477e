// host/image: data URLs (what is refused and why), PNG and JPEG decoding
// through the Debian libraries, the size limits checked from the header,
// PIL's bilinear resize and the encoder's normalisation, the digest.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <jpeglib.h>
#include <openssl/evp.h>
#include <png.h>

#include "eh/image/image.hpp"

using namespace eh::image;

namespace {

std::string png(uint32_t w, uint32_t h, uint32_t format, const std::vector<uint8_t>& px) {
    png_image im;
    std::memset(&im, 0, sizeof(im));
    im.version = PNG_IMAGE_VERSION;
    im.width = w;
    im.height = h;
    im.format = format;
    png_alloc_size_t size = 0;
    EXPECT_TRUE(png_image_write_to_memory(&im, nullptr, &size, 0, px.data(), 0, nullptr));
    std::string out(size, '\0');
    EXPECT_TRUE(png_image_write_to_memory(&im, out.data(), &size, 0, px.data(), 0, nullptr));
    out.resize(size);
    return out;
}

std::string jpeg(uint32_t w, uint32_t h, const std::vector<uint8_t>& rgb) {
    jpeg_compress_struct c;
    jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    unsigned char* buf = nullptr;
    unsigned long size = 0;
    jpeg_mem_dest(&c, &buf, &size);
    c.image_width = w;
    c.image_height = h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 100, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < h) {
        JSAMPROW row = const_cast<uint8_t*>(&rgb[size_t(c.next_scanline) * w * 3]);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    std::string out(reinterpret_cast<char*>(buf), size);
    free(buf);
    return out;
}

std::string b64(const std::string& bytes) {
    std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
    const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()));
    out.resize(size_t(n));
    return out;
}

std::string refusal(const std::string& url, const Limits& l = {}) {
    try {
        data_url_bytes(url, l);
    } catch (const ImageError& e) {
        return e.what();
    }
    return "";
}

std::string decode_refusal(const std::string& bytes, const Limits& l = {}) {
    try {
        decode(bytes, l);
    } catch (const ImageError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(ImageDataUrl, RefusesWhatItDoesNotTake) {
    EXPECT_NE(refusal("https://example.com/cat.png").find("never downloads"), std::string::npos);
    EXPECT_NE(refusal("HTTP://example.com/cat.png").find("never downloads"), std::string::npos);
    EXPECT_NE(refusal("file:///etc/passwd").find("must be a data URL"), std::string::npos);
    EXPECT_NE(refusal("data:text/plain;base64,aGk=").find("image/*"), std::string::npos);
    EXPECT_NE(refusal("data:image/png,rawdata").find("base64"), std::string::npos);
    EXPECT_NE(refusal("data:image/png;base64").find("no ','"), std::string::npos);
    EXPECT_NE(refusal("data:image/png;base64,").find("no data"), std::string::npos);
    EXPECT_NE(refusal("data:image/png;base64,aGk").find("multiple of 4"), std::string::npos);
    EXPECT_NE(refusal("data:image/png;base64,a*k=").find("invalid"), std::string::npos);
    EXPECT_NE(refusal("data:image/png;base64,a=k=").find("invalid"), std::string::npos);
    EXPECT_NE(refusal("data:image/png;base64, aGk").find("invalid"), std::string::npos);
    Limits small;
    small.max_bytes = 4;
    EXPECT_NE(refusal("data:image/png;base64," + b64("12345"), small).find("larger than 4 bytes"), std::string::npos);
    EXPECT_EQ(data_url_bytes("data:image/png;base64," + b64("1234"), small), "1234");
    EXPECT_EQ(data_url_bytes("DATA:IMAGE/JPEG;BASE64," + b64("hello"), {}), "hello");
    EXPECT_EQ(data_url_bytes("data:image/png;base64," + b64("hi"), {}), "hi");
}

TEST(ImageDecode, PngAndJpegToRgb) {
    const std::vector<uint8_t> rgb = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30, 40, 50, 60, 70, 80, 90};
    Rgb8 a = decode(png(3, 2, PNG_FORMAT_RGB, rgb), {});
    EXPECT_EQ(a.width, 3u);
    EXPECT_EQ(a.height, 2u);
    EXPECT_EQ(a.rgb, rgb);
    // Alpha composited onto white; grey expanded.
    Rgb8 b = decode(png(2, 1, PNG_FORMAT_RGBA, {100, 0, 200, 255, 100, 0, 200, 0}), {});
    EXPECT_EQ(b.rgb, (std::vector<uint8_t>{100, 0, 200, 255, 255, 255}));
    Rgb8 g = decode(png(2, 1, PNG_FORMAT_GRAY, {7, 250}), {});
    EXPECT_EQ(g.rgb, (std::vector<uint8_t>{7, 7, 7, 250, 250, 250}));
    // JPEG at quality 100: within a few levels.
    std::vector<uint8_t> flat(16 * 8 * 3);
    for (size_t i = 0; i < flat.size(); ++i) flat[i] = uint8_t(i % 3 == 0 ? 200 : i % 3 == 1 ? 100 : 50);
    Rgb8 j = decode(jpeg(16, 8, flat), {});
    ASSERT_EQ(j.width, 16u);
    ASSERT_EQ(j.height, 8u);
    for (size_t i = 0; i < flat.size(); ++i) EXPECT_NEAR(int(j.rgb[i]), int(flat[i]), 3) << i;
}

TEST(ImageDecode, RefusesByName) {
    EXPECT_NE(decode_refusal("GIF89a....").find("neither PNG nor JPEG"), std::string::npos);
    EXPECT_NE(decode_refusal("").find("neither PNG nor JPEG"), std::string::npos);
    const std::string p = png(40, 30, PNG_FORMAT_RGB, std::vector<uint8_t>(40 * 30 * 3, 9));
    EXPECT_NE(decode_refusal(p.substr(0, p.size() / 2)).find("PNG image cannot be read"), std::string::npos);
    EXPECT_NE(decode_refusal(p.substr(0, 20)).find("PNG image cannot be read"), std::string::npos);
    Limits l;
    l.max_side = 32;
    EXPECT_NE(decode_refusal(p, l).find("40x30 pixels; at most 32 on a side"), std::string::npos);
    l = {};
    l.max_pixels = 1000;
    EXPECT_NE(decode_refusal(p, l).find("1000 in all"), std::string::npos);
    const std::string j = jpeg(40, 30, std::vector<uint8_t>(40 * 30 * 3, 9));
    l = {};
    l.max_side = 32;
    EXPECT_NE(decode_refusal(j, l).find("JPEG image is 40x30"), std::string::npos);
    EXPECT_NE(decode_refusal(j.substr(0, 10)).find("JPEG image cannot be read"), std::string::npos);
    l = {};
    l.max_bytes = 100;
    EXPECT_NE(decode_refusal(p, l).find("larger than 100 bytes"), std::string::npos);
}

TEST(ImageResize, PilBilinearAndNormalisation) {
    const float mean[3] = {0.5f, 0.5f, 0.5f}, sd[3] = {0.5f, 0.5f, 0.5f};
    // Same size: no resampling, (v / 255 - 0.5) / 0.5 per plane.
    Rgb8 img{2, 1, {0, 255, 51, 255, 0, 102}};
    auto same = encoder_input(img, 2, 1, mean, sd);
    ASSERT_EQ(same.size(), 6u);
    EXPECT_FLOAT_EQ(same[0], -1.0f);  // R of pixel 0
    EXPECT_FLOAT_EQ(same[1], 1.0f);   // R of pixel 1
    EXPECT_FLOAT_EQ(same[2], 1.0f);   // G of pixel 0
    EXPECT_NEAR(same[4], (51.0f / 255 - 0.5f) / 0.5f, 1e-6);
    // Upscaling 2 -> 4 as PIL's BILINEAR does: 0, 50, 150, 200.
    Rgb8 row{2, 1, {0, 0, 0, 200, 200, 200}};
    const float zero[3] = {0, 0, 0}, one[3] = {1.0f / 255, 1.0f / 255, 1.0f / 255};
    auto up = encoder_input(row, 4, 1, zero, one);
    EXPECT_NEAR(up[0], 0.0f, 1e-3);
    EXPECT_NEAR(up[1], 50.0f, 1e-3);
    EXPECT_NEAR(up[2], 150.0f, 1e-3);
    EXPECT_NEAR(up[3], 200.0f, 1e-3);
    // Shrinking 4 -> 2 widens the filter by the scale: output 0 (centre 1.0)
    // weighs x = 0, 1, 2 by 3/7, 3/7, 1/7.
    Rgb8 four{4, 1, {0, 0, 0, 100, 100, 100, 200, 200, 200, 100, 100, 100}};
    auto down = encoder_input(four, 2, 1, zero, one);
    EXPECT_NEAR(down[0], 71.0f, 1e-3);  // 500 / 7 = 71.4, rounded
    // Vertical: a 1x2 image to 1x4 is the transpose of the row case.
    Rgb8 col{1, 2, {0, 0, 0, 200, 200, 200}};
    auto upv = encoder_input(col, 1, 4, zero, one);
    EXPECT_NEAR(upv[1], 50.0f, 1e-3);
    EXPECT_NEAR(upv[2], 150.0f, 1e-3);
}

TEST(ImageResize, PilBicubic) {
    // Upscaling 2 -> 4 with PIL's BICUBIC (a = -0.5, support 2): output 0
    // (centre 0.25) weighs the two pixels 0.8671875 and -0.0703125 before
    // normalising, so 200 * -0.0882 clips to 0; output 1 (centre 0.75) takes
    // 200 * 0.2265625 / 1.09375 = 41.4; the others mirror them.
    Rgb8 row{2, 1, {0, 0, 0, 200, 200, 200}};
    const float zero[3] = {0, 0, 0}, one[3] = {1.0f / 255, 1.0f / 255, 1.0f / 255};
    auto up = encoder_input(row, 4, 1, zero, one, Filter::Bicubic);
    EXPECT_NEAR(up[0], 0.0f, 1e-3);
    EXPECT_NEAR(up[1], 41.0f, 1e-3);
    EXPECT_NEAR(up[2], 159.0f, 1e-3);
    EXPECT_NEAR(up[3], 218.0f, 1e-3);
    // Bilinear gives other values for the same resize (0, 50, 150, 200).
    EXPECT_NEAR(encoder_input(row, 4, 1, zero, one)[1], 50.0f, 1e-3);
}

// transformers' Qwen2-VL smart_resize, with Qwen2.5-VL's tile of 28 and the
// CPU reference's 4..1024 tiles (values from its Python definition).
TEST(ImageTiles, SmartResize) {
    auto fit = [](uint32_t w, uint32_t h) { return fit_to_tiles(w, h, 28, 4, 1024); };
    auto eq = [](TileSize s, uint32_t w, uint32_t h) { return s.width == w && s.height == h; };
    EXPECT_TRUE(eq(fit(100, 60), 112, 56));
    EXPECT_TRUE(eq(fit(98, 42), 112, 56));    // 3.5 and 1.5 tiles: halves to even, as Python's round
    EXPECT_TRUE(eq(fit(70, 70), 56, 56));     // 2.5 -> 2
    EXPECT_TRUE(eq(fit(4000, 3000), 1008, 756));  // too many tiles: both sides shrink, rounded down
    EXPECT_TRUE(eq(fit(1920, 1080), 1176, 672));
    EXPECT_TRUE(eq(fit(20, 20), 56, 56));     // too few: both grow, rounded up
    EXPECT_TRUE(eq(fit(2000, 10), 812, 28));  // 200:1 is taken
    EXPECT_TRUE(eq(fit(1600, 8), 812, 28));
    try {
        fit(2010, 10);
        FAIL() << "201:1 taken";
    } catch (const ImageError& e) {
        EXPECT_NE(std::string(e.what()).find("more than 200 times"), std::string::npos) << e.what();
    }
    EXPECT_THROW(fit(0, 10), ImageError);
}

TEST(ImageDigest, ChangesWithAnyPixelOrTheSize) {
    Rgb8 a{2, 1, {1, 2, 3, 4, 5, 6}};
    Rgb8 b = a;
    EXPECT_EQ(digest(a), digest(b));
    EXPECT_EQ(digest(a).size(), 64u);
    b.rgb[5] = 7;
    EXPECT_NE(digest(a), digest(b));
    Rgb8 c{1, 2, a.rgb};
    EXPECT_NE(digest(a), digest(c));
}
