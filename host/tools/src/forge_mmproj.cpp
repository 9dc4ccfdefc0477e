// A Gemma 3 multimodal projector ("mmproj") at toy size, in the layout
// llama.cpp's convert_hf_to_gguf.py --mmproj writes (clip.* keys, v.* and
// mm.* tensors, the soft-embedding norm stored as 1 + w): 64x64 pixels in
// 8x8 patches, two SigLIP layers of width 64, pooled 2x2 into 16 tokens.
// Seeded weights of the forge's scale, so an image moves the logits.
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "eh/model/gguf_writer.hpp"
#include "eh/tools/forge.hpp"

namespace eh::tools {

void write_gemma3_mmproj(const std::string& path, uint32_t text_embd, uint64_t seed) {
    using model::GgufValue;
    constexpr uint32_t kImage = 64, kPatch = 8, kWidth = 64, kFf = 128, kLayers = 2, kHeads = 4, kMerge = 2;
    const uint64_t grid = kImage / kPatch, N = grid * grid, W = kWidth;
    model::GgufWriter w;
    w.set("general.architecture", GgufValue::string("clip"));
    w.set("general.type", GgufValue::string("mmproj"));
    w.set("general.name", GgufValue::string("Tiny Gemma 3 vision (forged)"));
    w.set("general.file_type", GgufValue::u32(0));
    w.set("clip.projector_type", GgufValue::string("gemma3"));
    w.set("clip.has_vision_encoder", GgufValue::boolean(true));
    w.set("clip.use_gelu", GgufValue::boolean(true));
    w.set("clip.vision.projection_dim", GgufValue::u32(text_embd));
    w.set("clip.vision.image_size", GgufValue::u32(kImage));
    w.set("clip.vision.patch_size", GgufValue::u32(kPatch));
    w.set("clip.vision.embedding_length", GgufValue::u32(kWidth));
    w.set("clip.vision.feed_forward_length", GgufValue::u32(kFf));
    w.set("clip.vision.block_count", GgufValue::u32(kLayers));
    w.set("clip.vision.attention.head_count", GgufValue::u32(kHeads));
    w.set("clip.vision.attention.layer_norm_epsilon", GgufValue::f32(1e-6f));
    w.set("clip.vision.projector.scale_factor", GgufValue::u32(kMerge));
    const float half[3] = {0.5f, 0.5f, 0.5f};
    w.set("clip.vision.image_mean", GgufValue::array(std::span<const float>(half, 3)));
    w.set("clip.vision.image_std", GgufValue::array(std::span<const float>(half, 3)));

    std::mt19937_64 rng(seed ^ 0x6d6d70726f6aull);
    std::vector<std::vector<float>> store;  // the writer copies nothing: keep every tensor until write()
    auto add = [&](const std::string& name, std::vector<uint64_t> dims, float scale, float offset) {
        uint64_t n = 1;
        for (uint64_t d : dims) n *= d;
        std::normal_distribution<float> d(0.0f, 1.0f);
        auto& v = store.emplace_back(n);
        for (float& x : v) x = offset + scale * d(rng);
        w.add_tensor(name, EH_TYPE_F32, std::move(dims), v.data());
    };
    store.reserve(64);
    const float s = 1.0f / std::sqrt(float(W));
    add("v.patch_embd.weight", {kPatch, kPatch, 3, W}, 1.0f / std::sqrt(3.0f * kPatch * kPatch), 0.0f);
    add("v.patch_embd.bias", {W}, 0.02f, 0.0f);
    add("v.position_embd.weight", {W, N}, 0.5f, 0.0f);
    for (uint32_t i = 0; i < kLayers; ++i) {
        const std::string b = fmt::format("v.blk.{}.", i);
        for (const char* n : {"ln1", "ln2"}) {
            add(b + n + ".weight", {W}, 0.02f, 1.0f);
            add(b + n + ".bias", {W}, 0.02f, 0.0f);
        }
        for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_out"}) {
            add(b + n + ".weight", {W, W}, s, 0.0f);
            add(b + n + ".bias", {W}, 0.02f, 0.0f);
        }
        add(b + "ffn_up.weight", {W, kFf}, s, 0.0f);
        add(b + "ffn_up.bias", {kFf}, 0.02f, 0.0f);
        add(b + "ffn_down.weight", {kFf, W}, 1.0f / std::sqrt(float(kFf)), 0.0f);
        add(b + "ffn_down.bias", {W}, 0.02f, 0.0f);
    }
    add("v.post_ln.weight", {W}, 0.02f, 1.0f);
    add("v.post_ln.bias", {W}, 0.02f, 0.0f);
    add("mm.soft_emb_norm.weight", {W}, 0.02f, 1.0f);  // 1 + w, as the converter stores it
    add("mm.input_projection.weight", {text_embd, W}, s, 0.0f);
    w.write(path);
}

}  // namespace eh::tools
