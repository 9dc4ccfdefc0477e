// Whole-model checks through the plugin ABI, one sequence through the
// batched step: tiny llama / qwen2 / phi3 models in every weight type
// against the host float forward pass, prompt steps vs decode steps,
// determinism, the sequence's limits, and the memory-safety behaviours
// (INSUFFICIENT_VRAM at load, VRAM_OOM at kv_init then recovery, residency).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

#include "gpu_util.hpp"
#include "plugin_handle.hpp"
#include "step_seq.hpp"
#include "tiny_model.hpp"

namespace ehtest {
namespace {

// Every test here drives the llama-cuda plugin: without it, each fails on
// its own with this message (a helper returning nothing would crash the
// binary at the first dereference and end the run).
#define REQUIRE_PLUGIN()                                                              \
    REQUIRE_GPU();                                                                    \
    ASSERT_NE(llama_cuda_api(), nullptr) << "llama-cuda plugin not loadable from "    \
                                         << (std::getenv("EH_LLAMA_CUDA_PLUGIN")      \
                                                 ? std::getenv("EH_LLAMA_CUDA_PLUGIN") \
                                                 : EH_LLAMA_CUDA_PLUGIN)

// The model with one sequence of n_ctx tokens; status and failure say
// which call failed (model_load reads the options).
std::unique_ptr<StepSeq> load(const TinyModel& tm, uint32_t n_ctx, eh_status* st_out = nullptr,
                              const char* options = nullptr) {
    if (!llama_cuda_api()) return nullptr;
    auto L = std::make_unique<StepSeq>(llama_cuda_api(), tm.view(), one_seq(n_ctx), options, "tiny");
    if (st_out) *st_out = L->status;
    return L;
}

// Sampling through the whole pipeline: penalty window, top-k, top-p, min-p.
eh_sampling_params full_sampling(float temp, uint64_t seed, int32_t window) {
    eh_sampling_params p{};
    p.struct_size = sizeof p;
    p.temperature = temp;
    p.top_k = 200;
    p.top_p = 0.98f;
    p.min_p = 0.001f;
    p.repetition_penalty = 1.1f;
    p.repetition_window = window;
    p.seed = seed;
    return p;
}

// max |a-b| relative to the reference's largest logit.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double mx = 1e-6, e = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        mx = std::max(mx, double(std::fabs(b[i])));
        e = std::max(e, double(std::fabs(a[i] - b[i])));
    }
    return e / mx;
}

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

// The GPU's top token is the reference's top token, or ties with it within
// the tolerance (random tiny models have near-equal logits).
bool top1_ok(const std::vector<float>& gpu, const std::vector<float>& ref, double tol) {
    double mx = 1e-6;
    for (float v : ref) mx = std::max(mx, double(std::fabs(v)));
    return ref[static_cast<size_t>(argmax(ref))] - ref[static_cast<size_t>(argmax(gpu))] <= tol * mx;
}

struct ModelCase {
    std::string arch;
    uint32_t wtype;
};

class ModelVsReference : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ModelVsReference, PrefillAndDecodeLogitsMatch) {
    REQUIRE_PLUGIN();
    const auto& c = GetParam();
    TinySpec spec;
    spec.arch = c.arch;
    spec.wtype = c.wtype;
    spec.embd_type = c.wtype == EH_TYPE_F32 ? EH_TYPE_F32 : EH_TYPE_Q8_0;
    spec.out_type = EH_TYPE_Q6_K;
    spec.tied = c.arch == "qwen2";
    if (c.arch == "phi3") {
        spec.n_embd = 768;  // head_dim 96 like Phi-3; rows of whole 256-blocks
        spec.n_head = 8;
        spec.n_kv = 8;
        spec.n_ff = 512;
    }
    spec.seed = c.wtype * 11 + uint32_t(c.arch.size());
    spec.magnitude = 0.08f;
    TinyModel tm(spec);
    auto L = load(tm, 256);
    ASSERT_TRUE(L && L->ok()) << (L ? L->failure : "no plugin");

    std::vector<int32_t> toks;
    std::mt19937 rng(3);
    for (int i = 0; i < 40; ++i) toks.push_back(int32_t(rng() % uint32_t(spec.n_vocab)));
    auto ref = tm.reference_logits(toks);

    // A 20-token prompt step (the multi-token matmul path).
    ASSERT_EQ(L->prefill(toks.data(), 20), EH_OK) << L->error();
    auto g = L->logits();
    const double tol = 3e-2;
    EXPECT_LT(rel_err(g, ref[19]), tol) << "prefill";
    EXPECT_TRUE(top1_ok(g, ref[19], tol));
    // 4 more in one step, then one-token decode steps (captured graphs)
    // with teacher forcing.
    ASSERT_EQ(L->prefill(toks.data() + 20, 4), EH_OK) << L->error();
    EXPECT_LT(rel_err(L->logits(), ref[23]), tol) << "4-token step";
    int agree = 0;
    for (int t = 24; t < 40; ++t) {
        int32_t next = -1;
        ASSERT_EQ(L->decode(toks[static_cast<size_t>(t)], &next), EH_OK) << L->error();
        auto gl = L->logits();
        EXPECT_LT(rel_err(gl, ref[static_cast<size_t>(t)]), tol) << "decode at " << t;
        EXPECT_EQ(next, argmax(gl)) << "greedy token is the argmax of the returned logits";
        agree += top1_ok(gl, ref[static_cast<size_t>(t)], tol);
    }
    EXPECT_EQ(agree, 16);
    EXPECT_EQ(L->length(), 40u);
}

std::vector<ModelCase> model_cases() {
    std::vector<ModelCase> v;
    for (std::string a : {"llama", "qwen2", "phi3"})
        for (uint32_t t : {EH_TYPE_F32, EH_TYPE_F16, EH_TYPE_BF16, EH_TYPE_Q4_0, EH_TYPE_Q4_1, EH_TYPE_Q5_0, EH_TYPE_Q5_1,
                           EH_TYPE_Q8_0, EH_TYPE_Q4_K, EH_TYPE_Q5_K, EH_TYPE_Q6_K})
            v.push_back({a, t});
    return v;
}

INSTANTIATE_TEST_SUITE_P(ArchTypes, ModelVsReference, ::testing::ValuesIn(model_cases()),
                         [](const auto& i) { return i.param.arch + "_" + ehp::type_name(i.param.wtype); });

TEST(LlamaCuda, SlidingWindowAndPartialRotary) {
    REQUIRE_PLUGIN();
    TinySpec spec;
    spec.arch = "llama";
    spec.wtype = EH_TYPE_Q8_0;
    spec.window = 8;
    spec.n_rot = 32;
    spec.magnitude = 0.1f;
    TinyModel tm(spec);
    auto L = load(tm, 64);
    ASSERT_TRUE(L && L->ok()) << (L ? L->failure : "no plugin");
    std::vector<int32_t> toks;
    for (int i = 0; i < 30; ++i) toks.push_back(int32_t((i * 37) % spec.n_vocab));
    auto ref = tm.reference_logits(toks);
    ASSERT_EQ(L->prefill(toks.data(), 25), EH_OK) << L->error();
    EXPECT_LT(rel_err(L->logits(), ref[24]), 3e-2);
    for (int t = 25; t < 30; ++t) {
        ASSERT_EQ(L->decode(toks[static_cast<size_t>(t)]), EH_OK) << L->error();
        EXPECT_LT(rel_err(L->logits(), ref[static_cast<size_t>(t)]), 3e-2) << t;
    }
}

TEST(LlamaCuda, GenerationIsReproducible) {
    REQUIRE_PLUGIN();
    TinySpec spec;
    spec.wtype = EH_TYPE_Q4_K;
    spec.magnitude = 0.01f;  // flat logits: sampling has real choices
    TinyModel tm(spec);
    auto run = [&](float temp, uint64_t seed) {
        std::vector<int32_t> out;
        auto L = load(tm, 128);
        if (!L || !L->ok()) return out;
        EXPECT_EQ(L->set_sampling(full_sampling(temp, seed, 64)), EH_OK) << L->error();
        const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
        int32_t t = 0;
        EXPECT_EQ(L->prefill(prompt, &t), EH_OK) << L->error();
        for (int i = 0; i < 60; ++i) {
            out.push_back(t);
            EXPECT_EQ(L->decode(t, &t), EH_OK) << L->error();
        }
        return out;
    };
    EXPECT_EQ(run(0.0f, 42).size(), 60u);
    EXPECT_EQ(run(0.0f, 42), run(0.0f, 42));
    auto a = run(0.9f, 42);
    EXPECT_EQ(a, run(0.9f, 42));
    EXPECT_NE(a, run(0.9f, 7));
}

// A sequence holds max_seq_tokens: a step past it, or with a token outside
// the vocabulary, is refused naming why and changes nothing.
TEST(LlamaCuda, SequenceFullAndBadTokens) {
    REQUIRE_PLUGIN();
    TinySpec spec;
    spec.wtype = EH_TYPE_Q8_0;
    TinyModel tm(spec);
    auto L = load(tm, 16);
    ASSERT_TRUE(L && L->ok()) << (L ? L->failure : "no plugin");
    ASSERT_EQ(L->kv.max_seq_tokens, 16u);
    std::vector<int32_t> toks(17, 1);
    EXPECT_EQ(L->prefill(toks.data(), 17), EH_INVALID_ARGUMENT);
    EXPECT_NE(L->error().find("exceeds max_seq_tokens 16"), std::string::npos) << L->error();
    EXPECT_EQ(L->length(), 0u);
    toks[3] = spec.n_vocab;
    EXPECT_EQ(L->prefill(toks.data(), 5), EH_INVALID_ARGUMENT);
    EXPECT_NE(L->error().find("outside the vocabulary"), std::string::npos) << L->error();
    EXPECT_EQ(L->length(), 0u);
    EXPECT_EQ(L->prefill(toks.data(), 3), EH_OK) << L->error();
    EXPECT_EQ(L->decode(-1), EH_INVALID_ARGUMENT);
    for (int i = 3; i < 16; ++i) ASSERT_EQ(L->decode(1), EH_OK) << L->error();
    EXPECT_EQ(L->decode(1), EH_INVALID_ARGUMENT);
    EXPECT_EQ(L->length(), 16u);
    EXPECT_EQ(L->reset(), EH_OK);
    EXPECT_EQ(L->prefill(toks.data(), 3), EH_OK) << L->error();
}

TEST(LlamaCuda, InsufficientVramAtLoadNamesTheNumbers) {
    REQUIRE_PLUGIN();
    TinySpec spec;
    spec.wtype = EH_TYPE_Q8_0;
    const eh_plugin_api* api = llama_cuda_api();
    ASSERT_NE(api, nullptr);
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = "/models/huge.gguf";
    eh_model* m = nullptr;
    eh_status st;
    std::string msg;
    TinySpec big = spec;
    big.n_vocab = 1 << 22;  // 4M-row tables
    big.n_embd = 4096;
    big.n_ff = 4096;
    big.n_head = 32;
    big.n_kv = 8;
    big.n_layer = 64;
    big.wtype = EH_TYPE_F32;
    big.no_data = true;  // ~64 layers x 200 MB + 2 x 64 GB tables: never fits
    TinyModel huge(big);
    lp.view = huge.view();
    st = api->model_load(&lp, &m);
    EXPECT_EQ(st, EH_INSUFFICIENT_VRAM) << api->plugin_last_error();
    msg = api->plugin_last_error();
    EXPECT_NE(msg.find("required"), std::string::npos) << msg;
    EXPECT_NE(msg.find("available"), std::string::npos) << msg;
    EXPECT_NE(msg.find("/models/huge.gguf"), std::string::npos) << msg;
    EXPECT_EQ(m, nullptr);
}

// A KV cache that cannot be had fails kv_init with VRAM_OOM, frees what it
// took, and leaves the model able to make a cache that fits.
TEST(LlamaCuda, VramOomAtKvInitThenRecovers) {
    REQUIRE_PLUGIN();
    TinySpec spec;
    spec.wtype = EH_TYPE_Q8_0;
    spec.n_embd = 512;
    spec.n_head = 8;
    spec.n_kv = 8;   // kv_dim 512
    spec.n_layer = 8;
    TinyModel tm(spec);
    const eh_plugin_api* api = llama_cuda_api();
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = "tiny";
    lp.view = tm.view();
    eh_model* m = nullptr;
    ASSERT_EQ(api->model_load(&lp, &m), EH_OK) << api->plugin_last_error();
    size_t free0 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    eh_model_info mi{};
    mi.struct_size = sizeof mi;
    ASSERT_EQ(api->model_get_info(m, &mi), EH_OK);
    const uint64_t used0 = mi.device_bytes_used;
    {
        // 16M positions x 512 x 2 B x 2 x 8 layers = 256 GiB of KV pool.
        KvShape huge = one_seq(1u << 24);
        huge.budget_bytes = 256ull << 30;
        StepModel oom(api, m, huge);
        EXPECT_EQ(oom.status, EH_VRAM_OOM) << oom.failure;
    }
    size_t free1 = 0;
    cudaMemGetInfo(&free1, &total);
    EXPECT_GE(free1 + (64u << 20), free0) << "partial allocations were freed";
    ASSERT_EQ(api->model_get_info(m, &mi), EH_OK);
    EXPECT_EQ(mi.device_bytes_used, used0);
    {
        // kv_init again, with a cache that fits: the model still works.
        StepSeq s(api, m, one_seq(128));
        ASSERT_TRUE(s.ok()) << s.failure;
        const std::vector<int32_t> toks = {1, 2, 3};
        EXPECT_EQ(s.prefill(toks), EH_OK) << s.error();
        EXPECT_EQ(s.decode(4), EH_OK) << s.error();
    }
    api->model_release(m);
}

TEST(LlamaCuda, ResidencyAndInfo) {
    REQUIRE_PLUGIN();
    TinySpec spec;
    spec.wtype = EH_TYPE_Q4_K;
    TinyModel tm(spec);
    auto L = load(tm, 32);
    ASSERT_TRUE(L && L->ok()) << (L ? L->failure : "no plugin");
    int32_t resident = 0;
    EXPECT_EQ(L->api->model_check_residency(L->model, &resident), EH_OK) << L->error();
    EXPECT_EQ(resident, 1);
    eh_model_info mi{};
    mi.struct_size = sizeof mi;
    ASSERT_EQ(L->api->model_get_info(L->model, &mi), EH_OK);
    EXPECT_STREQ(mi.architecture, "llama");
    EXPECT_STREQ(mi.quant_kind, "Q4_K");
    EXPECT_EQ(mi.vocab_size, uint32_t(spec.n_vocab));
    EXPECT_GT(mi.device_bytes_used, 0u);
    EXPECT_GE(mi.compute_capability, 80);
}

TEST(LlamaCuda, LoadProgressAndCancel) {
    REQUIRE_PLUGIN();
    TinySpec spec;
    spec.wtype = EH_TYPE_F32;
    spec.n_layer = 4;
    TinyModel tm(spec);
    const eh_plugin_api* api = llama_cuda_api();
    struct P {
        std::vector<float> seen;
        int cancel_after = -1;
    } pr;
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = "tiny";
    lp.view = tm.view();
    lp.options_json = "{\"upload_chunk_bytes\": 65536}";
    lp.progress = [](void* u, float f, const char*) { static_cast<P*>(u)->seen.push_back(f); };
    lp.progress_user = &pr;
    eh_model* m = nullptr;
    ASSERT_EQ(api->model_load(&lp, &m), EH_OK) << api->plugin_last_error();
    api->model_release(m);
    ASSERT_FALSE(pr.seen.empty());
    EXPECT_EQ(pr.seen.back(), 1.0f);
    EXPECT_EQ(std::count(pr.seen.begin(), pr.seen.end(), 1.0f), 1);
    for (size_t i = 1; i < pr.seen.size(); ++i) EXPECT_GE(pr.seen[i], pr.seen[i - 1]);
    for (float q : {0.25f, 0.5f, 0.75f}) {
        bool near = false;
        for (float f : pr.seen) near |= std::fabs(f - q) < 0.03f;
        EXPECT_TRUE(near) << "no progress report near " << q;
    }
    // Cancel partway: no model, CANCELLED.
    int polls = 0;
    lp.progress = nullptr;
    lp.cancel = [](void* u) -> int32_t { return ++*static_cast<int*>(u) > 5; };
    lp.cancel_user = &polls;
    EXPECT_EQ(api->model_load(&lp, &m), EH_CANCELLED);
    EXPECT_EQ(m, nullptr);
}

// The kernel plan is logged once at load, through the progress stages: the
// plan's line, the attention's, and one line per weight-matrix kind.
TEST(LlamaCuda, LoadLogsTheKernelPlan) {
    REQUIRE_PLUGIN();
    TinySpec spec;
    spec.wtype = EH_TYPE_Q4_K;
    TinyModel tm(spec);
    const eh_plugin_api* api = llama_cuda_api();
    std::vector<std::string> stages;
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = "tiny";
    lp.view = tm.view();
    lp.progress = [](void* u, float, const char* stage) {
        static_cast<std::vector<std::string>*>(u)->push_back(stage ? stage : "");
    };
    lp.progress_user = &stages;
    eh_model* m = nullptr;
    ASSERT_EQ(api->model_load(&lp, &m), EH_OK) << api->plugin_last_error();
    api->model_release(m);
    auto count = [&](const std::string& prefix) {
        return std::count_if(stages.begin(), stages.end(), [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
    };
    EXPECT_EQ(count("kernel plan: sm_"), 1);
    EXPECT_EQ(count("attention decode: "), 1);
    for (const char* kind : {"attn_qkv x", "attn_output x", "ffn_gate_up x", "ffn_down x", "output x"})
        EXPECT_GE(count(kind), 1) << kind;
}

// The load's options: typed, range-checked, unknown keys refused by name.
TEST(LlamaCuda, LoadOptionsAreChecked) {
    REQUIRE_PLUGIN();
    TinySpec spec;
    TinyModel tm(spec);
    for (const char* bad : {R"({"fp16_weight": "on"})", R"({"kernels": {"attn_min_chunk": 0}})",
                            R"({"kernels": {"gemv_input": "int4"}})", R"({"upload_chunk_bytes": 100})",
                            R"({"batch_gemm_min_tokens": "3"})", "[1]"}) {
        eh_status st = EH_OK;
        auto L = load(tm, 64, &st, bad);
        EXPECT_EQ(st, EH_INVALID_ARGUMENT) << bad;
    }
    eh_status st = EH_INTERNAL;
    auto L = load(tm, 64, &st, R"({"kernels": {"gemv_input": "float", "attn_min_chunk": 3}, "fp16_weights": "off"})");
    EXPECT_EQ(st, EH_OK) << (L ? L->failure : "no plugin");
}

}  // namespace
}  // namespace ehtest
