// Reading llama.cpp's multimodal projector GGUF ("mmproj") for the image
// encoders: keys and tensors checked by name, every error an ehp::Error
// (EH_MODEL_LOAD_FAILED) that says which.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

#include "weights.hpp"

namespace cpuref {
class ThreadPool;
}

namespace cpuref::mmproj {

// "v.blk.N.what"
std::string vblk(uint32_t i, const char* what);
// All n values of a tensor as floats, any shape with n elements.
std::vector<float> floats(const ehp::ModelView& v, const std::string& name, uint64_t n);
// A weight matrix of dims {cols, rows} read in place from the mapping.
Matrix mapped(const ehp::ModelView& v, const std::string& name, uint64_t cols, uint64_t rows);
// A matrix over floats the encoder owns (which must outlive it), rows of `cols`.
Matrix owned(const std::string& name, const std::vector<float>& v, uint64_t cols, uint64_t rows);
// A key in 1..2^20.
uint32_t key_u32(const ehp::ModelView& v, const char* key);
// A key of 3 floats (image_mean, image_std).
void three_floats(const ehp::ModelView& v, const char* key, float (&out)[3]);
// clip.projector_type (or the older clip.vision.projector_type).
std::string projector_type(const ehp::ModelView& v);

// A block's linear map with its bias: v.blk.N.<what>.weight of dims
// {cols, rows} (read in place) and .bias of rows floats.
struct Linear {
    Matrix w;
    std::vector<float> b;
};
Linear linear(const ehp::ModelView& v, uint32_t block, const std::string& what, uint64_t cols, uint64_t rows);
// y = W x + b for n rows of x (w.cols floats each) into n rows of y (w.rows each).
void apply(ThreadPool& pool, const Linear& l, const float* x, size_t n, float* y);

// A block's attention maps, attn_q, attn_k, attn_v and attn_out, each width x width.
struct Attention {
    Linear q, k, v, o;
};
Attention attention(const ehp::ModelView& v, uint32_t block, uint64_t width);

}  // namespace cpuref::mmproj
