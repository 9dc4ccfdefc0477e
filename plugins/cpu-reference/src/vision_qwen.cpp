#include "vision_qwen.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "mmproj.hpp"
#include "ops.hpp"
#include "thread_pool.hpp"

namespace cpuref {

using ehp::Error;
using namespace mmproj;

QwenVlEncoder::QwenVlEncoder(const eh_model_view* view, uint32_t text_n_embd, ThreadPool& pool) : pool_(pool) {
    const ehp::ModelView v(view);
    if (auto h = v.get_uint("clip.has_vision_encoder"); h && *h == 0)
        throw Error(EH_MODEL_LOAD_FAILED, "the mmproj file says it has no vision encoder (clip.has_vision_encoder)");
    patch_ = key_u32(v, "clip.vision.patch_size");
    width_ = key_u32(v, "clip.vision.embedding_length");
    ff_ = key_u32(v, "clip.vision.feed_forward_length");
    n_head_ = key_u32(v, "clip.vision.attention.head_count");
    const uint32_t n_block = key_u32(v, "clip.vision.block_count");
    if (n_block > 1024)  // Qwen2.5-VL has 32; every block's tensors must be there anyway
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj block_count " + std::to_string(n_block) + " is more than 1024");
    eps_ = float(v.get_float("clip.vision.attention.layer_norm_epsilon").value_or(1e-6));
    if (v.find("clip.vision.spatial_merge_size")) merge_ = key_u32(v, "clip.vision.spatial_merge_size");
    if (merge_ != 2)
        throw Error(EH_UNSUPPORTED, "mmproj spatial_merge_size " + std::to_string(merge_) + " (Qwen2.5-VL merges 2 x 2)");
    // llama.cpp's converter writes the period of the full-attention layers
    // (fullatt_block_indexes 7, 15, 23, 31 -> 8), not the window, which it
    // takes to be 112 pixels unless the file says.
    wa_pattern_ = uint32_t(v.get_uint("clip.vision.n_wa_pattern").value_or(0));
    uint32_t window_px = 112;
    if (v.find("clip.vision.window_size")) window_px = key_u32(v, "clip.vision.window_size");
    if (window_px % (patch_ * merge_) != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj window_size " + std::to_string(window_px) +
                                              " is not a multiple of a merged patch (" + std::to_string(patch_ * merge_) +
                                              " pixels)");
    window_ = window_px / patch_;
    if (width_ % n_head_ != 0 || (width_ / n_head_) % 4 != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj embedding_length " + std::to_string(width_) + " over " +
                                              std::to_string(n_head_) +
                                              " heads is not a head size divisible by 4 (2-D RoPE)");
    if (auto pd = v.get_uint("clip.vision.projection_dim"); pd && *pd != text_n_embd)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj projection_dim " + std::to_string(*pd) + " is not the model's width " +
                                              std::to_string(text_n_embd) + ": the projector belongs to another model");

    const uint64_t W = width_, F = ff_, P = 3ull * patch_ * patch_, W4 = 4ull * width_;
    patch_w_ = floats(v, "v.patch_embd.weight", W * P);
    const std::vector<float> second = floats(v, "v.patch_embd.weight.1", W * P);
    for (size_t i = 0; i < patch_w_.size(); ++i) patch_w_[i] += second[i];
    blocks_.resize(n_block);
    for (uint32_t i = 0; i < n_block; ++i) {
        Block& b = blocks_[i];
        b.ln1 = floats(v, vblk(i, "ln1.weight"), W);
        b.ln2 = floats(v, vblk(i, "ln2.weight"), W);
        b.attn = attention(v, i, W);
        b.gate = linear(v, i, "ffn_gate", W, F);
        b.up = linear(v, i, "ffn_up", W, F);
        b.down = linear(v, i, "ffn_down", F, W);
    }
    post_ln_ = floats(v, "v.post_ln.weight", W);
    mm0_ = mapped(v, "mm.0.weight", W4, W4);
    mm0_b_ = floats(v, "mm.0.bias", W4);
    const eh_tensor& t2 = v.require_tensor("mm.2.weight");
    if (t2.n_dims < 2 || t2.dims[0] != W4 || t2.dims[1] != text_n_embd)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor 'mm.2.weight' must have dims {" + std::to_string(W4) + ", " +
                                              std::to_string(text_n_embd) + "} (4 x the encoder's width, the model's)");
    mm2_ = mapped(v, "mm.2.weight", W4, text_n_embd);
    mm2_b_ = floats(v, "mm.2.bias", text_n_embd);

    info_.struct_size = sizeof(info_);
    const uint32_t tile = patch_ * merge_;
    uint32_t nominal = tile * 20;  // 560, the converter's default image_size
    if (v.find("clip.vision.image_size")) nominal = std::max(tile, key_u32(v, "clip.vision.image_size") / tile * tile);
    info_.image_width = info_.image_height = nominal;
    info_.n_tokens = (nominal / tile) * (nominal / tile);
    info_.n_embd = text_n_embd;
    info_.span_flags = EH_SPAN_GRID;  // causal in the decoder, placed on its grid by M-RoPE
    three_floats(v, "clip.vision.image_mean", info_.mean);
    three_floats(v, "clip.vision.image_std", info_.std);
    info_.tile = tile;
    info_.min_tokens = kMinTokens;
    info_.max_tokens = kMaxTokens;
}

void QwenVlEncoder::encode(const float* pixels, uint32_t width, uint32_t height, float* out) const {
    const uint32_t tile = info_.tile;
    if (width == 0 || height == 0 || width % tile != 0 || height % tile != 0 ||
        uint64_t(width / tile) * (height / tile) < info_.min_tokens ||
        uint64_t(width / tile) * (height / tile) > info_.max_tokens)
        throw Error(EH_INVALID_ARGUMENT, "image_encode_sized: " + std::to_string(width) + "x" + std::to_string(height) +
                                             " is not a multiple of " + std::to_string(tile) + " pixels of " +
                                             std::to_string(info_.min_tokens) + ".." + std::to_string(info_.max_tokens) +
                                             " tiles");
    const size_t W = width_, F = ff_, p = patch_, P = 3 * p * p, hd = W / n_head_;
    const size_t gh = height / p, gw = width / p, N = gh * gw, uw = gw / 2;
    // Patches in merge order: each 2 x 2 square's four (row-major) together,
    // squares row by row -- the order transformers' processor flattens them
    // in, so the merger reads four consecutive rows.
    std::vector<uint32_t> row_of(N), col_of(N);
    for (size_t k = 0; k < N; ++k) {
        const size_t u = k / 4, in = k % 4;
        row_of[k] = uint32_t(2 * (u / uw) + in / 2);
        col_of[k] = uint32_t(2 * (u % uw) + in % 2);
    }
    std::vector<float> in(N * P);
    for (size_t k = 0; k < N; ++k) {
        float* r = &in[k * P];
        for (size_t c = 0; c < 3; ++c)
            for (size_t ky = 0; ky < p; ++ky)
                std::memcpy(r + (c * p + ky) * p, pixels + (c * height + row_of[k] * p + ky) * width + col_of[k] * p,
                            p * sizeof(float));
    }
    std::vector<float> x(N * W), h(N * W), q(N * W), k(N * W), v(N * W), att(N * W), g(N * F), u(N * F);
    matmul(pool_, owned("v.patch_embd.weight", patch_w_, P, W), 0, W, in.data(), N, P, x.data(), W);

    // 2-D RoPE: frequency i < hd/4 turns by the row, the next hd/4 by the
    // column, each at theta 10000 over hd/2 (transformers' VisionRotaryEmbedding
    // of dim hd/2); pairs (i, i + hd/2).
    const size_t quarter = hd / 4, half = hd / 2;
    std::vector<float> cs(N * half), sn(N * half);
    for (size_t t = 0; t < N; ++t)
        for (size_t i = 0; i < half; ++i) {
            const double inv = std::pow(10000.0, -2.0 * double(i % quarter) / double(half));
            const double a = double(i < quarter ? row_of[t] : col_of[t]) * inv;
            cs[t * half + i] = float(std::cos(a));
            sn[t * half + i] = float(std::sin(a));
        }
    auto rotate = [&](float* rows) {
        for (size_t t = 0; t < N; ++t)
            for (size_t hh = 0; hh < n_head_; ++hh) {
                float* x0 = rows + t * W + hh * hd;
                for (size_t i = 0; i < half; ++i) {
                    const float a = x0[i], b = x0[i + half], c = cs[t * half + i], s = sn[t * half + i];
                    x0[i] = a * c - b * s;
                    x0[i + half] = b * c + a * s;
                }
            }
    };
    // Windows of window_ x window_ patches from the top-left corner (the last
    // row and column of windows may be cut short by the image's edge).
    const size_t wx = (gw + window_ - 1) / window_;
    std::vector<std::vector<uint32_t>> windows(((gh + window_ - 1) / window_) * wx);
    std::vector<uint32_t> window_of(N);
    for (size_t t = 0; t < N; ++t) {
        window_of[t] = uint32_t((row_of[t] / window_) * wx + col_of[t] / window_);
        windows[window_of[t]].push_back(uint32_t(t));
    }
    std::vector<uint32_t> everyone(N);
    for (size_t t = 0; t < N; ++t) everyone[t] = uint32_t(t);

    const float scale = 1.0f / std::sqrt(float(hd));
    for (size_t il = 0; il < blocks_.size(); ++il) {
        const Block& b = blocks_[il];
        const bool full = wa_pattern_ == 0 || (il + 1) % wa_pattern_ == 0;
        for (size_t t = 0; t < N; ++t) rms_norm(&x[t * W], b.ln1.data(), eps_, W, &h[t * W]);
        apply(pool_, b.attn.q, h.data(), N, q.data());
        apply(pool_, b.attn.k, h.data(), N, k.data());
        apply(pool_, b.attn.v, h.data(), N, v.data());
        rotate(q.data());
        rotate(k.data());
        pool_.parallel_for(N * n_head_, 1, [&](size_t lo, size_t hi) {
            std::vector<float> scores(N);
            std::vector<const float*> kr(N), vr(N);
            for (size_t item = lo; item < hi; ++item) {
                const size_t t = item / n_head_, hh = item % n_head_;
                const std::vector<uint32_t>& seen = full ? everyone : windows[window_of[t]];
                for (size_t j = 0; j < seen.size(); ++j) {
                    kr[j] = &k[size_t(seen[j]) * W + hh * hd];
                    vr[j] = &v[size_t(seen[j]) * W + hh * hd];
                }
                attend_rows(&q[t * W + hh * hd], kr.data(), vr.data(), seen.size(), hd, scale, nullptr, scores.data(),
                            &att[t * W + hh * hd]);
            }
        });
        apply(pool_, b.attn.o, att.data(), N, h.data());
        for (size_t i = 0; i < N * W; ++i) x[i] += h[i];
        for (size_t t = 0; t < N; ++t) rms_norm(&x[t * W], b.ln2.data(), eps_, W, &h[t * W]);
        apply(pool_, b.gate, h.data(), N, g.data());
        apply(pool_, b.up, h.data(), N, u.data());
        for (size_t i = 0; i < N * F; ++i) g[i] = silu(g[i]) * u[i];
        apply(pool_, b.down, g.data(), N, h.data());
        for (size_t i = 0; i < N * W; ++i) x[i] += h[i];
    }
    // The merger: each patch normed, a square's four read as one row of 4W.
    for (size_t t = 0; t < N; ++t) rms_norm(&x[t * W], post_ln_.data(), eps_, W, &h[t * W]);
    const size_t M = N / 4, W4 = 4 * W;
    std::vector<float> mid(M * W4);
    matmul(pool_, mm0_, 0, W4, h.data(), M, W4, mid.data(), W4, mm0_b_.data());
    for (float& a : mid) a = 0.5f * a * (1.0f + std::erf(a * float(M_SQRT1_2)));  // nn.GELU(): erf, not tanh
    matmul(pool_, mm2_, 0, info_.n_embd, mid.data(), M, W4, out, info_.n_embd, mm2_b_.data());
}

}  // namespace cpuref
