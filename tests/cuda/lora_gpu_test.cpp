// The CUDA plugins' LoRA adapters (ABI 1.6) against the CPU reference's on
// forged tiny files (llama-cuda: llama 3.1 with separate q/k/v, phi3 with
// fused qkv and gate|up, qwen3, gemma3; gpt-cuda: GPT-2, gpt-oss, Qwen3-MoE,
// whose routers and experts are not adapted) with forged adapters on every kind of matrix (lora_forge.hpp, the
// CPU reference's tests' forger): teacher-forced logits within 1e-2 of the
// largest |logit| and the reference's top-1 kept, where the adapter moves
// them far more than that; sequences of different adapters (and none) in the
// same steps, prefill and graphed decode, get what each gets alone, also with
// an adapter loaded after the graphs were captured; a fork keeps its
// source's adapter; release while unused; seq_set_adapter's rules; a llama
// from an HF checkpoint (q/k rows in HF order) with the same adapter as its
// GGUF; and the refusals (an adapter of another model's shape, a
// tensor-parallel load).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <eh/model/model_file.hpp>

#ifndef EH_GPT_CUDA_PLUGIN
#define EH_GPT_CUDA_PLUGIN ""  // (not built: its cases fail to load it)
#endif

#include "forged_profile.hpp"
#include "logit_compare.hpp"
#include "lora_forge.hpp"
#include "plugin_pair.hpp"
#include "pool_shape.hpp"
#include "step_seq.hpp"

namespace {

const eh_plugin_api* llama_api() { return ehtest::llama_cuda_api(); }
const eh_plugin_api* gpt_api() { return ehtest::gpt_cuda_api(); }
// The CUDA plugin under test: the parameterized tests' (LoraGpu::SetUp),
// else llama-cuda.
const eh_plugin_api* g_tested = nullptr;
const eh_plugin_api* gpu_api() { return g_tested ? g_tested : llama_api(); }
const eh_plugin_api* cpu_api() { return ehtest::cpu_reference_api(); }

#define REQUIRE_BOTH()                                                 \
    REQUIRE_PLUGIN_PAIR(gpu_api(), "the CUDA plugin is not loadable"); \
    ASSERT_NE(gpu_api()->adapter_load, nullptr) << "the CUDA plugin exports no adapter_load"

// A forged profile (synthetic vocabulary), made once per process.
const eh::model::ModelFile& file_of(const std::string& profile) {
    return ehtest::forged_file("lora_cuda_test", profile, 13);
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Pairs on every adaptable matrix of the file, ranks and stored types varied
// (Q8_0 needs rows of whole 32-blocks: rank 32 there).
// `kinds`: only these (".attn_q.weight", "output.weight", ...).
lora_forge::Adapter forge_adapter(const std::string& profile, uint32_t seed, std::vector<std::string> kinds = {}) {
    if (kinds.empty())
        kinds = {".attn_q.weight", ".attn_k.weight", ".attn_v.weight", ".attn_qkv.weight", ".attn_output.weight",
                 ".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight", "output.weight"};
    const eh::model::ModelFile& f = file_of(profile);
    const eh_model_view& v = f.view();
    std::vector<lora_forge::Target> targets;
    const uint32_t types[] = {EH_TYPE_F32, EH_TYPE_F16, EH_TYPE_BF16, EH_TYPE_Q8_0};
    uint32_t k = seed;
    for (uint64_t i = 0; i < v.n_tensors; ++i) {
        const std::string name(v.tensors[i].name.data, v.tensors[i].name.size);
        bool take = false;
        for (const std::string& kind : kinds)
            take = take || name == kind || (name.rfind("blk.", 0) == 0 && ends_with(name, kind));
        if (!take || v.tensors[i].n_dims != 2) continue;
        const uint32_t type = types[k++ % 4];
        targets.push_back({name, type == EH_TYPE_Q8_0 ? 32u : 4u + 4u * (k % 3), type});
    }
    return lora_forge::forge(f, targets, 8.0f, seed, 0.12f);
}

// An adapter loaded into one model, released with it (before the model).
struct Loaded {
    const eh_plugin_api* api = nullptr;
    std::unique_ptr<eh::model::ModelFile> file;
    eh_adapter* adapter = nullptr;
    eh_status status = EH_OK;
    Loaded(const eh_plugin_api* a, eh_model* model, const std::vector<uint8_t>& gguf, float scale = 1.0f) : api(a) {
        file = eh::model::ModelFile::open_gguf_buffer(gguf.data(), gguf.size(), "forged-adapter.gguf");
        eh_adapter_params p{};
        p.struct_size = sizeof p;
        p.view = &file->view();
        p.scale = scale;
        p.alpha = 8.0f;
        status = api->adapter_load(model, &p, &adapter);
    }
    void release() {
        if (adapter) api->adapter_release(adapter);
        adapter = nullptr;
    }
    ~Loaded() { release(); }
};

ehtest::KvShape shape() { return ehtest::pool_shape(8, 96, 512); }

uint32_t vocab_of(const ehtest::StepModel& m) { return ehtest::vocab_size(m); }
using ehtest::tokens_of;

constexpr uint32_t kPrompt = 32, kDecode = 16;
using Logits = std::vector<std::vector<float>>;  // per position: after the prompt, then after each decoded token

// Several sequences fed the same steps: one entry each, the prompts in one
// step, then one teacher-forced token per step; every step's logits.
// A prompt of kGemmMinRows (32) or more takes llama-cuda's cuBLAS path, a
// shorter one the per-row kernels.
std::vector<Logits> feed(ehtest::StepModel& m, const std::vector<eh_adapter*>& adapters,
                         const std::vector<std::vector<int32_t>>& toks, uint32_t prompt = kPrompt) {
    std::vector<eh_seq*> seqs;
    for (eh_adapter* a : adapters) {
        eh_seq* s = m.create();
        EXPECT_EQ(m.api->seq_set_adapter(s, a), EH_OK) << m.error();
        seqs.push_back(s);
    }
    std::vector<Logits> out(seqs.size());
    for (uint32_t step = 0; step + prompt <= kPrompt + kDecode; ++step) {
        std::vector<eh_step_entry> es;
        for (size_t i = 0; i < seqs.size(); ++i) {
            const int32_t* t = step == 0 ? toks[i].data() : &toks[i][prompt + step - 1];
            es.push_back(ehtest::step_entry(seqs[i], t, step == 0 ? prompt : 1));
        }
        EXPECT_EQ(m.api->step(m.model, es.data(), uint32_t(es.size())), EH_OK) << m.error();
        for (size_t i = 0; i < seqs.size(); ++i) out[i].push_back(m.logits(seqs[i]));
    }
    for (eh_seq* s : seqs) m.release(s);
    return out;
}

using ehtest::argmax;
using ehtest::rel_err;
using ehtest::top1_ok;
// |log p(ref's top-1)| difference between the two.
double logprob_delta(const std::vector<float>& got, const std::vector<float>& ref) {
    auto lp = [](const std::vector<float>& v, size_t i) {
        const float mx = *std::max_element(v.begin(), v.end());
        double z = 0;
        for (float x : v) z += std::exp(double(x - mx));
        return double(v[i] - mx) - std::log(z);
    };
    const size_t t = argmax(ref);
    return std::fabs(lp(got, t) - lp(ref, t));
}

// Mixture-of-experts files (gpt-cuda): a token whose router scores nearly
// tie may take another expert on the GPU than on the CPU, so against the
// reference most positions, not all, must agree (as gpt_batch_step_test's
// 97 %); between the plugin's own steps the load's batch_invariant option
// keeps each token's routing whatever its step holds.
bool moe_file(const std::string& profile) {
    return profile.find("moe") != std::string::npos || profile.find("gpt-oss") != std::string::npos;
}
const char* options_for(const std::string& profile) {
    return moe_file(profile) ? R"({"batch_invariant": true})" : nullptr;
}

constexpr double kTol = 1e-2;     // of the largest |logit|: FP16 pairs and KV against FP32
constexpr double kMoved = 5e-2;   // the adapter's effect the comparisons must resolve

struct Case {
    const char* plugin;  // "llama-cuda" or "gpt-cuda"
    std::string profile;
};
class LoraGpu : public ::testing::TestWithParam<Case> {
protected:
    void SetUp() override { g_tested = std::string(GetParam().plugin) == "gpt-cuda" ? gpt_api() : llama_api(); }
    void TearDown() override { g_tested = nullptr; }
};

// Teacher-forced against the CPU reference with the same adapter, and the
// adapter matters (so a plugin that ignored it would fail).
TEST_P(LoraGpu, MatchesCpuReference) {
    REQUIRE_BOTH();
    const std::string profile = GetParam().profile;
    const auto ad = forge_adapter(profile, 3).gguf();
    ehtest::StepModel cpu(cpu_api(), &file_of(profile).view(), shape());
    ASSERT_TRUE(cpu.ok()) << cpu.failure;
    ehtest::StepModel gpu(gpu_api(), &file_of(profile).view(), shape(), options_for(profile));
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    Loaded ca(cpu_api(), cpu.model, ad), ga(gpu_api(), gpu.model, ad);
    ASSERT_EQ(ca.status, EH_OK) << cpu.error();
    ASSERT_EQ(ga.status, EH_OK) << gpu.error();
    const std::vector<std::vector<int32_t>> toks{tokens_of(kPrompt + kDecode, 1, vocab_of(gpu))};
    // The prompt in one step through cuBLAS (32 tokens) and through the
    // per-row kernels (12), then one token a step.
    for (uint32_t prompt : {kPrompt, 12u}) {
        SCOPED_TRACE("prompt " + std::to_string(prompt));
        const Logits ref = feed(cpu, {ca.adapter}, toks, prompt)[0];
        const Logits got = feed(gpu, {ga.adapter}, toks, prompt)[0];
        const Logits base = feed(gpu, {nullptr}, toks, prompt)[0];
        ASSERT_EQ(ref.size(), got.size());
        double worst = 0, worst_lp = 0, moved = 0;
        size_t top1 = 0, within = 0;
        for (size_t p = 0; p < ref.size(); ++p) {
            const double e = rel_err(got[p], ref[p]), lp = logprob_delta(got[p], ref[p]);
            worst = std::max(worst, e);
            worst_lp = std::max(worst_lp, lp);
            within += e < kTol && lp < 0.05;
            top1 += top1_ok(got[p], ref[p], kTol);
            moved = std::max(moved, rel_err(base[p], ref[p]));
        }
        std::printf("[lora-gpu] %s, prompt %u: %zu positions, max error %.3g of max |logit|, max |delta logprob| %.3g, "
                    "within both %zu, top-1 ok %zu, adapter moved logits by %.3g\n",
                    profile.c_str(), prompt, ref.size(), worst, worst_lp, within, top1, moved);
        if (moe_file(profile)) {
            EXPECT_GE(double(within), 0.97 * double(ref.size()));
            EXPECT_GE(double(top1), 0.97 * double(ref.size()));
        } else {
            EXPECT_LT(worst, kTol);
            EXPECT_LT(worst_lp, 0.05);
            EXPECT_EQ(top1, ref.size());
        }
        EXPECT_GT(moved, kMoved) << "the forged adapter barely changes the logits: the comparison proves nothing";
    }
}

// Sequences of two adapters and none in the same steps (the prompts in one
// step, then graphed decode steps) get what each gets alone; then an adapter
// loaded after those graphs were captured, in the same bucket.
TEST_P(LoraGpu, MixedAdaptersInOneStepEqualEachAlone) {
    REQUIRE_BOTH();
    const std::string profile = GetParam().profile;
    ehtest::StepModel gpu(gpu_api(), &file_of(profile).view(), shape(), options_for(profile));
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    Loaded a1(gpu_api(), gpu.model, forge_adapter(profile, 5).gguf());
    Loaded a2(gpu_api(), gpu.model, forge_adapter(profile, 6).gguf());
    ASSERT_EQ(a1.status, EH_OK) << gpu.error();
    ASSERT_EQ(a2.status, EH_OK) << gpu.error();
    const uint32_t vocab = vocab_of(gpu);
    std::vector<std::vector<int32_t>> toks;
    for (uint32_t i = 0; i < 4; ++i) toks.push_back(tokens_of(kPrompt + kDecode, 10 + i, vocab));
    auto check = [&](const std::vector<eh_adapter*>& ads, const char* what) {
        SCOPED_TRACE(what);
        const std::vector<Logits> together = feed(gpu, ads, toks);
        for (size_t i = 0; i < ads.size(); ++i) {
            const Logits alone = feed(gpu, {ads[i]}, {toks[i]})[0];
            double worst = 0;
            size_t same = 0;
            for (size_t p = 0; p < alone.size(); ++p) {
                worst = std::max(worst, rel_err(together[i][p], alone[p]));
                same += top1_ok(together[i][p], alone[p], kTol);
            }
            std::printf("[lora-gpu] %s %s: sequence %zu (%s): max error %.3g, top-1 kept %zu of %zu\n", profile.c_str(),
                        what, i, ads[i] ? "adapter" : "no adapter", worst, same, alone.size());
            EXPECT_LT(worst, kTol) << "sequence " << i;
            EXPECT_EQ(same, alone.size()) << "sequence " << i;
        }
    };
    check({a1.adapter, nullptr, a2.adapter, a1.adapter}, "two adapters and none");
    Loaded a3(gpu_api(), gpu.model, forge_adapter(profile, 7).gguf());
    ASSERT_EQ(a3.status, EH_OK) << gpu.error();
    check({a3.adapter, a1.adapter, nullptr, a2.adapter}, "an adapter loaded after the graphs");
    // And a sequence without an adapter is the model's own: the same beside
    // adapters as in a model that never loaded one.
    ehtest::StepModel plain(gpu_api(), &file_of(profile).view(), shape(), options_for(profile));
    ASSERT_TRUE(plain.ok()) << plain.failure;
    const Logits never = feed(plain, {nullptr}, {toks[2]})[0];
    const Logits beside = feed(gpu, {a1.adapter, a2.adapter, nullptr}, {toks[0], toks[1], toks[2]})[2];
    for (size_t p = 0; p < never.size(); ++p) EXPECT_LT(rel_err(beside[p], never[p]), kTol) << "position " << p;
}

// A fork continues with its source's adapter.
TEST_P(LoraGpu, ForkKeepsTheAdapter) {
    REQUIRE_BOTH();
    const std::string profile = GetParam().profile;
    ehtest::StepModel gpu(gpu_api(), &file_of(profile).view(), shape(), options_for(profile));
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    Loaded a(gpu_api(), gpu.model, forge_adapter(profile, 9).gguf());
    ASSERT_EQ(a.status, EH_OK) << gpu.error();
    const auto toks = tokens_of(kPrompt, 4, vocab_of(gpu));
    eh_seq* src = gpu.create();
    ASSERT_EQ(gpu.api->seq_set_adapter(src, a.adapter), EH_OK) << gpu.error();
    eh_step_entry e = ehtest::step_entry(src, toks.data(), kPrompt);
    ASSERT_EQ(gpu.api->step(gpu.model, &e, 1), EH_OK) << gpu.error();
    const std::vector<float> want = gpu.logits(src);
    eh_seq* f = gpu.fork(src, kPrompt - 1);
    e = ehtest::step_entry(f, &toks[kPrompt - 1], 1);
    ASSERT_EQ(gpu.api->step(gpu.model, &e, 1), EH_OK) << gpu.error();
    EXPECT_LT(rel_err(gpu.logits(f), want), kTol);
    // (the same last token without the adapter is far from it)
    const Logits base = feed(gpu, {nullptr}, {tokens_of(kPrompt + kDecode, 4, vocab_of(gpu))})[0];
    EXPECT_GT(rel_err(base[0], want), kMoved);
    gpu.release(f);  // (before the adapter)
    gpu.release(src);
}

// Decode graphs captured while the loaded adapters had pairs for the
// attention's q alone (so they hold no launches for the other matrices);
// then an adapter of attn_output, ffn_down and the LM head: its steps in
// the same bucket compute as the reference does (the graphs are captured
// again, BatchBase::graph_epoch).
TEST_P(LoraGpu, MatricesFirstAdaptedAfterCaptureAreApplied) {
    REQUIRE_BOTH();
    const std::string profile = GetParam().profile;
    ehtest::StepModel cpu(cpu_api(), &file_of(profile).view(), shape());
    ASSERT_TRUE(cpu.ok()) << cpu.failure;
    ehtest::StepModel gpu(gpu_api(), &file_of(profile).view(), shape(), options_for(profile));
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    Loaded q(gpu_api(), gpu.model, forge_adapter(profile, 41, {".attn_q.weight", ".attn_qkv.weight"}).gguf());
    ASSERT_EQ(q.status, EH_OK) << gpu.error();
    const uint32_t vocab = vocab_of(gpu);
    const std::vector<std::vector<int32_t>> toks{tokens_of(kPrompt + kDecode, 20, vocab),
                                                 tokens_of(kPrompt + kDecode, 21, vocab)};
    feed(gpu, {q.adapter, q.adapter}, toks);  // (decode steps of two rows: captured and replayed)
    const auto later = forge_adapter(profile, 42, {".attn_output.weight", ".ffn_down.weight", "output.weight"}).gguf();
    Loaded lg(gpu_api(), gpu.model, later), lc(cpu_api(), cpu.model, later);
    ASSERT_EQ(lg.status, EH_OK) << gpu.error();
    ASSERT_EQ(lc.status, EH_OK) << cpu.error();
    const Logits got = feed(gpu, {lg.adapter, q.adapter}, toks)[0];
    const Logits ref = feed(cpu, {lc.adapter}, {toks[0]})[0];
    size_t within = 0;
    double worst = 0;
    for (size_t p = 0; p < ref.size(); ++p) {
        const double e = rel_err(got[p], ref[p]);
        worst = std::max(worst, e);
        within += e < kTol;
    }
    std::printf("[lora-gpu] %s: an adapter of other matrices after capture: max error %.3g, within %zu of %zu\n",
                profile.c_str(), worst, within, ref.size());
    EXPECT_GE(double(within), (moe_file(profile) ? 0.97 : 1.0) * double(ref.size()));
}

// seq_set_adapter's rules, release while unused, a freed slot reused.
TEST_P(LoraGpu, RulesAndRelease) {
    REQUIRE_BOTH();
    const std::string profile = GetParam().profile;
    ehtest::StepModel cpu(cpu_api(), &file_of(profile).view(), shape());
    ASSERT_TRUE(cpu.ok()) << cpu.failure;
    ehtest::StepModel gpu(gpu_api(), &file_of(profile).view(), shape(), options_for(profile));
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    Loaded a(gpu_api(), gpu.model, forge_adapter(profile, 11).gguf());
    Loaded b(gpu_api(), gpu.model, forge_adapter(profile, 12).gguf());
    ASSERT_EQ(a.status, EH_OK) << gpu.error();
    ASSERT_EQ(b.status, EH_OK) << gpu.error();
    const auto toks = tokens_of(kPrompt + kDecode, 6, vocab_of(gpu));
    eh_seq* s = gpu.create();
    EXPECT_EQ(gpu.api->seq_set_adapter(s, a.adapter), EH_OK) << gpu.error();
    EXPECT_EQ(gpu.api->seq_set_adapter(s, b.adapter), EH_OK) << "an empty sequence changes adapter";
    eh_step_entry e = ehtest::step_entry(s, toks.data(), 4);
    ASSERT_EQ(gpu.api->step(gpu.model, &e, 1), EH_OK) << gpu.error();
    EXPECT_EQ(gpu.api->seq_set_adapter(s, a.adapter), EH_INVALID_ARGUMENT);
    EXPECT_EQ(gpu.api->seq_set_adapter(s, nullptr), EH_INVALID_ARGUMENT);
    EXPECT_EQ(gpu.api->seq_set_adapter(s, b.adapter), EH_OK) << "the adapter it already has";
    gpu.release(s);
    // Another model's adapter.
    ehtest::StepModel other(gpu_api(), &file_of(profile).view(), shape(), options_for(profile));
    ASSERT_TRUE(other.ok()) << other.failure;
    eh_seq* o = other.create();
    EXPECT_EQ(other.api->seq_set_adapter(o, a.adapter), EH_INVALID_ARGUMENT);
    // Released unused, and its slot taken by a new adapter of fewer
    // matrices (a pair the slot kept from the old adapter would show): it
    // computes as the same adapter does on the model that never had
    // another, at every position; on dense files as the reference does
    // too. Not against the reference on MoE files: a router near-tie in
    // the prompt flips on differences far below the tolerance, and every
    // later position follows through the KV cache (Qwen3-MoE, these tokens
    // with a full adapter: layer 0 ranks position 26's 2nd and 3rd experts
    // 8e-5 apart, and the reference itself with the adapter's scale 1e-3
    // lower keeps 3 of 17 positions within the tolerance).
    a.release();
    b.release();
    const auto ad = forge_adapter(profile, 13, {".attn_q.weight", ".attn_qkv.weight", "output.weight"}).gguf();
    Loaded c(gpu_api(), gpu.model, ad), fresh(gpu_api(), other.model, ad);
    ASSERT_EQ(c.status, EH_OK) << gpu.error();
    ASSERT_EQ(fresh.status, EH_OK) << other.error();
    const Logits got = feed(gpu, {c.adapter}, {toks})[0];
    const Logits want = feed(other, {fresh.adapter}, {toks})[0];
    const Logits base = feed(other, {nullptr}, {toks})[0];
    double worst = 0, moved = 0;
    for (size_t p = 0; p < want.size(); ++p) {
        worst = std::max(worst, rel_err(got[p], want[p]));
        moved = std::max(moved, rel_err(base[p], want[p]));
    }
    std::printf("[lora-gpu] %s: a freed slot's new adapter against it on a fresh model: max error %.3g (it moves %.3g)\n",
                profile.c_str(), worst, moved);
    EXPECT_LT(worst, kTol);
    EXPECT_GT(moved, kMoved) << "the forged adapter barely changes the logits: the comparison proves nothing";
    if (moe_file(profile)) return;
    Loaded cc(cpu_api(), cpu.model, ad);
    ASSERT_EQ(cc.status, EH_OK) << cpu.error();
    const Logits ref = feed(cpu, {cc.adapter}, {toks})[0];
    size_t within = 0;
    for (size_t p = 0; p < ref.size(); ++p) within += rel_err(got[p], ref[p]) < kTol;
    EXPECT_EQ(within, ref.size());
}

INSTANTIATE_TEST_SUITE_P(Profiles, LoraGpu,
                         ::testing::Values(Case{"llama-cuda", "tiny-llama-3.1-q4_k_m"},
                                           Case{"llama-cuda", "tiny-phi-3-q4_k_m"},
                                           Case{"llama-cuda", "tiny-qwen3-q4_k_m"},
                                           Case{"llama-cuda", "tiny-gemma-3-q4_k_m"},
                                           Case{"gpt-cuda", "tiny-gpt2-f16"},
                                           Case{"gpt-cuda", "tiny-gpt-oss-mxfp4"},
                                           Case{"gpt-cuda", "tiny-qwen3-moe-q4_k_m"}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                             std::string n = i.param.profile;
                             for (char& ch : n)
                                 if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                             return n;
                         });

// A llama presented as the host's safetensors view of an HF checkpoint: the
// same weights with attn_q / attn_k rows in HF order (rotated NEOX there).
// The adapter file's q/k lora_b rows follow the GGUF order, which llama-cuda
// puts back: with the same adapter, the two views give the same logits.
struct HfOrderView {
    eh_model_view view{};
    std::vector<eh_tensor> tensors;
    std::vector<std::vector<uint8_t>> rows;
    explicit HfOrderView(const eh_model_view& gguf) {
        view = gguf;
        view.format = EH_FORMAT_SAFETENSORS;
        tensors.assign(gguf.tensors, gguf.tensors + gguf.n_tensors);
        const ehp::ModelView mv(&gguf);
        const uint64_t n_head = mv.get_uint("llama.attention.head_count").value_or(0);
        const uint64_t n_kv = mv.get_uint("llama.attention.head_count_kv").value_or(n_head);
        for (eh_tensor& t : tensors) {
            const std::string name(t.name.data, t.name.size);
            const bool q = ends_with(name, ".attn_q.weight"), k = ends_with(name, ".attn_k.weight");
            if (!q && !k) continue;
            const uint64_t n_rows = t.dims[1], row = t.nbytes / n_rows, hd = n_rows / (q ? n_head : n_kv);
            const auto* src = static_cast<const uint8_t*>(t.data);
            std::vector<uint8_t>& out = rows.emplace_back(t.nbytes);
            for (uint64_t o = 0; o < n_rows; ++o) {  // HF row h*hd + j*hd/2 + i is GGUF row h*hd + 2i + j
                const uint64_t h = o / hd, w = o % hd, j = w / (hd / 2), i = w % (hd / 2);
                std::memcpy(&out[o * row], src + (h * hd + 2 * i + j) * row, row);
            }
            t.data = out.data();
        }
        view.tensors = tensors.data();
    }
};

TEST(LoraGpuHfOrder, SafetensorsViewOfALlamaMatchesItsGguf) {
    REQUIRE_BOTH();
    const std::string profile = "tiny-llama-3.1-q4_k_m";
    const eh_model_view& gguf = file_of(profile).view();
    HfOrderView hf(gguf);
    const auto ad = forge_adapter(profile, 31).gguf();
    ehtest::StepModel a(gpu_api(), &gguf, shape()), b(gpu_api(), &hf.view, shape());
    ASSERT_TRUE(a.ok()) << a.failure;
    ASSERT_TRUE(b.ok()) << b.failure;
    Loaded la(gpu_api(), a.model, ad), lb(gpu_api(), b.model, ad);
    ASSERT_EQ(la.status, EH_OK) << a.error();
    ASSERT_EQ(lb.status, EH_OK) << b.error();
    const std::vector<std::vector<int32_t>> toks{tokens_of(kPrompt + kDecode, 8, vocab_of(a))};
    const Logits ga = feed(a, {la.adapter}, toks)[0], gb = feed(b, {lb.adapter}, toks)[0];
    const Logits base = feed(b, {nullptr}, toks)[0];
    double worst = 0, moved = 0;
    for (size_t p = 0; p < ga.size(); ++p) {
        worst = std::max(worst, rel_err(gb[p], ga[p]));
        moved = std::max(moved, rel_err(base[p], ga[p]));
    }
    std::printf("[lora-gpu] HF-order view vs GGUF, same adapter: max error %.3g (adapter moves %.3g)\n", worst, moved);
    EXPECT_LT(worst, kTol);
    EXPECT_GT(moved, kMoved);
}

// Refusals: a pair whose shape is not the model's, a pair for gpt-oss's
// router on gpt-cuda, and any adapter on a tensor-parallel load (two shards
// on this GPU).
TEST(LoraGpuRefusals, ShapesAndTensorParallel) {
    REQUIRE_BOTH();
    const std::string profile = "tiny-llama-3.1-q4_k_m";
    ehtest::StepModel gpu(gpu_api(), &file_of(profile).view(), shape(), options_for(profile));
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    auto ad = forge_adapter(profile, 21);
    ad.pairs[0].n_out += 1;  // lora_b one row too many
    ad.pairs[0].b.resize(ad.pairs[0].n_out * ad.pairs[0].rank);
    ad.pairs[0].b_bytes = lora_forge::encode(ad.pairs[0].type, ad.pairs[0].b, ad.pairs[0].rank);
    Loaded bad(gpu_api(), gpu.model, ad.gguf());
    EXPECT_EQ(bad.status, EH_MODEL_LOAD_FAILED);
    EXPECT_NE(gpu.error().find(ad.pairs[0].name), std::string::npos) << gpu.error();
    EXPECT_EQ(bad.adapter, nullptr);

    // gpt-cuda adapts no router (a 2-D weight the file may pair): refused by name.
    if (gpt_api() && gpt_api()->adapter_load) {
        g_tested = gpt_api();
        ehtest::StepModel moe(gpt_api(), &file_of("tiny-gpt-oss-mxfp4").view(), shape());
        ASSERT_TRUE(moe.ok()) << moe.failure;
        Loaded router(gpt_api(), moe.model, forge_adapter("tiny-gpt-oss-mxfp4", 23, {".ffn_gate_inp.weight"}).gguf());
        EXPECT_EQ(router.status, EH_UNSUPPORTED);
        EXPECT_NE(moe.error().find("ffn_gate_inp.weight"), std::string::npos) << moe.error();
        g_tested = nullptr;
    }

    // Adapters on a tensor-parallel load (the shard mode: two ranks on GPU
    // 0, always there) are refused by name. tiny-qwen3's attn_output has
    // 512 columns, two whole Q4_K blocks a rank; tiny-llama-3.1's 256
    // cannot be cut over two ranks, so its load itself would be refused.
    const std::string tp_profile = "tiny-qwen3-q4_k_m";
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = "tp";
    lp.view = &file_of(tp_profile).view();
    const int32_t devices[2] = {0, 0};
    lp.n_devices = 2;
    lp.devices = devices;
    eh_model* tp = nullptr;
    ASSERT_EQ(gpu_api()->model_load(&lp, &tp), EH_OK) << "the two-rank load: " << gpu_api()->plugin_last_error();
    Loaded on_tp(gpu_api(), tp, forge_adapter(tp_profile, 22).gguf());
    EXPECT_EQ(on_tp.status, EH_UNSUPPORTED);
    EXPECT_NE(std::string(gpu_api()->model_last_error(tp)).find("tensor-parallel"), std::string::npos);
    on_tp.release();
    gpu_api()->model_release(tp);

    // gpt-cuda likewise, before it reads a layer (a sharded model keeps
    // none of one rank's).
    if (gpt_api() && gpt_api()->adapter_load) {
        g_tested = gpt_api();
        lp.view = &file_of("tiny-gpt-oss-mxfp4").view();
        eh_model* gtp = nullptr;
        ASSERT_EQ(gpt_api()->model_load(&lp, &gtp), EH_OK) << "gpt-cuda's two-rank load: " << gpt_api()->plugin_last_error();
        Loaded gpt_on_tp(gpt_api(), gtp, forge_adapter("tiny-gpt-oss-mxfp4", 24).gguf());
        EXPECT_EQ(gpt_on_tp.status, EH_UNSUPPORTED);
        EXPECT_NE(std::string(gpt_api()->model_last_error(gtp)).find("tensor-parallel"), std::string::npos)
            << gpt_api()->model_last_error(gtp);
        gpt_on_tp.release();
        gpt_api()->model_release(gtp);
        g_tested = nullptr;
    }
}

}  // namespace
