#include "vision.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>

#include "mmproj.hpp"
#include "ops.hpp"
#include "thread_pool.hpp"
#include "vision_qwen.hpp"

namespace cpuref {

using ehp::Error;
using namespace mmproj;

VisionEncoder::VisionEncoder(const eh_model_view* view, uint32_t text_n_embd, ThreadPool& pool) : pool_(pool) {
    const ehp::ModelView v(view);
    const ehp::mmproj::Gemma3Shape sh = ehp::mmproj::gemma3_shape(v, text_n_embd);
    size_ = sh.size;
    patch_ = sh.patch;
    grid_ = sh.grid;
    merge_ = sh.merge;
    width_ = sh.width;
    ff_ = sh.ff;
    n_head_ = sh.n_head;
    eps_ = sh.eps;
    const uint32_t n_block = sh.n_block;

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
        b.attn = attention(v, i, W);
        b.up = linear(v, i, "ffn_up", W, ff_);
        b.down = linear(v, i, "ffn_down", ff_, W);
    }
    post_w_ = floats(v, "v.post_ln.weight", W);
    post_b_ = floats(v, "v.post_ln.bias", W);
    soft_norm_ = floats(v, "mm.soft_emb_norm.weight", W);
    const std::string pn = "mm.input_projection.weight";
    const std::vector<float> p = floats(ehp::mmproj::gemma3_projection(v, text_n_embd, W), pn, uint64_t(text_n_embd) * W);
    proj_.resize(p.size());
    for (uint64_t w = 0; w < W; ++w)
        for (uint64_t t = 0; t < text_n_embd; ++t) proj_[t * W + w] = p[w * text_n_embd + t];
    proj_m_ = owned("mm.input_projection.weight", proj_, W, text_n_embd);

    info_ = sh.info;
}

void VisionEncoder::encode(const float* pixels, uint32_t width, uint32_t height, float* out) const {
    if (width != size_ || height != size_)
        throw Error(EH_INVALID_ARGUMENT, "image_encode: this encoder takes " + std::to_string(size_) + "x" +
                                             std::to_string(size_) + " pixels, not " + std::to_string(width) + "x" +
                                             std::to_string(height));
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
        apply(pool_, b.attn.q, h.data(), N, q.data());
        apply(pool_, b.attn.k, h.data(), N, k.data());
        apply(pool_, b.attn.v, h.data(), N, v.data());
        // Every patch sees every patch.
        pool_.parallel_for(N * n_head_, 1, [&](size_t lo, size_t hi) {
            std::vector<float> scores(N);
            for (size_t item = lo; item < hi; ++item) {
                const size_t t = item / n_head_, hh = item % n_head_;
                attend_one(&q[t * W + hh * hd], &k[hh * hd], &v[hh * hd], W, hd, 0, int64_t(N) - 1, scale, nullptr,
                           scores.data(), &att[t * W + hh * hd]);
            }
        });
        apply(pool_, b.attn.o, att.data(), N, h.data());
        for (size_t i = 0; i < N * W; ++i) x[i] += h[i];
        for (size_t t = 0; t < N; ++t) layer_norm(&x[t * W], b.ln2_w.data(), b.ln2_b.data(), eps_, W, &h[t * W]);
        apply(pool_, b.up, h.data(), N, u.data());
        for (float& a : u) a = gelu_tanh(a);
        apply(pool_, b.down, u.data(), N, h.data());
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

namespace cpuref {

std::unique_ptr<ImageEncoder> load_image_encoder(const eh_model_view* view, uint32_t text_n_embd, ThreadPool& pool) {
    const std::string proj = projector_type(ehp::ModelView(view));
    if (proj == "gemma3") return std::make_unique<VisionEncoder>(view, text_n_embd, pool);
    if (proj == "qwen2.5vl_merger") return std::make_unique<QwenVlEncoder>(view, text_n_embd, pool);
    throw Error(EH_UNSUPPORTED, "mmproj projector type '" + proj +
                                    "' is not supported by cpu-reference (gemma3 and qwen2.5vl_merger are)");
}

}  // namespace cpuref
