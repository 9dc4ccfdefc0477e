#include "vision.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>

#include "ops.hpp"
#include "thread_pool.hpp"

namespace cpuref {
namespace {

using ehp::Error;

std::string vblk(uint32_t i, const char* what) { return "v.blk." + std::to_string(i) + "." + what; }

uint64_t elements(const eh_tensor& t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t.n_dims && d < EH_MAX_DIMS; ++d)
        if (__builtin_mul_overflow(n, t.dims[d], &n)) return UINT64_MAX;
    return n;
}

// All n values of a tensor as floats, any shape with n elements.
std::vector<float> floats(const ehp::ModelView& v, const std::string& name, uint64_t n) {
    const eh_tensor& t = v.require_tensor(name);
    if (elements(t) != n)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' has " + std::to_string(elements(t)) +
                                              " elements, expected " + std::to_string(n));
    const uint64_t bytes = ehp::quant::row_bytes(t.type, n);
    if (bytes == 0 || t.nbytes < bytes || !t.data)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' of type " + ehp::type_name(t.type) +
                                              " is too short or not a whole number of blocks");
    std::vector<float> out(n);
    if (!ehp::quant::dequantize_row(t.type, t.data, out.data(), n))
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "': type " + ehp::type_name(t.type) +
                                              " cannot be read");
    return out;
}

// A weight matrix of dims {cols, rows} read in place from the mapping.
Matrix mapped(const ehp::ModelView& v, const std::string& name, uint64_t cols, uint64_t rows) {
    const eh_tensor& t = v.require_tensor(name);
    if (t.n_dims < 2 || t.dims[0] != cols || t.dims[1] != rows || elements(t) != cols * rows)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' must have dims {" + std::to_string(cols) + ", " +
                                              std::to_string(rows) + "}");
    Matrix m;
    m.name = name;
    m.type = t.type;
    m.cols = cols;
    m.rows = rows;
    m.phys_rows = rows;
    m.row_bytes = ehp::quant::row_bytes(t.type, cols);
    if (m.row_bytes == 0 || t.nbytes < m.row_bytes * rows || !t.data)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' of type " + ehp::type_name(t.type) +
                                              " is too short or not a whole number of blocks");
    m.data = static_cast<const uint8_t*>(t.data);
    return m;
}

// A matrix over floats this encoder owns, rows of `cols`.
Matrix owned(const std::string& name, const std::vector<float>& v, uint64_t cols, uint64_t rows) {
    Matrix m;
    m.name = name;
    m.type = EH_TYPE_F32;
    m.cols = cols;
    m.rows = rows;
    m.phys_rows = rows;
    m.row_bytes = cols * sizeof(float);
    m.data = reinterpret_cast<const uint8_t*>(v.data());
    return m;
}

uint32_t key_u32(const ehp::ModelView& v, const char* key) {
    const uint64_t x = v.require_uint(key);
    if (x == 0 || x > (1u << 20))
        throw Error(EH_MODEL_LOAD_FAILED, std::string("mmproj metadata '") + key + "' is " + std::to_string(x) +
                                              ", outside 1.." + std::to_string(1u << 20));
    return uint32_t(x);
}

void three_floats(const ehp::ModelView& v, const char* key, float (&out)[3]) {
    const eh_value* x = v.find(key);
    if (!x) throw Error(EH_MODEL_LOAD_FAILED, std::string("missing mmproj metadata '") + key + "'");
    if (x->type != EH_VALUE_ARRAY || x->count != 3 || (x->elem_type != EH_VALUE_F32 && x->elem_type != EH_VALUE_F64))
        throw Error(EH_MODEL_LOAD_FAILED, std::string("mmproj metadata '") + key + "' must be an array of 3 floats");
    for (int c = 0; c < 3; ++c)
        out[c] = x->elem_type == EH_VALUE_F32 ? static_cast<const float*>(x->v.array)[c]
                                               : float(static_cast<const double*>(x->v.array)[c]);
}

}  // namespace

VisionEncoder::VisionEncoder(const eh_model_view* view, uint32_t text_n_embd, ThreadPool& pool) : pool_(pool) {
    const ehp::ModelView v(view);
    std::string proj;
    if (auto p = v.get_string("clip.projector_type")) proj = std::string(*p);
    else if (auto q = v.get_string("clip.vision.projector_type")) proj = std::string(*q);
    else throw Error(EH_MODEL_LOAD_FAILED, "the mmproj file has no 'clip.projector_type': not a multimodal projector");
    if (proj != "gemma3")
        throw Error(EH_UNSUPPORTED, "mmproj projector type '" + proj + "' is not supported by cpu-reference (gemma3 is)");
    if (auto h = v.get_uint("clip.has_vision_encoder"); h && *h == 0)
        throw Error(EH_MODEL_LOAD_FAILED, "the mmproj file says it has no vision encoder (clip.has_vision_encoder)");

    size_ = key_u32(v, "clip.vision.image_size");
    patch_ = key_u32(v, "clip.vision.patch_size");
    width_ = key_u32(v, "clip.vision.embedding_length");
    ff_ = key_u32(v, "clip.vision.feed_forward_length");
    n_head_ = key_u32(v, "clip.vision.attention.head_count");
    const uint32_t n_block = key_u32(v, "clip.vision.block_count");
    eps_ = float(v.get_float("clip.vision.attention.layer_norm_epsilon").value_or(1e-6));
    // Gemma 3 pools by 4 unless the file says otherwise (llama.cpp's rule:
    // the key is written only for test models that differ).
    merge_ = 4;
    if (v.find("clip.vision.projector.scale_factor")) merge_ = key_u32(v, "clip.vision.projector.scale_factor");
    if (size_ % patch_ != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj image_size " + std::to_string(size_) + " is not a multiple of patch_size " +
                                              std::to_string(patch_));
    grid_ = size_ / patch_;
    if (grid_ % merge_ != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj patch grid " + std::to_string(grid_) + " is not a multiple of the pooling " +
                                              std::to_string(merge_));
    if (width_ % n_head_ != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj embedding_length " + std::to_string(width_) +
                                              " is not a multiple of head_count " + std::to_string(n_head_));
    if (auto pd = v.get_uint("clip.vision.projection_dim"); pd && *pd != text_n_embd)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj projection_dim " + std::to_string(*pd) + " is not the model's width " +
                                              std::to_string(text_n_embd) + ": the projector belongs to another model");

    const uint64_t W = width_, P = 3ull * patch_ * patch_, N = uint64_t(grid_) * grid_;
    patch_w_ = floats(v, "v.patch_embd.weight", W * P);
    patch_b_ = v.find_tensor("v.patch_embd.bias") ? floats(v, "v.patch_embd.bias", W) : std::vector<float>(W, 0.0f);
    pos_ = floats(v, "v.position_embd.weight", N * W);
    blocks_.resize(n_block);
    for (uint32_t i = 0; i < n_block; ++i) {
        Block& b = blocks_[i];
        b.ln1_w = floats(v, vblk(i, "ln1.weight"), W);
        b.ln1_b = floats(v, vblk(i, "ln1.bias"), W);
        b.ln2_w = floats(v, vblk(i, "ln2.weight"), W);
        b.ln2_b = floats(v, vblk(i, "ln2.bias"), W);
        b.q = mapped(v, vblk(i, "attn_q.weight"), W, W);
        b.k = mapped(v, vblk(i, "attn_k.weight"), W, W);
        b.v = mapped(v, vblk(i, "attn_v.weight"), W, W);
        b.o = mapped(v, vblk(i, "attn_out.weight"), W, W);
        b.up = mapped(v, vblk(i, "ffn_up.weight"), W, ff_);
        b.down = mapped(v, vblk(i, "ffn_down.weight"), ff_, W);
        b.q_b = floats(v, vblk(i, "attn_q.bias"), W);
        b.k_b = floats(v, vblk(i, "attn_k.bias"), W);
        b.v_b = floats(v, vblk(i, "attn_v.bias"), W);
        b.o_b = floats(v, vblk(i, "attn_out.bias"), W);
        b.up_b = floats(v, vblk(i, "ffn_up.bias"), ff_);
        b.down_b = floats(v, vblk(i, "ffn_down.bias"), W);
    }
    post_w_ = floats(v, "v.post_ln.weight", W);
    post_b_ = floats(v, "v.post_ln.bias", W);
    soft_norm_ = floats(v, "mm.soft_emb_norm.weight", W);
    // HF's mm_input_projection_weight is [width, text]: GGUF dims {text, width}.
    const eh_tensor& pt = v.require_tensor("mm.input_projection.weight");
    if (pt.n_dims < 2 || pt.dims[0] != text_n_embd || pt.dims[1] != W)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor 'mm.input_projection.weight' must have dims {" +
                                              std::to_string(text_n_embd) + ", " + std::to_string(W) +
                                              "} (the model's width, the encoder's)");
    const std::vector<float> p = floats(v, "mm.input_projection.weight", uint64_t(text_n_embd) * W);
    proj_.resize(p.size());
    for (uint64_t w = 0; w < W; ++w)
        for (uint64_t t = 0; t < text_n_embd; ++t) proj_[t * W + w] = p[w * text_n_embd + t];
    proj_m_ = owned("mm.input_projection.weight", proj_, W, text_n_embd);

    info_.struct_size = sizeof(info_);
    info_.image_width = info_.image_height = size_;
    info_.n_tokens = (grid_ / merge_) * (grid_ / merge_);
    info_.n_embd = text_n_embd;
    info_.span_flags = EH_SPAN_BIDIRECTIONAL;  // Gemma 3 attends among an image's tokens both ways
    three_floats(v, "clip.vision.image_mean", info_.mean);
    three_floats(v, "clip.vision.image_std", info_.std);
}

void VisionEncoder::encode(const float* pixels, float* out) const {
    const size_t W = width_, F = ff_, N = size_t(grid_) * grid_, p = patch_, P = 3 * p * p;
    const size_t hd = W / n_head_;
    // Patches as rows of (channel, row, column), the conv's weight order.
    std::vector<float> in(N * P);
    for (size_t py = 0; py < grid_; ++py)
        for (size_t px = 0; px < grid_; ++px) {
            float* r = &in[(py * grid_ + px) * P];
            for (size_t c = 0; c < 3; ++c)
                for (size_t ky = 0; ky < p; ++ky)
                    std::memcpy(r + (c * p + ky) * p, pixels + (c * size_ + py * p + ky) * size_ + px * p,
                                p * sizeof(float));
        }
    std::vector<float> x(N * W), h(N * W), q(N * W), k(N * W), v(N * W), att(N * W), u(N * F);
    matmul(pool_, owned("v.patch_embd.weight", patch_w_, P, W), 0, W, in.data(), N, P, x.data(), W, patch_b_.data());
    for (size_t i = 0; i < N * W; ++i) x[i] += pos_[i];

    const float scale = 1.0f / std::sqrt(float(hd));
    for (const Block& b : blocks_) {
        for (size_t t = 0; t < N; ++t) layer_norm(&x[t * W], b.ln1_w.data(), b.ln1_b.data(), eps_, W, &h[t * W]);
        matmul(pool_, b.q, 0, W, h.data(), N, W, q.data(), W, b.q_b.data());
        matmul(pool_, b.k, 0, W, h.data(), N, W, k.data(), W, b.k_b.data());
        matmul(pool_, b.v, 0, W, h.data(), N, W, v.data(), W, b.v_b.data());
        // Every patch sees every patch.
        pool_.parallel_for(N * n_head_, 1, [&](size_t lo, size_t hi) {
            std::vector<float> scores(N);
            for (size_t item = lo; item < hi; ++item) {
                const size_t t = item / n_head_, hh = item % n_head_;
                attend_one(&q[t * W + hh * hd], &k[hh * hd], &v[hh * hd], W, hd, 0, int64_t(N) - 1, scale, nullptr,
                           scores.data(), &att[t * W + hh * hd]);
            }
        });
        matmul(pool_, b.o, 0, W, att.data(), N, W, h.data(), W, b.o_b.data());
        for (size_t i = 0; i < N * W; ++i) x[i] += h[i];
        for (size_t t = 0; t < N; ++t) layer_norm(&x[t * W], b.ln2_w.data(), b.ln2_b.data(), eps_, W, &h[t * W]);
        matmul(pool_, b.up, 0, F, h.data(), N, W, u.data(), F, b.up_b.data());
        for (float& a : u) a = gelu_tanh(a);
        matmul(pool_, b.down, 0, W, u.data(), N, F, h.data(), W, b.down_b.data());
        for (size_t i = 0; i < N * W; ++i) x[i] += h[i];
    }
    for (size_t t = 0; t < N; ++t) layer_norm(&x[t * W], post_w_.data(), post_b_.data(), eps_, W, &h[t * W]);

    // Average each merge x merge square of the patch grid into one token,
    // row by row, then the projector's norm and linear map.
    const size_t n = grid_ / merge_, M = n * n;
    std::vector<float> pooled(M * W, 0.0f), normed(M * W);
    const float inv = 1.0f / float(merge_ * merge_);
    for (size_t oy = 0; oy < n; ++oy)
        for (size_t ox = 0; ox < n; ++ox) {
            float* o = &pooled[(oy * n + ox) * W];
            for (size_t ky = 0; ky < merge_; ++ky)
                for (size_t kx = 0; kx < merge_; ++kx) {
                    const float* src = &h[((oy * merge_ + ky) * grid_ + ox * merge_ + kx) * W];
                    for (size_t e = 0; e < W; ++e) o[e] += src[e];
                }
            for (size_t e = 0; e < W; ++e) o[e] *= inv;
            rms_norm(o, soft_norm_.data(), eps_, W, &normed[(oy * n + ox) * W]);
        }
    matmul(pool_, proj_m_, 0, info_.n_embd, normed.data(), M, W, out, info_.n_embd);
}

}  // namespace cpuref
