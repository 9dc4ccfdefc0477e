// What the image tests run on both plugins: a model with its image encoder
// loaded (ABI 1.6's image group), an mmproj view with its matrices stored
// F16 (the real mmproj files' type), and test pixels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <engine_host/quant_blocks.hpp>

#include "pool_shape.hpp"
#include "step_seq.hpp"

namespace ehtest {

// `src` with every matrix (2-D tensor and up) stored F16.
struct HalfView {
    std::vector<eh_tensor> tensors;
    std::vector<std::vector<uint8_t>> data;
    eh_model_view view{};
    explicit HalfView(const eh_model_view& src) : tensors(src.tensors, src.tensors + src.n_tensors), view(src) {
        for (eh_tensor& t : tensors) {
            if (t.n_dims < 2 || t.type != EH_TYPE_F32) continue;
            uint64_t n = 1;
            for (uint32_t d = 0; d < t.n_dims; ++d) n *= t.dims[d];
            std::vector<uint8_t>& b = data.emplace_back(ehp::quant::row_bytes(EH_TYPE_F16, n));
            ehp::quant::quantize_row(EH_TYPE_F16, static_cast<const float*>(t.data), b.data(), n);
            t.type = EH_TYPE_F16;
            t.data = b.data();
            t.nbytes = b.size();
        }
        view.tensors = tensors.data();
    }
};

// The model `view` through `api` with kv_init done (`seqs` sequences of up
// to 256 tokens in a 64 MiB pool), its encoder loaded from `mmproj` when
// given.
struct EncoderModel : StepModel {
    eh_image_encoder_info info{};
    eh_status enc_status = EH_OK;
    EncoderModel(const eh_plugin_api* a, const eh_model_view* view, const eh_model_view* mmproj, uint32_t seqs)
        : StepModel(a, view, shape(seqs)) {
        EXPECT_TRUE(ok()) << failure;
        info.struct_size = sizeof info;
        if (ok() && mmproj) enc_status = api->image_encoder_load(model, mmproj, &info);
    }
    static KvShape shape(uint32_t seqs) { return pool_shape(seqs, 256); }
};

// A w x h RGB image of values in [-1, 1), one for each seed.
inline std::vector<float> pixels(uint32_t w, uint32_t h, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> px(3 * size_t(w) * h);
    for (float& x : px) x = d(rng);
    return px;
}

// A bench's image prompt: n tokens (ids 1000 on) in one step on a new
// sequence of m, with `image` (its rows and span) and as text alone, six
// times in turn; the median time in ms of each over the last five (the
// first warms up): {with the image, as text}.
inline std::pair<double, double> image_prompt_ms(StepModel& m, uint32_t n, const eh_embd_span& image) {
    std::vector<int32_t> toks(n);
    for (uint32_t i = 0; i < n; ++i) toks[i] = int32_t(1000 + i);
    auto prefill = [&](bool with_image) {
        eh_seq* s = m.create();
        if (with_image) {
            EXPECT_EQ(m.api->seq_embd_spans(s, &image, 1), EH_OK) << m.error();
        }
        eh_step_entry e = step_entry(s, toks.data(), n);
        const auto a = std::chrono::steady_clock::now();
        EXPECT_EQ(m.api->step(m.model, &e, 1), EH_OK) << m.error();
        const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
        m.release(s);
        return t;
    };
    std::vector<double> with, without;
    for (int i = 0; i < 6; ++i) {
        with.push_back(prefill(true));
        without.push_back(prefill(false));
    }
    std::sort(with.begin() + 1, with.end());
    std::sort(without.begin() + 1, without.end());
    return {with[3], without[3]};
}

}  // namespace ehtest
