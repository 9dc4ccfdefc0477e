// Multimodal projectors ("mmproj") at toy size, in the layout llama.cpp's
// convert_hf_to_gguf.py --mmproj writes (clip.* keys, v.* and mm.* tensors).
// Gemma 3: the soft-embedding norm stored as 1 + w; 64x64 pixels in 8x8
// patches, two SigLIP layers of width 64, pooled 2x2 into 16 tokens.
// Qwen2.5-VL: Qwen's own 14-pixel patches and 28-pixel tiles (any image
// size, as the real tower), the two temporal kernels, two blocks of width 32
// (the second attends over the whole image), the 2x2 merger.
// Gemma 3 at real size (4B, 12B, 27B share it): SigLIP-So400m at 896
// pixels, patches of 14, 27 layers of width 1152, pooled 4x4 into 256
// tokens, its matrices F16 as llama.cpp's converter writes mmproj-model-f16,
// for measuring an encoder, not for its numbers; Qwen2.5-VL 7B's tower
// likewise (width 1280, 32 blocks, full attention every 8th, F16).
// Seeded weights of the forge's scale, so an image moves the logits.
#include <cmath>
#include <deque>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <engine_host/quant_blocks.hpp>

#include "eh/model/gguf_writer.hpp"
#include "eh/tools/forge.hpp"

namespace eh::tools {
namespace {

// What every toy tower shares: the clip.* keys of its shape, and seeded
// normal F32 tensors that outlive the writer's copy-free add_tensor until
// write().
class ToyTower {
public:
    struct Shape {
        const char* name;       // general.name
        const char* projector;  // clip.projector_type
        uint32_t text_embd, image_size, patch, width, ff, blocks, heads;
        const float* mean;      // 3 each
        const float* std;
    };
    ToyTower(const Shape& s, uint64_t seed) : rng_(seed) {
        using model::GgufValue;
        w_.set("general.architecture", GgufValue::string("clip"));
        w_.set("general.type", GgufValue::string("mmproj"));
        w_.set("general.name", GgufValue::string(s.name));
        w_.set("general.file_type", GgufValue::u32(0));
        w_.set("clip.projector_type", GgufValue::string(s.projector));
        w_.set("clip.has_vision_encoder", GgufValue::boolean(true));
        w_.set("clip.vision.projection_dim", GgufValue::u32(s.text_embd));
        w_.set("clip.vision.image_size", GgufValue::u32(s.image_size));
        w_.set("clip.vision.patch_size", GgufValue::u32(s.patch));
        w_.set("clip.vision.embedding_length", GgufValue::u32(s.width));
        w_.set("clip.vision.feed_forward_length", GgufValue::u32(s.ff));
        w_.set("clip.vision.block_count", GgufValue::u32(s.blocks));
        w_.set("clip.vision.attention.head_count", GgufValue::u32(s.heads));
        w_.set("clip.vision.attention.layer_norm_epsilon", GgufValue::f32(1e-6f));
        w_.set("clip.vision.image_mean", GgufValue::array(std::span<const float>(s.mean, 3)));
        w_.set("clip.vision.image_std", GgufValue::array(std::span<const float>(s.std, 3)));
        store_.reserve(64);
    }
    model::GgufWriter& writer() { return w_; }
    // offset + scale * N(0, 1) in every element.
    void add(const std::string& name, std::vector<uint64_t> dims, float scale, float offset) {
        uint64_t n = 1;
        for (uint64_t d : dims) n *= d;
        std::normal_distribution<float> d(0.0f, 1.0f);
        auto& v = store_.emplace_back(n);
        for (float& x : v) x = offset + scale * d(rng_);
        w_.add_tensor(name, EH_TYPE_F32, std::move(dims), v.data());
    }
    // The same, stored F16.
    void add_half(const std::string& name, std::vector<uint64_t> dims, float scale, float offset) {
        uint64_t n = 1;
        for (uint64_t d : dims) n *= d;
        std::normal_distribution<float> d(0.0f, 1.0f);
        auto& v = half_.emplace_back(n);
        for (uint16_t& x : v) x = ehp::quant::fp32_to_fp16(offset + scale * d(rng_));
        w_.add_tensor(name, EH_TYPE_F16, std::move(dims), v.data());
    }
    void write(const std::string& path) { w_.write(path); }

private:
    model::GgufWriter w_;
    std::mt19937_64 rng_;
    std::vector<std::vector<float>> store_;
    std::deque<std::vector<uint16_t>> half_;  // (a deque: the writer keeps pointers into each)
};

}  // namespace

void write_gemma3_tower(const std::string& path, uint32_t text_embd, uint64_t seed, const Gemma3Tower& g) {
    using model::GgufValue;
    const uint64_t grid = g.image / g.patch, N = grid * grid, W = g.width, F = g.ff, p = g.patch;
    const float half[3] = {0.5f, 0.5f, 0.5f};
    ToyTower t({g.name, "gemma3", text_embd, g.image, g.patch, g.width, g.ff, g.layers, g.heads, half, half},
               seed ^ 0x6d6d70726f6aull);
    t.writer().set("clip.use_gelu", GgufValue::boolean(true));
    // (no key: Gemma 3's pooling of 4, as the converter writes it)
    if (g.merge) t.writer().set("clip.vision.projector.scale_factor", GgufValue::u32(g.merge));
    // A matrix F16 when the tower's are, else F32; vectors (and the position
    // embeddings) F32 always.
    auto mat = [&](const std::string& name, std::vector<uint64_t> dims, float scale) {
        if (g.f16) t.add_half(name, std::move(dims), scale, 0.0f);
        else t.add(name, std::move(dims), scale, 0.0f);
    };
    const float s = 1.0f / std::sqrt(float(W));
    mat("v.patch_embd.weight", {p, p, 3, W}, 1.0f / std::sqrt(3.0f * float(p * p)));
    t.add("v.patch_embd.bias", {W}, 0.02f, 0.0f);
    // (F32 whatever the matrices are, as the converter writes V_ENC_EMBD_POS:
    // llama.cpp adds it to F32 activations and takes no F16 there)
    t.add("v.position_embd.weight", {W, N}, 0.5f, 0.0f);
    for (uint32_t i = 0; i < g.layers; ++i) {
        const std::string b = fmt::format("v.blk.{}.", i);
        for (const char* n : {"ln1", "ln2"}) {
            t.add(b + n + ".weight", {W}, 0.02f, 1.0f);
            t.add(b + n + ".bias", {W}, 0.02f, 0.0f);
        }
        for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_out"}) {
            mat(b + n + ".weight", {W, W}, s);
            t.add(b + n + ".bias", {W}, 0.02f, 0.0f);
        }
        mat(b + "ffn_up.weight", {W, F}, s);
        t.add(b + "ffn_up.bias", {F}, 0.02f, 0.0f);
        mat(b + "ffn_down.weight", {F, W}, 1.0f / std::sqrt(float(F)));
        t.add(b + "ffn_down.bias", {W}, 0.02f, 0.0f);
    }
    t.add("v.post_ln.weight", {W}, 0.02f, 1.0f);
    t.add("v.post_ln.bias", {W}, 0.02f, 0.0f);
    t.add("mm.soft_emb_norm.weight", {W}, 0.02f, 1.0f);  // 1 + w, as the converter stores it
    mat("mm.input_projection.weight", {text_embd, W}, s);
    t.write(path);
}

void write_gemma3_mmproj(const std::string& path, uint32_t text_embd, uint64_t seed) {
    write_gemma3_tower(path, text_embd, seed, {"Tiny Gemma 3 vision (forged)", 64, 8, 64, 128, 2, 4, 2, false});
}

void write_gemma3_siglip_mmproj(const std::string& path, uint32_t text_embd, uint64_t seed) {
    write_gemma3_tower(path, text_embd, seed,
                       {"Gemma 3 vision, SigLIP-So400m shape (forged)", 896, 14, 1152, 4304, 27, 16, 0, true});
}

void write_qwen25vl_tower(const std::string& path, uint32_t text_embd, uint64_t seed, const QwenVlTower& q) {
    using model::GgufValue;
    const uint64_t W = q.width, F = q.ff, W4 = 4 * W, p = q.patch;
    const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f}, sd[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    // image_size: the converter's default, a nominal size (images are read at their own)
    ToyTower t({q.name, "qwen2.5vl_merger", text_embd, 560, q.patch, q.width, q.ff, q.layers, q.heads, mean, sd},
               seed ^ 0x7177656e766cull);
    t.writer().set("clip.use_silu", GgufValue::boolean(true));
    t.writer().set("clip.vision.n_wa_pattern", GgufValue::u32(q.wa_pattern));
    // A matrix F16 when the tower's are, else F32; vectors F32 always.
    auto mat = [&](const std::string& name, std::vector<uint64_t> dims, float scale) {
        if (q.f16) t.add_half(name, std::move(dims), scale, 0.0f);
        else t.add(name, std::move(dims), scale, 0.0f);
    };
    const float s = 1.0f / std::sqrt(float(W)), sp = 1.0f / std::sqrt(2.0f * 3.0f * float(p * p));
    mat("v.patch_embd.weight", {p, p, 3, W}, sp);
    mat("v.patch_embd.weight.1", {p, p, 3, W}, sp);
    for (uint32_t i = 0; i < q.layers; ++i) {
        const std::string b = fmt::format("v.blk.{}.", i);
        t.add(b + "ln1.weight", {W}, 0.02f, 1.0f);
        t.add(b + "ln2.weight", {W}, 0.02f, 1.0f);
        for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_out"}) {
            mat(b + n + ".weight", {W, W}, s);
            t.add(b + n + ".bias", {W}, 0.02f, 0.0f);
        }
        for (const char* n : {"ffn_gate", "ffn_up"}) {
            mat(b + n + ".weight", {W, F}, s);
            t.add(b + n + ".bias", {F}, 0.02f, 0.0f);
        }
        mat(b + "ffn_down.weight", {F, W}, 1.0f / std::sqrt(float(F)));
        t.add(b + "ffn_down.bias", {W}, 0.02f, 0.0f);
    }
    t.add("v.post_ln.weight", {W}, 0.02f, 1.0f);
    mat("mm.0.weight", {W4, W4}, 1.0f / std::sqrt(float(W4)));
    t.add("mm.0.bias", {W4}, 0.02f, 0.0f);
    mat("mm.2.weight", {W4, text_embd}, 1.0f / std::sqrt(float(W4)));
    t.add("mm.2.bias", {text_embd}, 0.02f, 0.0f);
    t.write(path);
}

void write_qwen25vl_mmproj(const std::string& path, uint32_t text_embd, uint64_t seed) {
    write_qwen25vl_tower(path, text_embd, seed, {"Tiny Qwen2.5-VL vision (forged)", 14, 32, 64, 2, 2, 2, false});
}

}  // namespace eh::tools
