#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

#include <jpeglib.h>
#include <openssl/evp.h>
#include <png.h>

#include "eh/image/image.hpp"

namespace eh::image {
namespace {

void check_size(uint64_t w, uint64_t h, const Limits& limits, const char* what) {
    if (w == 0 || h == 0) throw ImageError(std::string("the ") + what + " image is empty (0 pixels wide or high)");
    if (w > limits.max_side || h > limits.max_side || w * h > limits.max_pixels)
        throw ImageError(std::string("the ") + what + " image is " + std::to_string(w) + "x" + std::to_string(h) +
                         " pixels; at most " + std::to_string(limits.max_side) + " on a side and " +
                         std::to_string(limits.max_pixels) + " in all are taken");
}

Rgb8 decode_png(std::string_view bytes, const Limits& limits) {
    png_image im;
    std::memset(&im, 0, sizeof(im));
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&im, bytes.data(), bytes.size()))
        throw ImageError(std::string("the PNG image cannot be read: ") + im.message);
    struct Free {
        png_image& im;
        ~Free() { png_image_free(&im); }
    } free_it{im};
    check_size(im.width, im.height, limits, "PNG");
    im.format = PNG_FORMAT_RGBA;
    std::vector<uint8_t> rgba(size_t(PNG_IMAGE_SIZE(im)));
    if (!png_image_finish_read(&im, nullptr, rgba.data(), 0, nullptr))
        throw ImageError(std::string("the PNG image cannot be read: ") + im.message);
    Rgb8 out;
    out.width = im.width;
    out.height = im.height;
    const size_t n = size_t(im.width) * im.height;
    out.rgb.resize(n * 3);
    // Alpha composited onto white, as transformers' convert_to_rgb does.
    for (size_t i = 0; i < n; ++i) {
        const unsigned a = rgba[i * 4 + 3];
        for (int c = 0; c < 3; ++c) out.rgb[i * 3 + c] = uint8_t((rgba[i * 4 + c] * a + 255u * (255u - a) + 127u) / 255u);
    }
    return out;
}

struct JpegError {
    jpeg_error_mgr mgr;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr c) {
    auto* e = reinterpret_cast<JpegError*>(c->err);
    e->mgr.format_message(c, e->message);
    std::longjmp(e->jump, 1);
}

void jpeg_quiet(j_common_ptr, int) {}

Rgb8 decode_jpeg(std::string_view bytes, const Limits& limits) {
    Rgb8 out;  // every object with a destructor lives before the setjmp
    std::string fail;
    jpeg_decompress_struct cinfo;
    JpegError err;
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_fail;
    err.mgr.emit_message = jpeg_quiet;
    err.message[0] = '\0';
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        throw ImageError(std::string("the JPEG image cannot be read: ") + err.message);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.image_width == 0 || cinfo.image_height == 0 || cinfo.image_width > limits.max_side ||
        cinfo.image_height > limits.max_side || uint64_t(cinfo.image_width) * cinfo.image_height > limits.max_pixels) {
        const uint64_t w = cinfo.image_width, h = cinfo.image_height;
        jpeg_destroy_decompress(&cinfo);
        check_size(w, h, limits, "JPEG");
    }
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3) {
        jpeg_destroy_decompress(&cinfo);
        throw ImageError("the JPEG image cannot be converted to RGB");
    }
    out.width = cinfo.output_width;
    out.height = cinfo.output_height;
    out.rgb.resize(size_t(out.width) * out.height * 3);
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = &out.rgb[size_t(cinfo.output_scanline) * out.width * 3];
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return out;
}

}  // namespace

Rgb8 decode(std::string_view bytes, const Limits& limits) {
    if (bytes.size() > limits.max_bytes)
        throw ImageError("the image is larger than " + std::to_string(limits.max_bytes) + " bytes");
    static const char kPng[] = "\x89PNG\r\n\x1a\n";
    if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return decode_png(bytes, limits);
    if (bytes.size() >= 3 && std::memcmp(bytes.data(), "\xff\xd8\xff", 3) == 0) return decode_jpeg(bytes, limits);
    throw ImageError("the image is neither PNG nor JPEG (the formats taken)");
}

std::string digest(const Rgb8& img) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    const std::string head = std::to_string(img.width) + "x" + std::to_string(img.height) + ":";
    const bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) && EVP_DigestUpdate(ctx, head.data(), head.size()) &&
                    EVP_DigestUpdate(ctx, img.rgb.data(), img.rgb.size()) && EVP_DigestFinal_ex(ctx, md, &len);
    EVP_MD_CTX_free(ctx);
    if (!ok) throw std::runtime_error("SHA-256 failed");
    static const char hex[] = "0123456789abcdef";
    std::string out;
    for (unsigned i = 0; i < len; ++i) out += hex[md[i] >> 4], out += hex[md[i] & 15];
    return out;
}

}  // namespace eh::image
