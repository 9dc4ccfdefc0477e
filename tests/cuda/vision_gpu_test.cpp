// Images on llama-cuda (ABI 1.6's image group) against the CPU reference,
// which is checked against transformers (tests/reference/vision_conformance.py):
//   - Gemma 3's tower on the GPU (ehcuda::Gemma3Vision): the rows of the
//     forged tiny mmproj (F32, as the forge writes it) within 1e-4 of the
//     CPU reference's, relative to the largest |row value|: both compute in
//     FP32 and differ only in summation order (the printed figure is the
//     measured one); the same file with its matrices stored F16 (the real
//     mmproj files' type) within 1e-2: the GPU then rounds each GEMM's
//     input to F16 too, as llama.cpp does, the CPU reference does not (the
//     attention then runs the flash kernel: the toy's 16-dim heads and
//     SigLIP's 72-dim ones on a one-block tower);
//   - the step's rows and bidirectional span: an image-conditioned
//     teacher-forced run (the image inside a 100-token prompt, then one
//     token a step) with the same rows on both plugins: top-1 and
//     |delta logprob| of the reference's top token at every position, the
//     tolerances of gemma_step_test (an FP16 KV pool against FP32); the
//     same run with the span causal or without rows is far off (controls);
//   - the image chunk mixed into a step with another sequence's decode
//     tokens, and a fork inside the image (the ABI's shared prefix) give
//     the logits of the image alone;
//   - a 1-token span on a decode step whose graph was captured before is
//     not replayed without its row;
//   - bad spans are refused naming the entry and dropped; another projector
//     type is refused by name, and so is a quantized KV cache with an image's
//     bidirectional span (at the step) or with an encoder loaded (kv_init).
// VisionGpuBench times the encoder and an image's prefill on a real-shape
// file (scripts/device-vision.sh); skipped unless asked.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <engine_host/quant_blocks.hpp>
#include <eh/model/model_file.hpp>
#include <eh/tools/forge.hpp>
#include <ehcuda/device_memory.hpp>

#include "forged_profile.hpp"
#include "image_model.hpp"
#include "logit_compare.hpp"
#include "plugin_pair.hpp"
#include "step_seq.hpp"
#include "vision_ops.hpp"  // cuda-common's (src/): the flash kernels, called directly

namespace {

const eh_plugin_api* gpu_api() { return ehtest::llama_cuda_api(); }
const eh_plugin_api* cpu_api() { return ehtest::cpu_reference_api(); }

#define REQUIRE_BOTH()                                                   \
    REQUIRE_PLUGIN_PAIR(gpu_api(), "llama-cuda plugin not loadable");    \
    ASSERT_NE(gpu_api()->image_encoder_load, nullptr) << "llama-cuda takes no images"

// The tiny Gemma 3 vision profile and its mmproj, forged once per process.
struct Forged : ehtest::ForgedWithProjector {
    std::unique_ptr<eh::model::ModelFile> qwen;
    Forged() : ForgedWithProjector("vision_gpu_test", "tiny-gemma-3-vision-q4_k_m", 5) {
        const std::string q = (dir / "qwen-mmproj.gguf").string();
        eh::tools::write_qwen25vl_mmproj(q, uint32_t(text_width()), 5);
        qwen = eh::model::ModelFile::open(q);
    }
    int64_t text_width() const {
        const eh_model_view& v = model->view();
        for (uint64_t i = 0; i < v.n_metadata; ++i)
            if (std::string(v.metadata[i].key.data, v.metadata[i].key.size) == "gemma3.embedding_length")
                return int64_t(v.metadata[i].value.v.u64);
        return 0;
    }
};
Forged& forged() {
    static Forged f;
    return f;
}

using ehtest::HalfView;

// A model through `api` with its encoder loaded from `mmproj`.
struct Loaded : ehtest::EncoderModel {
    Loaded(const eh_plugin_api* a, const eh_model_view* mmproj, uint32_t seqs = 4)
        : EncoderModel(a, &forged().model->view(), mmproj, seqs) {}
    std::vector<float> encode(const std::vector<float>& px) {
        std::vector<float> rows(size_t(info.n_tokens) * info.n_embd);
        EXPECT_EQ(api->image_encode(model, px.data(), rows.data()), EH_OK) << error();
        return rows;
    }
};

std::vector<float> pixels(const eh_image_encoder_info& i, uint32_t seed) {
    return ehtest::pixels(i.image_width, i.image_height, seed);
}

using ehtest::argmax;
using ehtest::rel_err;

constexpr int32_t kImageToken = 7;  // any id: the rows replace its embedding
constexpr uint32_t kImageAt = 20;   // the image's first position in the prompt
constexpr size_t kPrompt = 100, kTotal = 130;

std::vector<int32_t> prompt_tokens(uint32_t n_image, uint32_t vocab) {
    std::vector<int32_t> t = ehtest::tokens_of(kTotal, 1, vocab);
    for (uint32_t k = 0; k < n_image; ++k) t[kImageAt + k] = kImageToken;
    return t;
}

uint32_t vocab_of(Loaded& l) { return ehtest::vocab_size(l); }

// Teacher-forced: the prompt in one step with the image's span (flags;
// rows NULL: no span), then one token a step; the logits after each fed
// position from kPrompt - 1 on.
std::vector<std::vector<float>> run(Loaded& l, const std::vector<int32_t>& toks, const float* rows, uint32_t flags) {
    eh_seq* s = l.create();
    std::vector<std::vector<float>> out;
    if (rows) {
        const eh_embd_span sp{kImageAt, l.info.n_tokens, flags, 0, rows};
        EXPECT_EQ(l.api->seq_embd_spans(s, &sp, 1), EH_OK) << l.error();
    }
    eh_step_entry e = ehtest::step_entry(s, toks.data(), uint32_t(kPrompt));
    EXPECT_EQ(l.api->step(l.model, &e, 1), EH_OK) << l.error();
    out.push_back(l.logits(s));
    for (size_t p = kPrompt; p < toks.size(); ++p) {
        eh_step_entry d = ehtest::step_entry(s, toks.data() + p, 1);
        EXPECT_EQ(l.api->step(l.model, &d, 1), EH_OK) << l.error();
        out.push_back(l.logits(s));
    }
    l.release(s);
    return out;
}

// Top-1 as gemma_step_test counts it (within 1e-2 of the largest |logit|),
// the worst rel_err and |delta logprob| of the reference's top token.
using ehtest::agree;
using ehtest::Agreement;

TEST(VisionGpu, TowerRowsMatchTheCpuReference) {
    REQUIRE_BOTH();
    Loaded gpu(gpu_api(), &forged().mmproj->view());
    Loaded cpu(cpu_api(), &forged().mmproj->view());
    ASSERT_EQ(gpu.enc_status, EH_OK) << gpu.error();
    ASSERT_EQ(cpu.enc_status, EH_OK) << cpu.error();
    EXPECT_EQ(gpu.info.image_width, cpu.info.image_width);
    EXPECT_EQ(gpu.info.image_height, cpu.info.image_height);
    EXPECT_EQ(gpu.info.n_tokens, cpu.info.n_tokens);
    EXPECT_EQ(gpu.info.n_embd, cpu.info.n_embd);
    EXPECT_EQ(gpu.info.span_flags, uint32_t(EH_SPAN_BIDIRECTIONAL));
    EXPECT_EQ(gpu.info.tile, 0u);
    for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(gpu.info.mean[c], cpu.info.mean[c]);
        EXPECT_EQ(gpu.info.std[c], cpu.info.std[c]);
    }
    double worst = 0;
    std::vector<float> first;
    for (uint32_t seed : {1u, 2u, 3u}) {
        const std::vector<float> px = pixels(cpu.info, seed);
        const std::vector<float> g = gpu.encode(px), c = cpu.encode(px);
        worst = std::max(worst, rel_err(g, c));
        if (first.empty()) first = c;
        else EXPECT_GT(rel_err(c, first), 0.05) << "images give different rows";
    }
    std::printf("[vision-gpu] F32 tower: %u rows of %u, max |gpu - cpu| / max |cpu| = %.3g\n", gpu.info.n_tokens,
                gpu.info.n_embd, worst);
    EXPECT_LT(worst, 1e-4);
    // Twice the same image: the same rows, bit for bit.
    const std::vector<float> px = pixels(cpu.info, 9);
    EXPECT_EQ(gpu.encode(px), gpu.encode(px));
}

TEST(VisionGpu, F16TowerRowsMatchTheCpuReference) {
    REQUIRE_BOTH();
    HalfView half(forged().mmproj->view());
    Loaded gpu(gpu_api(), &half.view);
    Loaded cpu(cpu_api(), &half.view);
    ASSERT_EQ(gpu.enc_status, EH_OK) << gpu.error();
    ASSERT_EQ(cpu.enc_status, EH_OK) << cpu.error();
    double worst = 0;
    for (uint32_t seed : {4u, 5u}) {
        const std::vector<float> px = pixels(cpu.info, seed);
        worst = std::max(worst, rel_err(gpu.encode(px), cpu.encode(px)));
    }
    std::printf("[vision-gpu] F16 tower: max |gpu - cpu| / max |cpu| = %.3g\n", worst);
    EXPECT_LT(worst, 1e-2);
}

// The tower's flash attention, both kernels, against a double-precision
// pass over the same F16 inputs: within 5e-3 of the largest output (the
// kernels round the probabilities to F16 before P V, as flash attention
// does; summed over hundreds of keys that stays near 1e-3). Head sizes 16,
// 64 and SigLIP's 72 (padded to 80), patch counts that are not a multiple
// of any tile. Then each kernel's time at 896 px (4,096 patches, 16 heads
// of 72), printed.
TEST(VisionFlash, BothKernelsMatchADoublePrecisionPass) {
    if (!ehtest::gpu_usable(gpu_api())) GTEST_SKIP() << "no usable CUDA device";
    struct Shape {
        int n, width, heads;
    };
    for (const Shape sh : {Shape{100, 64, 4}, Shape{300, 256, 4}, Shape{300, 288, 4}, Shape{77, 1152, 16}}) {
        const int n = sh.n, W = sh.width, H = sh.heads, hd = W / H;
        ASSERT_TRUE(ehcuda::vision::flash_takes(W, H));
        std::mt19937 rng(uint32_t(n * 31 + W));
        std::uniform_real_distribution<float> d(-2.0f, 2.0f);
        std::vector<__half> qkv(size_t(n) * 3 * W);
        std::vector<double> x(qkv.size());
        for (size_t i = 0; i < qkv.size(); ++i) {
            qkv[i] = __float2half(d(rng));
            x[i] = double(__half2float(qkv[i]));
        }
        const double scale = 1.0 / std::sqrt(double(hd));
        std::vector<double> ref(size_t(n) * W);
        double mx = 0;
        for (int h = 0; h < H; ++h)
            for (int q = 0; q < n; ++q) {
                std::vector<double> p(n);
                double m = -1e300, sum = 0;
                for (int k = 0; k < n; ++k) {
                    double s = 0;
                    for (int e = 0; e < hd; ++e) s += x[size_t(q) * 3 * W + h * hd + e] * x[size_t(k) * 3 * W + W + h * hd + e];
                    p[k] = s * scale;
                    m = std::max(m, p[k]);
                }
                for (double& v : p) sum += (v = std::exp(v - m));
                for (int e = 0; e < hd; ++e) {
                    double o = 0;
                    for (int k = 0; k < n; ++k) o += p[k] * x[size_t(k) * 3 * W + 2 * W + h * hd + e];
                    ref[size_t(q) * W + h * hd + e] = o / sum;
                    mx = std::max(mx, std::fabs(o / sum));
                }
            }
        ehcuda::DeviceBuffer dq(qkv.size() * 2), dout(ref.size() * 4);
        ASSERT_EQ(cudaMemcpy(dq.get(), qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
        for (auto kind : {ehcuda::vision::FlashKernel::Mma, ehcuda::vision::FlashKernel::Wmma}) {
            const char* name = kind == ehcuda::vision::FlashKernel::Mma ? "mma" : "wmma";
            ASSERT_EQ(cudaMemset(dout.get(), 0xff, dout.size()), cudaSuccess);
            ehcuda::vision::flash_attention(dq.as<__half>(), n, W, H, float(scale), dout.as<float>(), nullptr, kind);
            std::vector<float> got(ref.size());
            ASSERT_EQ(cudaMemcpy(got.data(), dout.get(), dout.size(), cudaMemcpyDeviceToHost), cudaSuccess);
            double err = 0;
            for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(double(got[i]) - ref[i]));
            std::printf("[vision-flash] %s, %d patches, %d heads of %d: max |err| / max |out| = %.3g\n", name, n, H, hd,
                        err / mx);
            EXPECT_LT(err / mx, 5e-3) << name << " n " << n << " hd " << hd;
        }
    }
    // The time at 896 px, per call (after a warm-up), each kernel.
    const int n = 4096, W = 1152, H = 16;
    ehcuda::DeviceBuffer dq(size_t(n) * 3 * W * 2), dout(size_t(n) * W * 4);
    ASSERT_EQ(cudaMemset(dq.get(), 0x3c, dq.size()), cudaSuccess);  // halves of about 1.06
    for (auto kind : {ehcuda::vision::FlashKernel::Mma, ehcuda::vision::FlashKernel::Wmma}) {
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        ehcuda::vision::flash_attention(dq.as<__half>(), n, W, H, 0.1f, dout.as<float>(), nullptr, kind);
        cudaEventRecord(a);
        for (int i = 0; i < 10; ++i)
            ehcuda::vision::flash_attention(dq.as<__half>(), n, W, H, 0.1f, dout.as<float>(), nullptr, kind);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float t = 0;
        cudaEventElapsedTime(&t, a, b);
        std::printf("[vision-flash] %s at 4096 patches, 16 heads of 72: %.3f ms a call (27 a 896 px image: %.1f ms)\n",
                    kind == ehcuda::vision::FlashKernel::Mma ? "mma" : "wmma", t / 10, 27 * t / 10);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// SigLIP's own head size (1152 / 16 = 72 dims, the flash kernel's padded
// tile of 80) on one F16 block over a 16 x 16 patch grid, against the CPU
// reference: the same 1e-2 as the toy F16 tower.
TEST(VisionGpu, SiglipHeadsF16TowerMatchesTheCpuReference) {
    REQUIRE_BOTH();
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("vision_gpu_siglip_" + std::to_string(::getpid()) + ".gguf")).string();
    eh::tools::write_gemma3_tower(path, uint32_t(forged().text_width()), 9,
                                  {"SigLIP heads, one block (test)", 224, 14, 1152, 256, 1, 16, 4, true});
    auto file = eh::model::ModelFile::open(path);
    Loaded gpu(gpu_api(), &file->view());
    Loaded cpu(cpu_api(), &file->view());
    ASSERT_EQ(gpu.enc_status, EH_OK) << gpu.error();
    ASSERT_EQ(cpu.enc_status, EH_OK) << cpu.error();
    ASSERT_EQ(gpu.info.n_tokens, 16u);
    double worst = 0;
    for (uint32_t seed : {6u, 7u}) {
        const std::vector<float> px = pixels(cpu.info, seed);
        worst = std::max(worst, rel_err(gpu.encode(px), cpu.encode(px)));
    }
    std::printf("[vision-gpu] F16 tower of SigLIP's heads (72 dims, 256 patches): max |gpu - cpu| / max |cpu| = %.3g\n",
                worst);
    EXPECT_LT(worst, 1e-2);
    std::filesystem::remove(path);
}

TEST(VisionGpu, ImageConditionedLogitsMatchTheCpuReference) {
    REQUIRE_BOTH();
    Loaded gpu(gpu_api(), &forged().mmproj->view());
    Loaded cpu(cpu_api(), &forged().mmproj->view());
    ASSERT_EQ(gpu.enc_status, EH_OK) << gpu.error();
    ASSERT_EQ(cpu.enc_status, EH_OK) << cpu.error();
    const std::vector<float> rows = cpu.encode(pixels(cpu.info, 11));
    const std::vector<int32_t> toks = prompt_tokens(cpu.info.n_tokens, vocab_of(cpu));
    const auto ref = run(cpu, toks, rows.data(), EH_SPAN_BIDIRECTIONAL);
    const auto got = run(gpu, toks, rows.data(), EH_SPAN_BIDIRECTIONAL);
    const Agreement a = agree(got, ref);
    // Controls: the span causal, and no rows at all, on the GPU.
    const Agreement causal = agree(run(gpu, toks, rows.data(), 0), ref);
    const Agreement none = agree(run(gpu, toks, nullptr, 0), ref);
    std::printf("[vision-gpu] image-conditioned, %zu positions: top-1 %zu, max rel %.3g, max |dlogprob| %.3g; "
                "controls: causal span max rel %.3g, no rows max rel %.3g\n",
                a.n, a.top1, a.max_rel, a.max_dlp, causal.max_rel, none.max_rel);
    ASSERT_EQ(a.n, kTotal - kPrompt + 1);
    EXPECT_EQ(a.top1, a.n);
    EXPECT_LT(a.max_rel, 1e-2);
    EXPECT_LT(a.max_dlp, 0.05);
    EXPECT_GT(causal.max_rel, 10 * a.max_rel);
    EXPECT_GT(none.max_rel, 10 * a.max_rel);
}

TEST(VisionGpu, MixedStepsAndAForkInsideTheImageGiveTheImageAlone) {
    REQUIRE_BOTH();
    Loaded gpu(gpu_api(), &forged().mmproj->view());
    ASSERT_EQ(gpu.enc_status, EH_OK) << gpu.error();
    const uint32_t n_img = gpu.info.n_tokens, E = gpu.info.n_embd;
    const std::vector<float> rows = gpu.encode(pixels(gpu.info, 12));
    const std::vector<int32_t> toks = prompt_tokens(n_img, vocab_of(gpu));
    const std::vector<float> alone = run(gpu, toks, rows.data(), EH_SPAN_BIDIRECTIONAL)[0];

    // The image's prompt beside another sequence's decodes, in one step.
    eh_seq* other = gpu.create();
    std::vector<int32_t> text(40);
    for (size_t i = 0; i < text.size(); ++i) text[i] = int32_t(100 + i);
    eh_step_entry e0 = ehtest::step_entry(other, text.data(), 39);
    ASSERT_EQ(gpu.api->step(gpu.model, &e0, 1), EH_OK) << gpu.error();
    eh_seq* s = gpu.create();
    const eh_embd_span sp{kImageAt, n_img, EH_SPAN_BIDIRECTIONAL, 0, rows.data()};
    ASSERT_EQ(gpu.api->seq_embd_spans(s, &sp, 1), EH_OK) << gpu.error();
    eh_step_entry mix[2] = {ehtest::step_entry(other, text.data() + 39, 1),
                            ehtest::step_entry(s, toks.data(), uint32_t(kPrompt))};
    ASSERT_EQ(gpu.api->step(gpu.model, mix, 2), EH_OK) << gpu.error();
    const double mixed = rel_err(gpu.logits(s), alone);

    // A fork inside the image: the rest of the image (and the prompt after
    // it) on the shared prefix, its span from the entry's first token.
    const uint32_t cut = kImageAt + n_img / 2;
    eh_seq* f = gpu.fork(s, cut);
    const eh_embd_span rest{0, n_img - n_img / 2, EH_SPAN_BIDIRECTIONAL, 0, rows.data() + size_t(n_img / 2) * E};
    ASSERT_EQ(gpu.api->seq_embd_spans(f, &rest, 1), EH_OK) << gpu.error();
    eh_step_entry ef = ehtest::step_entry(f, toks.data() + cut, uint32_t(kPrompt - cut));
    ASSERT_EQ(gpu.api->step(gpu.model, &ef, 1), EH_OK) << gpu.error();
    const double forked = rel_err(gpu.logits(f), alone);
    std::printf("[vision-gpu] vs the image alone: mixed step %.3g, fork inside the image %.3g\n", mixed, forked);
    EXPECT_LT(mixed, 1e-3);
    EXPECT_LT(forked, 1e-3);
}

TEST(VisionGpu, ASpanOnAGraphedDecodeStepIsNotReplayedWithoutItsRow) {
    REQUIRE_BOTH();
    Loaded gpu(gpu_api(), &forged().mmproj->view());
    Loaded cpu(cpu_api(), &forged().mmproj->view());
    ASSERT_EQ(gpu.enc_status, EH_OK) << gpu.error();
    const uint32_t E = gpu.info.n_embd;
    std::vector<float> row(E);
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : row) x = d(rng);
    std::vector<int32_t> toks(12);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(300 + 17 * i);
    auto last = [&](Loaded& l, bool with_row) {
        eh_seq* s = l.create();
        eh_step_entry p = ehtest::step_entry(s, toks.data(), 4);
        EXPECT_EQ(l.api->step(l.model, &p, 1), EH_OK) << l.error();
        // Single-token steps: the decode graph is captured on its second use.
        for (size_t i = 4; i + 1 < toks.size(); ++i) {
            eh_step_entry e = ehtest::step_entry(s, toks.data() + i, 1);
            EXPECT_EQ(l.api->step(l.model, &e, 1), EH_OK) << l.error();
        }
        if (with_row) {
            const eh_embd_span sp{0, 1, EH_SPAN_BIDIRECTIONAL, 0, row.data()};
            EXPECT_EQ(l.api->seq_embd_spans(s, &sp, 1), EH_OK) << l.error();
        }
        eh_step_entry e = ehtest::step_entry(s, toks.data() + toks.size() - 1, 1);
        EXPECT_EQ(l.api->step(l.model, &e, 1), EH_OK) << l.error();
        std::vector<float> out = l.logits(s);
        l.release(s);
        return out;
    };
    const std::vector<float> ref = last(cpu, true);
    const std::vector<float> got = last(gpu, true);
    const std::vector<float> plain = last(gpu, false);
    std::printf("[vision-gpu] 1-token span on a decode step: vs cpu %.3g, the token's own embedding %.3g\n",
                rel_err(got, ref), rel_err(plain, ref));
    EXPECT_LT(rel_err(got, ref), 1e-2);
    EXPECT_GT(rel_err(plain, ref), 0.05);
}

TEST(VisionGpu, BadCallsAreRefusedByNameAndChangeNothing) {
    REQUIRE_BOTH();
    {
        Loaded q(gpu_api(), &forged().qwen->view());
        EXPECT_EQ(q.enc_status, EH_UNSUPPORTED);
        EXPECT_NE(q.error().find("qwen2.5vl_merger"), std::string::npos) << q.error();
        std::vector<float> out(16);
        EXPECT_EQ(q.api->image_encode(q.model, out.data(), out.data()), EH_INVALID_ARGUMENT);
        EXPECT_NE(q.error().find("no encoder loaded"), std::string::npos) << q.error();
    }
    Loaded gpu(gpu_api(), &forged().mmproj->view());
    ASSERT_EQ(gpu.enc_status, EH_OK) << gpu.error();
    eh_image_encoder_info again{};
    again.struct_size = sizeof again;
    EXPECT_EQ(gpu.api->image_encoder_load(gpu.model, &forged().mmproj->view(), &again), EH_INVALID_ARGUMENT);
    const uint32_t E = gpu.info.n_embd;
    std::vector<float> rows(size_t(4) * E, 0.5f);
    std::vector<int32_t> toks = {5, 6, 7, 8, 9, 10};
    eh_seq* s = gpu.create();
    EXPECT_EQ(gpu.api->seq_embd_spans(s, nullptr, 1), EH_INVALID_ARGUMENT);
    // Past the entry's tokens: refused naming the entry, nothing appended.
    const eh_embd_span past{4, 4, EH_SPAN_BIDIRECTIONAL, 0, rows.data()};
    ASSERT_EQ(gpu.api->seq_embd_spans(s, &past, 1), EH_OK);
    eh_step_entry e = ehtest::step_entry(s, toks.data(), 6);
    EXPECT_EQ(gpu.api->step(gpu.model, &e, 1), EH_INVALID_ARGUMENT);
    EXPECT_NE(gpu.error().find("step entry 0"), std::string::npos) << gpu.error();
    EXPECT_EQ(gpu.api->seq_length(s), 0u);
    // The refused spans are gone: the same step without them runs and
    // matches a sequence that never had any.
    ASSERT_EQ(gpu.api->step(gpu.model, &e, 1), EH_OK) << gpu.error();
    const std::vector<float> after = gpu.logits(s);
    eh_seq* clean = gpu.create();
    eh_step_entry c = ehtest::step_entry(clean, toks.data(), 6);
    ASSERT_EQ(gpu.api->step(gpu.model, &c, 1), EH_OK) << gpu.error();
    EXPECT_LT(rel_err(after, gpu.logits(clean)), 1e-6);
    // A quantized KV cache: an image's bidirectional span is refused by
    // name at the step (attention_span reads F16 pools), and a model with an
    // encoder loaded refuses the type at kv_init.
    {
        ehtest::KvShape k = Loaded::shape(2);
        k.kv_type = EH_TYPE_Q8_0;
        ehtest::StepModel q8(gpu_api(), &forged().model->view(), k);
        ASSERT_TRUE(q8.ok()) << q8.failure;
        eh_seq* s8 = q8.create();
        const eh_embd_span sp8{1, 4, EH_SPAN_BIDIRECTIONAL, 0, rows.data()};
        ASSERT_EQ(q8.api->seq_embd_spans(s8, &sp8, 1), EH_OK) << q8.error();
        eh_step_entry e8 = ehtest::step_entry(s8, toks.data(), 6);
        EXPECT_EQ(q8.api->step(q8.model, &e8, 1), EH_UNSUPPORTED);
        EXPECT_NE(q8.error().find("needs the F16 KV cache"), std::string::npos) << q8.error();
        EXPECT_EQ(q8.api->seq_length(s8), 0u);
        // Causal rows (no bidirectional span) go through the usual attention.
        const eh_embd_span causal8{1, 4, 0, 0, rows.data()};
        ASSERT_EQ(q8.api->seq_embd_spans(s8, &causal8, 1), EH_OK) << q8.error();
        EXPECT_EQ(q8.api->step(q8.model, &e8, 1), EH_OK) << q8.error();

        eh_load_params lp{};
        lp.struct_size = sizeof lp;
        lp.path = "vision";
        lp.view = &forged().model->view();
        eh_model* m = nullptr;
        ASSERT_EQ(gpu_api()->model_load(&lp, &m), EH_OK) << gpu_api()->plugin_last_error();
        eh_image_encoder_info info{};
        info.struct_size = sizeof info;
        ASSERT_EQ(gpu_api()->image_encoder_load(m, &forged().mmproj->view(), &info), EH_OK) << gpu_api()->model_last_error(m);
        eh_kv_params p{};
        p.struct_size = sizeof p;
        p.max_seqs = 1;
        p.max_step_tokens = 64;
        p.max_step_entries = 1;
        p.max_seq_tokens = 64;
        p.budget_bytes = 16ull << 20;
        p.kv_type = EH_TYPE_Q8_0;
        eh_kv_info ki{};
        ki.struct_size = sizeof ki;
        EXPECT_EQ(gpu_api()->kv_init(m, &p, &ki), EH_UNSUPPORTED);
        EXPECT_NE(std::string(gpu_api()->model_last_error(m)).find("images"), std::string::npos)
            << gpu_api()->model_last_error(m);
        gpu_api()->model_release(m);
    }
    // Overlapping spans are refused; n 0 clears.
    eh_seq* t = gpu.create();
    const eh_embd_span two[2] = {{0, 2, 0, 0, rows.data()}, {1, 2, 0, 0, rows.data()}};
    ASSERT_EQ(gpu.api->seq_embd_spans(t, two, 2), EH_OK);
    eh_step_entry et = ehtest::step_entry(t, toks.data(), 6);
    EXPECT_EQ(gpu.api->step(gpu.model, &et, 1), EH_INVALID_ARGUMENT);
    ASSERT_EQ(gpu.api->seq_embd_spans(t, two, 1), EH_OK);
    ASSERT_EQ(gpu.api->seq_embd_spans(t, nullptr, 0), EH_OK);
    ASSERT_EQ(gpu.api->step(gpu.model, &et, 1), EH_OK) << gpu.error();
    EXPECT_LT(rel_err(gpu.logits(t), gpu.logits(clean)), 1e-6);
}

// The encoder's time per image, and an image's prompt with and without its
// rows and span, on the Gemma 3 model and mmproj that EH_VISION_BENCH_MODEL
// and EH_VISION_BENCH_MMPROJ name (e.g. the forged
// gemma-3-4b-it-vision-q4_k_m): a measurement, printed, not an assertion.
TEST(VisionGpuBench, EncodeAndImagePrefillTimes) {
    const char* mp = std::getenv("EH_VISION_BENCH_MODEL");
    const char* pp = std::getenv("EH_VISION_BENCH_MMPROJ");
    if (!mp || !pp) GTEST_SKIP() << "set EH_VISION_BENCH_MODEL and EH_VISION_BENCH_MMPROJ";
    if (!ehtest::gpu_usable(gpu_api())) GTEST_SKIP() << "no usable CUDA device";
    auto file = eh::model::ModelFile::open(mp);
    auto mm = eh::model::ModelFile::open(pp);
    const eh_plugin_api* api = gpu_api();
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = mp;
    lp.view = &file->view();
    eh_model* model = nullptr;
    ASSERT_EQ(api->model_load(&lp, &model), EH_OK) << api->plugin_last_error();
    using clock = std::chrono::steady_clock;
    auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    eh_image_encoder_info info{};
    info.struct_size = sizeof info;
    auto t0 = clock::now();
    ASSERT_EQ(api->image_encoder_load(model, &mm->view(), &info), EH_OK) << api->model_last_error(model);
    const double load_ms = ms(t0, clock::now());
    std::vector<float> rows(size_t(info.n_tokens) * info.n_embd);
    std::vector<double> enc;
    for (int i = 0; i < 12; ++i) {
        const std::vector<float> px = pixels(info, uint32_t(100 + i));
        t0 = clock::now();
        ASSERT_EQ(api->image_encode(model, px.data(), rows.data()), EH_OK) << api->model_last_error(model);
        if (i >= 2) enc.push_back(ms(t0, clock::now()));  // the first two warm up (cuBLAS heuristics)
    }
    std::sort(enc.begin(), enc.end());
    std::printf("[vision-bench] %ux%u px -> %u rows of %u: encoder load %.0f ms; encode median %.2f ms, min %.2f ms "
                "(%zu images)\n",
                info.image_width, info.image_height, info.n_tokens, info.n_embd, load_ms, enc[enc.size() / 2], enc[0],
                enc.size());
    {
        ehtest::KvShape k;
        k.max_seq_tokens = 1024;
        k.max_step_tokens = 1024;
        k.budget_bytes = 2ull << 30;
        ehtest::StepModel sm(api, model, k);
        ASSERT_TRUE(sm.ok()) << sm.failure;
        const uint32_t n = info.n_tokens + 64;
        const auto [with, without] =
            ehtest::image_prompt_ms(sm, n, eh_embd_span{32, info.n_tokens, EH_SPAN_BIDIRECTIONAL, 0, rows.data()});
        std::printf("[vision-bench] a %u-token prompt holding the image: %.2f ms with its rows and bidirectional span, "
                    "%.2f ms as text (medians of 5 after a warm-up)\n",
                    n, with, without);
    }
    api->model_release(model);
}

}  // namespace
