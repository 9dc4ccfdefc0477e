// Reading llama.cpp's multimodal projector GGUF ("mmproj") for the image
// encoders: keys and tensors checked by name, every error an ehp::Error
// (EH_MODEL_LOAD_FAILED) that says which.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/mmproj.hpp>
#include <engine_host/plugin_abi.hpp>

#include "weights.hpp"

namespace cpuref {
class ThreadPool;
}

namespace cpuref::mmproj {

// The SDK's readers (engine_host/mmproj.hpp): vblk ("v.blk.N.what"), floats
// (all n values of a tensor of any shape), key_u32 (a key in 1..2^20),
// three_floats (image_mean, image_std), projector_type.
using ehp::mmproj::floats;
using ehp::mmproj::key_u32;
using ehp::mmproj::projector_type;
using ehp::mmproj::three_floats;
using ehp::mmproj::vblk;
// A weight matrix of dims {cols, rows} read in place from the mapping.
Matrix mapped(const ehp::ModelView& v, const std::string& name, uint64_t cols, uint64_t rows);
// A matrix over floats the encoder owns (which must outlive it), rows of `cols`.
Matrix owned(const std::string& name, const std::vector<float>& v, uint64_t cols, uint64_t rows);

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
