// Reading llama.cpp's multimodal projector GGUF ("mmproj": general.
// architecture "clip", clip.vision.* keys, v.* and mm.* tensors) in a
// plugin's image encoder: keys and tensors checked by name, every error an
// ehp::Error (EH_MODEL_LOAD_FAILED) that says which; and Gemma 3's tower
// shape, checked once for every engine that runs it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plugin_abi.hpp"
#include "quant_blocks.hpp"

namespace ehp::mmproj {

// Elements of a tensor (UINT64_MAX when the product overflows).
inline uint64_t elements(const eh_tensor& t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t.n_dims && d < EH_MAX_DIMS; ++d)
        if (__builtin_mul_overflow(n, t.dims[d], &n)) return UINT64_MAX;
    return n;
}

// "v.blk.N.what"
inline std::string vblk(uint32_t i, const char* what) { return "v.blk." + std::to_string(i) + "." + what; }

// A key in 1..2^20.
inline uint32_t key_u32(const ModelView& v, const char* key) {
    const uint64_t x = v.require_uint(key);
    if (x == 0 || x > (1u << 20))
        throw Error(EH_MODEL_LOAD_FAILED, std::string("mmproj metadata '") + key + "' is " + std::to_string(x) +
                                              ", outside 1.." + std::to_string(1u << 20));
    return uint32_t(x);
}

// A key of 3 floats (image_mean, image_std).
inline void three_floats(const ModelView& v, const char* key, float (&out)[3]) {
    const eh_value* x = v.find(key);
    if (!x) throw Error(EH_MODEL_LOAD_FAILED, std::string("missing mmproj metadata '") + key + "'");
    if (x->type != EH_VALUE_ARRAY || x->count != 3 || (x->elem_type != EH_VALUE_F32 && x->elem_type != EH_VALUE_F64))
        throw Error(EH_MODEL_LOAD_FAILED, std::string("mmproj metadata '") + key + "' must be an array of 3 floats");
    for (int c = 0; c < 3; ++c)
        out[c] = x->elem_type == EH_VALUE_F32 ? static_cast<const float*>(x->v.array)[c]
                                               : float(static_cast<const double*>(x->v.array)[c]);
}

// clip.projector_type (or the older clip.vision.projector_type).
inline std::string projector_type(const ModelView& v) {
    if (auto p = v.get_string("clip.projector_type")) return std::string(*p);
    if (auto q = v.get_string("clip.vision.projector_type")) return std::string(*q);
    throw Error(EH_MODEL_LOAD_FAILED, "the mmproj file has no 'clip.projector_type': not a multimodal projector");
}

// A tensor of n elements (any shape), whole blocks of its type, with data.
inline const eh_tensor& sized(const ModelView& v, const std::string& name, uint64_t n) {
    const eh_tensor& t = v.require_tensor(name);
    if (elements(t) != n)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' has " + std::to_string(elements(t)) +
                                              " elements, expected " + std::to_string(n));
    const uint64_t bytes = quant::row_bytes(t.type, n);
    if (bytes == 0 || t.nbytes < bytes || !t.data)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' of type " + type_name(t.type) +
                                              " is too short or not a whole number of blocks");
    return t;
}

// Its n values as floats.
inline std::vector<float> floats(const eh_tensor& t, const std::string& name, uint64_t n) {
    std::vector<float> out(n);
    if (!quant::dequantize_row(t.type, t.data, out.data(), n))
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "': type " + type_name(t.type) + " cannot be read");
    return out;
}
inline std::vector<float> floats(const ModelView& v, const std::string& name, uint64_t n) {
    return floats(sized(v, name, n), name, n);
}

// A matrix tensor of dims {cols, rows}: rows of cols values.
inline const eh_tensor& matrix(const ModelView& v, const std::string& name, uint64_t cols, uint64_t rows) {
    const eh_tensor& t = v.require_tensor(name);
    if (t.n_dims < 2 || t.dims[0] != cols || t.dims[1] != rows || elements(t) != cols * rows)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' must have dims {" + std::to_string(cols) + ", " +
                                              std::to_string(rows) + "}");
    return sized(v, name, cols * rows);
}

// Gemma 3's tower (clip.projector_type "gemma3"): SigLIP of `width` over a
// grid x grid patch grid, pooled by `merge` into (grid / merge)^2 tokens of
// the text model's width. `info` is what image_encoder_load reports.
struct Gemma3Shape {
    uint32_t size = 0, patch = 0, grid = 0, merge = 0, width = 0, ff = 0, n_head = 0, n_block = 0;
    float eps = 1e-6f;
    eh_image_encoder_info info{};
};

// Reads and checks the keys (the tensors are the caller's), for a text
// model of width text_n_embd.
inline Gemma3Shape gemma3_shape(const ModelView& v, uint32_t text_n_embd) {
    if (auto h = v.get_uint("clip.has_vision_encoder"); h && *h == 0)
        throw Error(EH_MODEL_LOAD_FAILED, "the mmproj file says it has no vision encoder (clip.has_vision_encoder)");
    Gemma3Shape s;
    s.size = key_u32(v, "clip.vision.image_size");
    s.patch = key_u32(v, "clip.vision.patch_size");
    s.width = key_u32(v, "clip.vision.embedding_length");
    s.ff = key_u32(v, "clip.vision.feed_forward_length");
    s.n_head = key_u32(v, "clip.vision.attention.head_count");
    s.n_block = key_u32(v, "clip.vision.block_count");
    if (s.n_block > 1024)  // SigLIP has 27; every block's tensors must be there anyway
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj block_count " + std::to_string(s.n_block) + " is more than 1024");
    s.eps = float(v.get_float("clip.vision.attention.layer_norm_epsilon").value_or(1e-6));
    // Gemma 3 pools by 4 unless the file says otherwise (llama.cpp's rule:
    // the key is written only for test models that differ).
    s.merge = 4;
    if (v.find("clip.vision.projector.scale_factor")) s.merge = key_u32(v, "clip.vision.projector.scale_factor");
    if (s.size % s.patch != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj image_size " + std::to_string(s.size) +
                                              " is not a multiple of patch_size " + std::to_string(s.patch));
    s.grid = s.size / s.patch;
    if (s.grid % s.merge != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj patch grid " + std::to_string(s.grid) +
                                              " is not a multiple of the pooling " + std::to_string(s.merge));
    if (s.width % s.n_head != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj embedding_length " + std::to_string(s.width) +
                                              " is not a multiple of head_count " + std::to_string(s.n_head));
    if (auto pd = v.get_uint("clip.vision.projection_dim"); pd && *pd != text_n_embd)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj projection_dim " + std::to_string(*pd) + " is not the model's width " +
                                              std::to_string(text_n_embd) + ": the projector belongs to another model");
    s.info.struct_size = sizeof(s.info);
    s.info.image_width = s.info.image_height = s.size;
    s.info.n_tokens = (s.grid / s.merge) * (s.grid / s.merge);
    s.info.n_embd = text_n_embd;
    s.info.span_flags = EH_SPAN_BIDIRECTIONAL;  // Gemma 3 attends among an image's tokens both ways
    three_floats(v, "clip.vision.image_mean", s.info.mean);
    three_floats(v, "clip.vision.image_std", s.info.std);
    return s;
}

// mm.input_projection.weight: HF's mm_input_projection_weight is
// [width, text], so GGUF dims {text, width}: width rows of text values.
inline const eh_tensor& gemma3_projection(const ModelView& v, uint32_t text_n_embd, uint64_t width) {
    const eh_tensor& pt = v.require_tensor("mm.input_projection.weight");
    if (pt.n_dims < 2 || pt.dims[0] != text_n_embd || pt.dims[1] != width)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor 'mm.input_projection.weight' must have dims {" +
                                              std::to_string(text_n_embd) + ", " + std::to_string(width) +
                                              "} (the model's width, the encoder's)");
    return sized(v, "mm.input_projection.weight", uint64_t(text_n_embd) * width);
}

}  // namespace ehp::mmproj
