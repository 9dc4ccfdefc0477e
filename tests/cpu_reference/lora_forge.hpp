// A forged LoRA adapter for a GGUF model, in llama.cpp's GGUF LoRA format
// (general.type "adapter", adapter.type "lora", adapter.lora.alpha,
// "<W>.lora_a" {n_in, r} / "<W>.lora_b" {r, n_out}), written with the
// project's GGUF writer; and the independent answer to check it by: the base
// model's view with every adapted weight replaced by W + s * B A (merged
// weights), to be run without any adapter.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <engine_host/quant_blocks.hpp>

#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"

namespace lora_forge {

struct Target {
    std::string name;                 // a base weight, e.g. "blk.0.attn_q.weight"
    uint32_t rank = 4;
    uint32_t type = EH_TYPE_F32;      // of lora_a and lora_b
};

struct Pair {
    std::string name;
    uint64_t n_in = 0, n_out = 0, rank = 0;
    uint32_t type = EH_TYPE_F32;
    std::vector<float> a, b;           // as stored (after rounding to `type`): a[r][n_in], b[n_out][r]
    std::vector<uint8_t> a_bytes, b_bytes;
};

struct Adapter {
    std::string architecture;
    float alpha = 0;
    std::vector<Pair> pairs;

    // The effective scale of pair p at a user scale.
    float scale(const Pair& p, float user) const { return alpha > 0 ? user * alpha / float(p.rank) : user; }

    std::vector<uint8_t> gguf() const {
        eh::model::GgufWriter w;
        w.set("general.architecture", eh::model::GgufValue::string(architecture));
        w.set("general.type", eh::model::GgufValue::string("adapter"));
        w.set("adapter.type", eh::model::GgufValue::string("lora"));
        w.set("adapter.lora.alpha", eh::model::GgufValue::f32(alpha));
        for (const Pair& p : pairs) {
            w.add_tensor(p.name + ".lora_a", p.type, {p.n_in, p.rank}, p.a_bytes.data());
            w.add_tensor(p.name + ".lora_b", p.type, {p.rank, p.n_out}, p.b_bytes.data());
        }
        return w.to_bytes();
    }
};

inline std::vector<uint8_t> encode(uint32_t type, std::vector<float>& values, uint64_t row) {
    std::vector<uint8_t> bytes(ehp::quant::row_bytes(type, row) * (values.size() / row));
    const uint64_t rb = ehp::quant::row_bytes(type, row);
    for (size_t r = 0; r < values.size() / row; ++r) {
        if (!ehp::quant::quantize_row(type, &values[r * row], &bytes[r * rb], row)) throw std::runtime_error("quantize");
        ehp::quant::dequantize_row(type, &bytes[r * rb], &values[r * row], row);  // what the engine will read
    }
    return bytes;
}

// Random pairs for `targets` of `base` (weights in [-amp, amp]).
inline Adapter forge(const eh::model::ModelFile& base, const std::vector<Target>& targets, float alpha, uint32_t seed,
                     float amp = 0.3f) {
    Adapter ad;
    ad.architecture = std::string(base.architecture());
    ad.alpha = alpha;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-amp, amp);
    for (const Target& t : targets) {
        const eh_tensor* w = base.find_tensor(t.name);
        if (!w) throw std::runtime_error("no tensor " + t.name);
        Pair p;
        p.name = t.name;
        p.n_in = w->dims[0];
        p.n_out = w->dims[1];
        p.rank = t.rank;
        p.type = t.type;
        p.a.resize(p.rank * p.n_in);
        p.b.resize(p.n_out * p.rank);
        for (float& x : p.a) x = u(rng);
        for (float& x : p.b) x = u(rng);
        p.a_bytes = encode(t.type, p.a, p.n_in);
        p.b_bytes = encode(t.type, p.b, p.rank);
        ad.pairs.push_back(std::move(p));
    }
    return ad;
}

// The base model's view with W' = W + s * B A for each pair, at `scale`.
// F32 base weights only. Keeps the merged data alive as long as it lives.
struct MergedView {
    eh_model_view view{};
    std::vector<eh_tensor> tensors;
    std::vector<std::vector<float>> data;

    MergedView(const eh::model::ModelFile& base, const Adapter& ad, float user_scale) {
        view = base.view();
        tensors.assign(view.tensors, view.tensors + view.n_tensors);
        for (const Pair& p : ad.pairs) {
            eh_tensor* t = nullptr;
            for (eh_tensor& x : tensors)
                if (eh::model::to_sv(x.name) == p.name) t = &x;
            if (!t || t->type != EH_TYPE_F32) throw std::runtime_error("merge needs an F32 " + p.name);
            std::vector<float> w(p.n_in * p.n_out);
            std::memcpy(w.data(), t->data, w.size() * sizeof(float));
            const float s = ad.scale(p, user_scale);
            for (uint64_t o = 0; o < p.n_out; ++o)
                for (uint64_t i = 0; i < p.n_in; ++i) {
                    double acc = 0;
                    for (uint64_t r = 0; r < p.rank; ++r) acc += double(p.b[o * p.rank + r]) * p.a[r * p.n_in + i];
                    w[o * p.n_in + i] += float(s * acc);
                }
            data.push_back(std::move(w));
            t->data = data.back().data();
        }
        view.tensors = tensors.data();
    }
    MergedView(const MergedView&) = delete;
    MergedView& operator=(const MergedView&) = delete;
};

}  // namespace lora_forge
