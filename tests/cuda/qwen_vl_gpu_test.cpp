// Qwen2.5-VL (qwen2vl) on llama-cuda against the CPU reference, which is
// checked against transformers (tests/cpu_reference/qwen_vl_test.cpp,
// tests/reference/vision_conformance_qwen.py), on the forged
// tiny-qwen2.5-vl-q4_k_m and its toy mmproj:
//   - text alone: teacher-forced logits (the prompt in one step, then a
//     token a step) within the tolerances of the Gemma image test (an FP16
//     KV pool against FP32): M-RoPE with equal components is qwen2's NEOX;
//   - an image on its grid (EH_SPAN_GRID, 3 rows x 4 columns of tiles, the
//     CPU reference's rows): the logits after it and the greedy tokens
//     decoded after it, through the decode graphs (their shift launch reads
//     the step's shifts); the same run with the span on one axis (no GRID)
//     moves the logits by well more than the agreement (control: the toy's
//     M-RoPE is a small effect, 1.0e-3 in the top token's log-probability
//     and 2.7e-3 of the largest logit between cpu-reference's two runs,
//     against the GPU's 7.9e-5 and 3.9e-4 agreement on the H200);
//   - forks inside and after the image, truncations into and before it
//     (then the image fed again), a parked and unparked copy, and a step
//     that mixes an image chunk with another sequence's decode after its
//     own image: each the CPU reference's logits for the same calls;
//   - the tower on the GPU (image_encode_sized): its rows against the CPU
//     reference's for images of several grids (windows cut by the edges,
//     full-attention blocks), F32 and with every matrix F16;
//   - QwenVlGpuBench (EH_QWEN_VL_BENCH=1): the same at the 7B's tower shape,
//     and its encode time for a 1,024-tile image.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <engine_host/quant_blocks.hpp>
#include <eh/model/model_file.hpp>
#include <eh/tools/forge.hpp>

#include "forged_profile.hpp"
#include "image_model.hpp"
#include "logit_compare.hpp"
#include "plugin_pair.hpp"
#include "step_seq.hpp"

namespace {

const eh_plugin_api* gpu_api() { return ehtest::llama_cuda_api(); }
const eh_plugin_api* cpu_api() { return ehtest::cpu_reference_api(); }

#define REQUIRE_BOTH() REQUIRE_PLUGIN_PAIR(gpu_api(), "llama-cuda plugin not loadable")

// The tiny Qwen2.5-VL profile and its mmproj, forged once per process.
struct Forged : ehtest::ForgedWithProjector {
    Forged() : ForgedWithProjector("qwen_vl_gpu_test", "tiny-qwen2.5-vl-q4_k_m", 7) {}
};
Forged& forged() {
    static Forged f;
    return f;
}

using ehtest::HalfView;

// The model through `api`, its encoder loaded from `mmproj` when given.
struct Loaded : ehtest::EncoderModel {
    explicit Loaded(const eh_plugin_api* a, const eh_model_view* mmproj = nullptr, uint32_t seqs = 4)
        : EncoderModel(a, &forged().model->view(), mmproj, seqs) {}
    std::vector<float> encode(const std::vector<float>& px, uint32_t w, uint32_t h) {
        std::vector<float> rows(size_t(w / info.tile) * (h / info.tile) * info.n_embd);
        EXPECT_NE(api->image_encode_sized, nullptr);
        if (api->image_encode_sized) {
            EXPECT_EQ(api->image_encode_sized(model, px.data(), w, h, rows.data()), EH_OK) << error();
        }
        return rows;
    }
    void step(eh_step_entry* e, uint32_t n = 1) { EXPECT_EQ(api->step(model, e, n), EH_OK) << error(); }
    // tokens[0..n) into s (with its spans), the logits after them.
    std::vector<float> feed(eh_seq* s, const int32_t* tokens, uint32_t n, const eh_embd_span* spans = nullptr,
                            uint32_t n_spans = 0) {
        if (n_spans) {
            EXPECT_EQ(api->seq_embd_spans(s, spans, n_spans), EH_OK) << error();
        }
        eh_step_entry e = ehtest::step_entry(s, tokens, n);
        step(&e);
        return logits(s);
    }
};

using ehtest::pixels;

// An empty row is a failure too (1e9).
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    return a.empty() ? 1e9 : ehtest::rel_err(a, b);
}
using ehtest::argmax;
// The GPU's pick is the reference's best or within 1e-2 of the largest
// |logit| of it (a near tie may go either way under FP16 keys and values).
bool top1_ok(const std::vector<float>& got, const std::vector<float>& ref) { return ehtest::top1_ok(got, ref, 1e-2); }
using ehtest::agree;
using ehtest::Agreement;
uint32_t vocab_of(Loaded& l) { return ehtest::vocab_size(l); }

// The image: 4 x 3 tiles (112 x 84 pixels), 12 positions on its grid.
constexpr uint32_t kImgW = 112, kImgH = 84, kGridW = 4, kImgTokens = 12;
constexpr int32_t kImageToken = 7;  // any id: the rows replace its embedding
constexpr uint32_t kImageAt = 10;   // the image's first position in the prompt
constexpr size_t kPrompt = 60, kTotal = 90;

std::vector<int32_t> prompt_tokens(uint32_t vocab, bool image) {
    std::vector<int32_t> t = ehtest::tokens_of(kTotal, 1, vocab);
    if (image)
        for (uint32_t k = 0; k < kImgTokens; ++k) t[kImageAt + k] = kImageToken;
    return t;
}

// The CPU reference's rows for the test image.
const std::vector<float>& image_rows() {
    static const std::vector<float> rows = [] {
        Loaded cpu(cpu_api(), &forged().mmproj->view());
        EXPECT_EQ(cpu.enc_status, EH_OK) << cpu.error();
        EXPECT_EQ(cpu.info.tile, 28u);
        return cpu.encode(pixels(kImgW, kImgH, 11), kImgW, kImgH);
    }();
    return rows;
}

// Teacher-forced: the prompt in one step (with the image's span when
// rows), then one token a step, each step sampling greedily; the logits
// after each fed position from kPrompt - 1 on, and the tokens sampled.
struct Forced {
    std::vector<std::vector<float>> logits;
    std::vector<int32_t> sampled;
};
Forced run(Loaded& l, const std::vector<int32_t>& toks, const float* rows, uint32_t flags) {
    eh_seq* s = l.create();
    Forced out;
    if (rows) {
        const eh_embd_span sp{kImageAt, kImgTokens, flags, (flags & EH_SPAN_GRID) ? kGridW : 0, rows};
        EXPECT_EQ(l.api->seq_embd_spans(s, &sp, 1), EH_OK) << l.error();
    }
    eh_step_entry e = ehtest::step_entry(s, toks.data(), uint32_t(kPrompt));
    l.step(&e);
    out.logits.push_back(l.logits(s));
    out.sampled.push_back(e.token);
    for (size_t p = kPrompt; p < toks.size(); ++p) {
        eh_step_entry d = ehtest::step_entry(s, toks.data() + p, 1);
        l.step(&d);
        out.logits.push_back(l.logits(s));
        out.sampled.push_back(d.token);
    }
    l.release(s);
    return out;
}

void expect_close(const char* what, const Agreement& a) {
    std::printf("[qwen-vl-gpu] %s, %zu positions: top-1 %zu, max rel %.3g, max |dlogprob| %.3g\n", what, a.n, a.top1,
                a.max_rel, a.max_dlp);
    EXPECT_EQ(a.top1, a.n) << what;
    EXPECT_LT(a.max_rel, 1e-2) << what;
    EXPECT_LT(a.max_dlp, 0.05) << what;
}

TEST(QwenVlGpu, TextAloneMatchesTheCpuReference) {
    REQUIRE_BOTH();
    Loaded gpu(gpu_api()), cpu(cpu_api());
    ASSERT_TRUE(gpu.ok() && cpu.ok());
    const std::vector<int32_t> toks = prompt_tokens(vocab_of(cpu), false);
    const Forced ref = run(cpu, toks, nullptr, 0), got = run(gpu, toks, nullptr, 0);
    const Agreement a = agree(got.logits, ref.logits);
    ASSERT_EQ(a.n, kTotal - kPrompt + 1);
    expect_close("text alone", a);
}

TEST(QwenVlGpu, AnImageOnItsGridMatchesTheCpuReference) {
    REQUIRE_BOTH();
    Loaded gpu(gpu_api()), cpu(cpu_api());
    ASSERT_TRUE(gpu.ok() && cpu.ok());
    const std::vector<float>& rows = image_rows();
    ASSERT_TRUE(!rows.empty() && rows.size() % kImgTokens == 0);
    const std::vector<int32_t> toks = prompt_tokens(vocab_of(cpu), true);
    const Forced ref = run(cpu, toks, rows.data(), EH_SPAN_GRID);
    const Forced got = run(gpu, toks, rows.data(), EH_SPAN_GRID);
    const Agreement a = agree(got.logits, ref.logits);
    ASSERT_EQ(a.n, kTotal - kPrompt + 1);
    expect_close("an image on its grid", a);
    // The greedy tokens drawn after the image (each step's own pick): the
    // reference's, or (a near tie, top1_ok) the GPU's own best.
    size_t same = 0, ties = 0;
    ASSERT_EQ(got.sampled.size(), ref.sampled.size());
    for (size_t i = 0; i < ref.sampled.size(); ++i) {
        if (ref.sampled[i] == got.sampled[i]) ++same;
        else if (top1_ok(got.logits[i], ref.logits[i]) && size_t(got.sampled[i]) == argmax(got.logits[i])) ++ties;
    }
    std::printf("[qwen-vl-gpu] greedy tokens after the image: %zu of %zu the same, %zu near ties\n", same,
                ref.sampled.size(), ties);
    EXPECT_EQ(same + ties, ref.sampled.size());
    EXPECT_GE(same, ref.sampled.size() - 2);
    // Control: the image's positions on one axis (no grid) moves the logits
    // by more than the agreement.
    const Agreement flat = agree(run(gpu, toks, rows.data(), 0).logits, ref.logits);
    std::printf("[qwen-vl-gpu] control, the image on one axis: max rel %.3g, max |dlogprob| %.3g\n", flat.max_rel,
                flat.max_dlp);
    EXPECT_GT(flat.max_dlp, 8 * a.max_dlp);
    EXPECT_GT(flat.max_rel, 4 * a.max_rel);
}

// The same calls on both plugins after the image's prompt: forks, cuts,
// a park, a mixed step; each call's logits compared.
TEST(QwenVlGpu, ForksTruncationsAndParkingAcrossTheImageMatchTheCpuReference) {
    REQUIRE_BOTH();
    Loaded gpu(gpu_api()), cpu(cpu_api());
    ASSERT_TRUE(gpu.ok() && cpu.ok());
    const std::vector<float>& rows = image_rows();
    const size_t E = rows.size() / kImgTokens;
    const std::vector<int32_t> toks = prompt_tokens(vocab_of(cpu), true);
    auto both = [&](const std::string& what, auto&& fn) {
        const std::vector<float> r = fn(cpu), g = fn(gpu);
        const double e = rel_err(g, r);
        std::printf("[qwen-vl-gpu] %s: rel %.3g, top-1 %s\n", what.c_str(), e, top1_ok(g, r) ? "same" : "DIFFERS");
        EXPECT_LT(e, 1e-2) << what;
        EXPECT_TRUE(top1_ok(g, r)) << what;
    };
    const eh_embd_span image{kImageAt, kImgTokens, EH_SPAN_GRID, kGridW, rows.data()};
    // (each plugin's own sequences, made by the same calls)
    std::map<Loaded*, eh_seq*> main;
    for (Loaded* l : {&cpu, &gpu}) {
        main[l] = l->create();
        l->feed(main[l], toks.data(), uint32_t(kPrompt), &image, 1);
    }
    both("a fork inside the image, the prompt's rest as text", [&](Loaded& l) {
        const uint32_t cut = kImageAt + 5;
        eh_seq* f = l.fork(main[&l], cut);
        std::vector<float> out = l.feed(f, toks.data() + cut, uint32_t(kPrompt - cut));
        l.release(f);
        return out;
    });
    both("a fork inside the image, the image's rest as a grid of its own", [&](Loaded& l) {
        // (rows 2.. of the image as a span of their own: placed on their
        // own grid from the fork's next text position)
        const uint32_t cut = kImageAt + 8;  // rows 0 and 1 in
        eh_seq* f = l.fork(main[&l], cut);
        const eh_embd_span rest{0, kImgTokens - 8, EH_SPAN_GRID, kGridW, rows.data() + 8 * E};
        std::vector<float> out = l.feed(f, toks.data() + cut, uint32_t(kPrompt - cut), &rest, 1);
        l.release(f);
        return out;
    });
    both("a fork after the image, five decode steps", [&](Loaded& l) {
        eh_seq* f = l.fork(main[&l], uint32_t(kPrompt));
        std::vector<float> out;
        for (size_t p = kPrompt; p < kPrompt + 5; ++p) out = l.feed(f, toks.data() + p, 1);
        l.release(f);
        return out;
    });
    both("a truncation into the image, ten text tokens", [&](Loaded& l) {
        eh_seq* f = l.fork(main[&l], uint32_t(kPrompt));
        EXPECT_EQ(l.api->seq_truncate(f, kImageAt + 7), EH_OK) << l.error();
        std::vector<float> out = l.feed(f, toks.data() + kPrompt, 10);
        l.release(f);
        return out;
    });
    both("a truncation before the image, the image fed again", [&](Loaded& l) {
        eh_seq* f = l.fork(main[&l], uint32_t(kPrompt));
        const uint32_t cut = kImageAt - 2;
        EXPECT_EQ(l.api->seq_truncate(f, cut), EH_OK) << l.error();
        const eh_embd_span again{2, kImgTokens, EH_SPAN_GRID, kGridW, rows.data()};
        std::vector<float> out = l.feed(f, toks.data() + cut, uint32_t(kPrompt - cut), &again, 1);
        l.release(f);
        return out;
    });
    both("a parked copy after the image, unparked, one decode step", [&](Loaded& l) {
        eh_parked* p = nullptr;
        uint64_t bytes = 0;
        EXPECT_NE(l.api->seq_park, nullptr);
        if (!l.api->seq_park) return std::vector<float>();
        EXPECT_EQ(l.api->seq_park(main[&l], uint32_t(kPrompt), 1ull << 30, &p, &bytes), EH_OK) << l.error();
        eh_seq* u = nullptr;
        EXPECT_EQ(l.api->seq_unpark(l.model, p, toks.data(), uint32_t(kPrompt), &u), EH_OK) << l.error();
        l.api->parked_release(p);
        l.add(u);
        std::vector<float> out = l.feed(u, toks.data() + kPrompt, 1);
        l.release(u);
        return out;
    });
    both("an image chunk beside another sequence's decode after its image, one step", [&](Loaded& l) {
        eh_seq* f = l.fork(main[&l], uint32_t(kPrompt));
        eh_seq* n = l.create();
        const eh_embd_span sp{kImageAt, kImgTokens, EH_SPAN_GRID, kGridW, rows.data()};
        EXPECT_EQ(l.api->seq_embd_spans(n, &sp, 1), EH_OK) << l.error();
        eh_step_entry mix[2] = {ehtest::step_entry(f, toks.data() + kPrompt, 1),
                                ehtest::step_entry(n, toks.data(), uint32_t(kPrompt))};
        l.step(mix, 2);
        std::vector<float> out = l.logits(f), second = l.logits(n);
        out.insert(out.end(), second.begin(), second.end());
        l.release(f);
        l.release(n);
        return out;
    });
}

// The tower on the GPU against the CPU reference's rows (both FP32: they
// differ in summation order), for grids of 2 x 2 tiles (one window), 3 x 4,
// and 7 x 5 (windows of 4 x 4 tiles cut by both edges); the toy's second
// block attends over the whole image (n_wa_pattern 2). F16 matrices: the
// GPU rounds each GEMM's input to F16 (as llama.cpp does), the CPU
// reference does not.
TEST(QwenVlGpu, TowerRowsMatchTheCpuReference) {
    REQUIRE_BOTH();
    ASSERT_NE(gpu_api()->image_encode_sized, nullptr) << "llama-cuda encodes no images of their own size";
    HalfView half(forged().mmproj->view());
    for (const bool f16 : {false, true}) {
        const eh_model_view* mm = f16 ? &half.view : &forged().mmproj->view();
        Loaded gpu(gpu_api(), mm), cpu(cpu_api(), mm);
        ASSERT_EQ(gpu.enc_status, EH_OK) << gpu.error();
        ASSERT_EQ(cpu.enc_status, EH_OK) << cpu.error();
        EXPECT_EQ(gpu.info.tile, cpu.info.tile);
        EXPECT_EQ(gpu.info.n_embd, cpu.info.n_embd);
        EXPECT_EQ(gpu.info.span_flags, uint32_t(EH_SPAN_GRID));
        EXPECT_EQ(gpu.info.min_tokens, cpu.info.min_tokens);
        EXPECT_GE(gpu.info.max_tokens, cpu.info.max_tokens);
        for (int c = 0; c < 3; ++c) {
            EXPECT_EQ(gpu.info.mean[c], cpu.info.mean[c]);
            EXPECT_EQ(gpu.info.std[c], cpu.info.std[c]);
        }
        double worst = 0;
        for (const auto& [w, h] : {std::pair{56u, 56u}, std::pair{112u, 84u}, std::pair{140u, 196u}}) {
            const std::vector<float> px = pixels(w, h, w + h);
            const std::vector<float> g = gpu.encode(px, w, h), c = cpu.encode(px, w, h);
            const double e = rel_err(g, c);
            std::printf("[qwen-vl-gpu] %s tower, %ux%u px (%u tiles): max |gpu - cpu| / max |cpu| = %.3g\n",
                        f16 ? "F16" : "F32", w, h, (w / 28) * (h / 28), e);
            worst = std::max(worst, e);
        }
        EXPECT_LT(worst, f16 ? 1e-2 : 1e-4);
        // Twice the same image: the same rows, bit for bit; a size that is
        // not whole tiles is refused by name.
        const std::vector<float> px = pixels(84, 56, 3);
        EXPECT_EQ(gpu.encode(px, 84, 56), gpu.encode(px, 84, 56));
        std::vector<float> out(64 * 1024);
        EXPECT_EQ(gpu.api->image_encode_sized(gpu.model, px.data(), 80, 56, out.data()), EH_INVALID_ARGUMENT);
        EXPECT_NE(gpu.error().find("image_encode_sized"), std::string::npos) << gpu.error();
    }
}

// Qwen2.5-VL 7B's tower shape (forged, F16; its last projection to the
// tiny model's width, a negligible part of the work): the rows of an image
// of 7 x 5 tiles against cpu-reference's (the 80-dim heads' flash pass,
// windows cut by the edges, four full blocks), then the encode time of an
// 896 x 896 image (1,024 tiles, 4,096 patches), wall clock per
// image_encode_sized call (the pixels' upload and the copy back included),
// the median of 5 after one warm-up. With EH_QWEN_VL_BENCH_MODEL and
// EH_QWEN_VL_BENCH_MMPROJ (e.g. the forged qwen2.5-vl-7b-instruct-q4_k_m
// and its --mmproj-out, the files llama.cpp reads too): those instead, on
// llama-cuda only, and also a prompt of 1,024 image positions on their grid
// and 64 text tokens prefilled, against the same prompt as text. Skipped
// unless EH_QWEN_VL_BENCH is set (the forge and the CPU reference's pass
// take a while). A measurement, printed; the rows' check is asserted.
TEST(QwenVlGpuBench, SevenBTowerRowsAndEncodeTime) {
    if (!std::getenv("EH_QWEN_VL_BENCH")) GTEST_SKIP() << "set EH_QWEN_VL_BENCH=1 to run";
    REQUIRE_BOTH();
    const char* given_model = std::getenv("EH_QWEN_VL_BENCH_MODEL");
    const char* given_mmproj = std::getenv("EH_QWEN_VL_BENCH_MMPROJ");
    const bool given = given_model && given_mmproj;
    std::unique_ptr<eh::model::ModelFile> model_file, file;
    std::string path;
    if (given) {
        model_file = eh::model::ModelFile::open(given_model);
        file = eh::model::ModelFile::open(given_mmproj);
    } else {
        const uint32_t text = [] {
            Loaded cpu(cpu_api(), &forged().mmproj->view());
            return cpu.info.n_embd;
        }();
        path = (std::filesystem::temp_directory_path() /
                ("qwen_vl_7b_tower_" + std::to_string(::getpid()) + ".gguf")).string();
        const auto t0 = std::chrono::steady_clock::now();
        eh::tools::write_qwen25vl_tower(path, text, 3,
                                        {"Qwen2.5-VL 7B tower shape (forged)", 14, 1280, 3420, 32, 16, 8, true});
        file = eh::model::ModelFile::open(path);
        std::printf("[qwen-vl-bench] forged the 7B-shaped tower in %.1f s\n",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // (the given model with a KV pool for the prompt below)
    ehtest::KvShape k = Loaded::shape(2);
    if (given) {
        k.max_seq_tokens = k.max_step_tokens = 2048;
        k.budget_bytes = 2ull << 30;
    }
    struct Gpu : ehtest::StepModel {
        eh_image_encoder_info info{};
        eh_status enc = EH_OK;
        Gpu(const eh_model_view* m, const eh_model_view* mm, const ehtest::KvShape& k) : StepModel(gpu_api(), m, k) {
            info.struct_size = sizeof info;
            if (ok()) enc = api->image_encoder_load(model, mm, &info);
        }
    } gpu(given ? &model_file->view() : &forged().model->view(), &file->view(), k);
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    ASSERT_EQ(gpu.enc, EH_OK) << gpu.error();
    if (!given) {
        Loaded cpu(cpu_api(), &file->view());
        ASSERT_EQ(cpu.enc_status, EH_OK) << cpu.error();
        const std::vector<float> px = pixels(196, 140, 5);
        std::vector<float> g(35 * size_t(gpu.info.n_embd));
        ASSERT_EQ(gpu.api->image_encode_sized(gpu.model, px.data(), 196, 140, g.data()), EH_OK) << gpu.error();
        const double e = rel_err(g, cpu.encode(px, 196, 140));
        std::printf("[qwen-vl-bench] 7B-shaped F16 tower, 196x140 px (35 tiles): max |gpu - cpu| / max |cpu| = %.3g\n", e);
        EXPECT_LT(e, 1e-2);
    }
    const std::vector<float> px = pixels(896, 896, 6);
    std::vector<float> rows(size_t(1024) * gpu.info.n_embd);
    ASSERT_EQ(gpu.api->image_encode_sized(gpu.model, px.data(), 896, 896, rows.data()), EH_OK) << gpu.error();
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
        const auto a = std::chrono::steady_clock::now();
        ASSERT_EQ(gpu.api->image_encode_sized(gpu.model, px.data(), 896, 896, rows.data()), EH_OK) << gpu.error();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("[qwen-vl-bench] 7B-shaped F16 tower, 896x896 px (1,024 tiles, 4,096 patches): encode %.2f ms "
                "(median of 5; min %.2f, max %.2f)\n",
                ms[2], ms[0], ms[4]);
    for (float v : rows) ASSERT_TRUE(std::isfinite(v));
    if (given) {
        const uint32_t n = 1024 + 64;
        const auto [with, without] = ehtest::image_prompt_ms(gpu, n, eh_embd_span{32, 1024, EH_SPAN_GRID, 32, rows.data()});
        std::printf("[qwen-vl-bench] a %u-token prompt holding the 1,024-tile image on its grid: %.2f ms; as text "
                    "%.2f ms (medians of 5 after a warm-up)\n",
                    n, with, without);
    }
    if (!path.empty()) std::filesystem::remove(path);
}

}  // namespace
