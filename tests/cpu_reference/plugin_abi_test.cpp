// The plugin through its C ABI, loaded with dlopen like the host loads it,
// running tiny synthetic models of every architecture: what only this plugin
// promises (its session path, numerics, refusals). What the ABI asks of every
// plugin is eh-plugin-check's (plugin_check.cpu_reference), and the loader
// holds its self-description to its manifest on every load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <engine_host/plugin_abi.hpp>

#include "plugin_handle.hpp"
#include "synthetic_model.hpp"

using namespace cpuref_test;

namespace {

const std::vector<int32_t> kPrompt = {1, 7, 3, 12, 40, 5, 9, 33, 2, 17};

bool all_finite(const std::vector<float>& v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return !v.empty();
}

}  // namespace

TEST(PluginAbi, EntryNegotiatesMajorVersion) {
    void* lib = dlopen(CPUREF_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib, nullptr);
    auto entry = reinterpret_cast<eh_plugin_entry_fn>(dlsym(lib, EH_PLUGIN_ENTRY_SYMBOL));
    ASSERT_NE(entry, nullptr);
    EXPECT_EQ(entry(EH_ABI_MAJOR + 1, 0), nullptr);
    const eh_plugin_api* api = entry(EH_ABI_MAJOR, EH_ABI_MINOR);
    ASSERT_NE(api, nullptr);
    EXPECT_EQ(api->struct_size, sizeof(eh_plugin_api));
    EXPECT_EQ(api->abi_major, EH_ABI_MAJOR);
    EXPECT_EQ(api->abi_minor, EH_ABI_MINOR);
    dlclose(lib);
}

TEST(PluginAbi, ProbeAlwaysSupportedOnCpu) {
    eh_probe_result r{};
    r.struct_size = sizeof(r);
    ASSERT_EQ(plugin().probe(0, &r), EH_OK);
    EXPECT_EQ(r.supported, 1);
    EXPECT_EQ(std::string(r.device_name).rfind("CPU (", 0), 0u) << r.device_name;
    EXPECT_GT(r.total_memory_bytes, 0u);
    EXPECT_LE(r.free_memory_bytes, r.total_memory_bytes);
    EXPECT_EQ(r.compute_capability, 0);
    EXPECT_NE(plugin().probe(0, nullptr), EH_OK);
    EXPECT_STRNE(plugin().plugin_last_error(), "");
}

class EveryArch : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryArch, PrefillDecodeFiniteAndBatchEqualsStepwise) {
    TinySpec sp;
    sp.arch = GetParam();
    if (sp.arch == "phi3" || sp.arch == "gpt-oss") sp.window = 4;
    auto view = make_tiny(sp);
    const eh_plugin_api& api = plugin();

    Loaded a(view->view(), 32);
    std::vector<float> batch = a.prefill(kPrompt);
    ASSERT_TRUE(all_finite(batch));
    EXPECT_EQ(batch.size(), sp.n_vocab);
    EXPECT_EQ(api.session_n_past(a.session), kPrompt.size());
    int32_t next = -1;
    for (int i = 0; i < 5; ++i) {
        int32_t tok = next < 0 ? 0 : next;
        ASSERT_EQ(api.session_sample(a.session, &tok), EH_OK);
        ASSERT_EQ(api.session_decode(a.session, tok, &next), EH_OK) << api.session_last_error(a.session);
        ASSERT_GE(next, 0);
        ASSERT_LT(next, static_cast<int32_t>(sp.n_vocab));
        ASSERT_TRUE(all_finite(a.logits()));
    }
    EXPECT_EQ(api.session_n_past(a.session), kPrompt.size() + 5);

    // the KV cache gives the same answer as one batch
    Loaded b(view->view(), 32);
    std::vector<float> step;
    for (int32_t t : kPrompt) step = b.prefill({t});
    EXPECT_LT(max_abs_diff(batch, step), 1e-4f * std::max(1.0f, max_abs(batch)));

    // reset empties the context and reproduces the first logits
    ASSERT_EQ(api.session_reset(b.session), EH_OK);
    EXPECT_EQ(api.session_n_past(b.session), 0u);
    EXPECT_LT(max_abs_diff(batch, b.prefill(kPrompt)), 1e-6f * std::max(1.0f, max_abs(batch)));

    eh_model_info info{};
    info.struct_size = sizeof(info);
    ASSERT_EQ(api.model_get_info(a.model, &info), EH_OK);
    EXPECT_EQ(std::string(info.architecture), sp.arch);
    EXPECT_EQ(info.vocab_size, sp.n_vocab);
    EXPECT_EQ(std::string(info.quant_kind), "F32");
    int32_t resident = 0;
    EXPECT_EQ(api.model_check_residency(a.model, &resident), EH_OK);
    EXPECT_EQ(resident, 1);
}

INSTANTIATE_TEST_SUITE_P(Archs, EveryArch, ::testing::Values("llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gpt2", "gpt-oss"),
                         [](const auto& info) {
                             std::string s = info.param;
                             for (auto& c : s) if (c == '-') c = '_';
                             return s;
                         });

// A model stored in a block type must give the logits of the same model
// stored as F32 holding the dequantized weights: the quantized path reads
// exactly the values the format defines.
struct QuantCase {
    std::string arch;
    uint32_t type;
    uint32_t expert_type;
};
class QuantizedAgrees : public ::testing::TestWithParam<QuantCase> {};

TEST_P(QuantizedAgrees, WithDequantizedF32Copy) {
    const QuantCase qc = GetParam();
    TinySpec sp;
    sp.arch = qc.arch;
    sp.matrix_type = qc.type;
    sp.expert_type = qc.expert_type;
    auto quant = make_tiny(sp);
    sp.dequantized_copy = true;
    auto deq = make_tiny(sp);
    Loaded a(quant->view(), 16), b(deq->view(), 16);
    const std::vector<float> la = a.prefill(kPrompt), lb = b.prefill(kPrompt);
    ASSERT_TRUE(all_finite(la));
    EXPECT_LT(max_abs_diff(la, lb), 1e-4f * std::max(1.0f, max_abs(lb)));
    eh_model_info info{};
    info.struct_size = sizeof(info);
    plugin().model_get_info(a.model, &info);
    if (qc.expert_type == 0) {
        EXPECT_STREQ(info.quant_kind, ehp::type_name(qc.type).c_str());
    }
}

INSTANTIATE_TEST_SUITE_P(
    Types, QuantizedAgrees,
    ::testing::Values(QuantCase{"llama", EH_TYPE_F16, 0}, QuantCase{"llama", EH_TYPE_BF16, 0},
                      QuantCase{"llama", EH_TYPE_Q4_0, 0}, QuantCase{"llama", EH_TYPE_Q4_1, 0},
                      QuantCase{"llama", EH_TYPE_Q5_0, 0}, QuantCase{"llama", EH_TYPE_Q5_1, 0},
                      QuantCase{"llama", EH_TYPE_Q8_0, 0}, QuantCase{"llama", EH_TYPE_Q4_K, 0},
                      QuantCase{"llama", EH_TYPE_Q5_K, 0}, QuantCase{"llama", EH_TYPE_Q6_K, 0},
                      QuantCase{"llama", EH_TYPE_MXFP4, 0}, QuantCase{"qwen2", EH_TYPE_Q4_K, 0},
                      QuantCase{"phi3", EH_TYPE_Q6_K, 0}, QuantCase{"gpt2", EH_TYPE_Q8_0, 0},
                      QuantCase{"qwen3moe", EH_TYPE_Q4_K, 0},
                      QuantCase{"gpt-oss", EH_TYPE_BF16, EH_TYPE_MXFP4}),
    [](const auto& info) {
        std::string s = info.param.arch + "_" + ehp::type_name(info.param.type);
        for (auto& c : s) if (c == '-') c = '_';
        return s;
    });

TEST(PluginModels, SafetensorsLlamaEqualsPermutedGguf) {
    // Same weights: HF row order with general.source_format = safetensors,
    // and the GGUF converter's permuted order.
    TinySpec sp;
    auto gguf = make_tiny(sp);
    sp.safetensors = true;
    auto hf = make_tiny(sp);
    Loaded a(gguf->view(), 16), b(hf->view(), 16);
    const std::vector<float> la = a.prefill(kPrompt), lb = b.prefill(kPrompt);
    EXPECT_LT(max_abs_diff(la, lb), 1e-4f * std::max(1.0f, max_abs(la)));
}

// The same weights in llama.cpp's layout and in Hugging Face's (as the
// host's HF-directory view hands them over: names mapped, data as stored)
// give the same logits.
struct LayoutCase {
    std::string arch;
    TinySpec::Layout layout;
    uint32_t expert_type;
};
class LayoutsAgree : public ::testing::TestWithParam<LayoutCase> {};

std::string layout_case_name(const LayoutCase& lc) {
    static const char* const names[] = {"Gguf", "GgufFused", "Hf", "HfMxfp4"};
    std::string s = lc.arch + "_" + names[static_cast<int>(lc.layout)] + (lc.expert_type ? "_MXFP4" : "");
    for (auto& c : s)
        if (c == '-') c = '_';
    return s;
}

TEST_P(LayoutsAgree, WithGgufLayout) {
    const LayoutCase lc = GetParam();
    TinySpec sp;
    sp.arch = lc.arch;
    sp.expert_type = lc.expert_type;
    if (lc.arch == "gpt-oss") sp.window = 4;
    auto gguf = make_tiny(sp);
    sp.layout = lc.layout;
    auto other = make_tiny(sp);
    Loaded a(gguf->view(), 16), b(other->view(), 16);
    const std::vector<float> la = a.prefill(kPrompt), lb = b.prefill(kPrompt);
    ASSERT_TRUE(all_finite(lb));
    EXPECT_LT(max_abs_diff(la, lb), 1e-4f * std::max(1.0f, max_abs(la)));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, LayoutsAgree,
    ::testing::Values(LayoutCase{"gpt2", TinySpec::Layout::Hf, 0},
                      LayoutCase{"gpt-oss", TinySpec::Layout::Hf, 0},
                      LayoutCase{"gpt-oss", TinySpec::Layout::GgufFused, 0},
                      LayoutCase{"gpt-oss", TinySpec::Layout::GgufFused, EH_TYPE_MXFP4},
                      LayoutCase{"gpt-oss", TinySpec::Layout::HfMxfp4, EH_TYPE_MXFP4}),
    [](const auto& info) { return layout_case_name(info.param); });

TEST(PluginModels, SlidingWindowHidesOldTokens) {
    // phi3, window 4, two layers: the last position sees at most 7 tokens
    // back, so token 0 of a 12-token prompt cannot matter; without the
    // window it does.
    for (uint32_t window : {4u, 0u}) {
        TinySpec sp;
        sp.arch = "phi3";
        sp.window = window;
        auto view = make_tiny(sp);
        std::vector<int32_t> p1 = {5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, p2 = p1;
        p2[0] = 50;
        Loaded a(view->view(), 16), b(view->view(), 16);
        const float d = max_abs_diff(a.prefill(p1), b.prefill(p2));
        if (window) {
            EXPECT_EQ(d, 0.0f);
        } else {
            EXPECT_GT(d, 1e-4f);
        }
    }
}

TEST(PluginModels, GptOssAlternatesSlidingAndFullLayers) {
    // gpt-oss with window 4: layer 0 slides, layer 1 is full, so an old
    // token still reaches the last position through layer 1
    TinySpec sp;
    sp.arch = "gpt-oss";
    sp.window = 4;
    auto view = make_tiny(sp);
    std::vector<int32_t> p1 = {5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, p2 = p1;
    p2[0] = 50;
    Loaded a(view->view(), 16), b(view->view(), 16);
    EXPECT_GT(max_abs_diff(a.prefill(p1), b.prefill(p2)), 1e-5f);
}

TEST(PluginSessions, ContextFullAppendsNothing) {
    auto view = make_tiny(TinySpec{});
    const eh_plugin_api& api = plugin();
    Loaded a(view->view(), 4);
    a.prefill({1, 2, 3});
    const std::vector<int32_t> two = {4, 5};
    EXPECT_EQ(api.session_prefill(a.session, two.data(), 2), EH_CONTEXT_FULL);
    EXPECT_NE(std::string(api.session_last_error(a.session)).find("n_ctx"), std::string::npos);
    EXPECT_EQ(api.session_n_past(a.session), 3u);
    int32_t out = 0;
    EXPECT_EQ(api.session_decode(a.session, 4, &out), EH_OK);
    EXPECT_EQ(api.session_decode(a.session, out, &out), EH_CONTEXT_FULL);
    EXPECT_EQ(api.session_n_past(a.session), 4u);
}

TEST(PluginSessions, Gpt2ContextEndsAtLearnedPositions) {
    TinySpec sp;
    sp.arch = "gpt2";
    sp.n_ctx = 8;  // position_embd has 8 rows
    auto view = make_tiny(sp);
    const eh_plugin_api& api = plugin();
    Loaded a(view->view(), 100);  // more than gpt2 can hold: accepted, capped
    a.prefill({1, 2, 3, 4, 5, 6, 7, 8});
    int32_t out;
    EXPECT_EQ(api.session_decode(a.session, 9, &out), EH_CONTEXT_FULL);
    EXPECT_NE(std::string(api.session_last_error(a.session)).find("learned positions"), std::string::npos);
    EXPECT_EQ(api.session_n_past(a.session), 8u);
}

TEST(PluginSessions, BadTokenAndMissingSamplerAreInvalid) {
    auto view = make_tiny(TinySpec{});
    const eh_plugin_api& api = plugin();
    Loaded a(view->view(), 8);
    const int32_t bad = 64;  // vocab is 64
    EXPECT_EQ(api.session_prefill(a.session, &bad, 1), EH_INVALID_ARGUMENT);
    EXPECT_EQ(api.session_n_past(a.session), 0u);
    int32_t out;
    EXPECT_EQ(api.session_sample(a.session, &out), EH_INVALID_ARGUMENT);  // no logits yet

    eh_session* s = nullptr;
    eh_session_params sp{};
    sp.struct_size = sizeof(sp);
    sp.n_ctx = 8;
    ASSERT_EQ(api.session_create(a.model, &sp, &s), EH_OK);
    EXPECT_EQ(api.session_decode(s, 1, &out), EH_INVALID_ARGUMENT);  // sampler not set
    EXPECT_NE(std::string(api.session_last_error(s)).find("session_set_sampling"), std::string::npos);
    eh_sampling_params p = greedy_params();
    p.top_p = 2.0f;
    EXPECT_EQ(api.session_set_sampling(s, &p), EH_INVALID_ARGUMENT);
    api.session_release(s);
    sp.n_ctx = 0;
    EXPECT_EQ(api.session_create(a.model, &sp, &s), EH_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
}

TEST(PluginSessions, CancelBetweenLayersKeepsState) {
    auto view = make_tiny(TinySpec{});
    const eh_plugin_api& api = plugin();
    eh_model* m = nullptr;
    eh_load_params lp = load_params(view->view());
    ASSERT_EQ(api.model_load(&lp, &m), EH_OK);
    struct Flag { int polls = 0; int cancel_after = 1 << 30; } flag;
    eh_session_params sp{};
    sp.struct_size = sizeof(sp);
    sp.n_ctx = 16;
    sp.cancel = [](void* u) -> int32_t {
        auto* f = static_cast<Flag*>(u);
        return ++f->polls > f->cancel_after ? 1 : 0;
    };
    sp.cancel_user = &flag;
    eh_session* s = nullptr;
    ASSERT_EQ(api.session_create(m, &sp, &s), EH_OK);
    ASSERT_EQ(api.session_prefill(s, kPrompt.data(), 3), EH_OK);
    EXPECT_EQ(flag.polls, 2);  // once per layer
    const float* l = nullptr;
    uint32_t n = 0;
    api.session_logits(s, &l, &n);
    const std::vector<float> before(l, l + n);
    flag.cancel_after = flag.polls + 1;  // cancel in the second layer
    EXPECT_EQ(api.session_prefill(s, kPrompt.data() + 3, 2), EH_CANCELLED);
    EXPECT_EQ(api.session_n_past(s), 3u);
    api.session_logits(s, &l, &n);
    EXPECT_EQ(std::vector<float>(l, l + n), before);
    // the session still works and continues from where it was
    flag.cancel_after = 1 << 30;
    ASSERT_EQ(api.session_prefill(s, kPrompt.data() + 3, 2), EH_OK);
    api.session_logits(s, &l, &n);  // the old pointer is valid only until the next call
    Loaded ref(view->view(), 16);
    EXPECT_LT(max_abs_diff(ref.prefill({kPrompt.begin(), kPrompt.begin() + 5}), std::vector<float>(l, l + n)), 1e-5f);
    api.session_release(s);
    api.model_release(m);
}

TEST(PluginLoad, RefusesUnsupportedAndMalformed) {
    const eh_plugin_api& api = plugin();
    auto expect_fail = [&](OwnedView& v, eh_status want, const std::string& fragment) {
        eh_load_params lp = load_params(v.view());
        eh_model* m = nullptr;
        EXPECT_EQ(api.model_load(&lp, &m), want);
        EXPECT_EQ(m, nullptr);
        EXPECT_NE(std::string(api.plugin_last_error()).find(fragment), std::string::npos) << api.plugin_last_error();
    };
    {   // a type the plugin cannot run, named with the tensor
        auto v = make_tiny(TinySpec{});
        static std::vector<uint8_t> iq2(66 * 256);
        eh_tensor* t = v->find("blk.1.attn_v.weight");
        t->type = EH_TYPE_IQ2_XXS;
        t->data = iq2.data();
        t->nbytes = iq2.size();
        expect_fail(*v, EH_UNSUPPORTED, "'blk.1.attn_v.weight' has type IQ2_XXS");
    }
    {   // Phi-3 128k's LongRoPE factors: refused rather than silently ignored
        TinySpec sp;
        sp.arch = "phi3";
        auto v = make_tiny(sp);
        v->tensor("rope_factors_long.weight", EH_TYPE_F32, {32}, std::vector<float>(32, 1.0f));
        expect_fail(*v, EH_UNSUPPORTED, "LongRoPE");
    }
    {   // missing tensor
        auto v = make_tiny(TinySpec{});
        v->remove("blk.0.ffn_down.weight");
        expect_fail(*v, EH_MODEL_LOAD_FAILED, "blk.0.ffn_down.weight");
    }
    {   // wrong shape
        auto v = make_tiny(TinySpec{});
        v->find("blk.0.attn_q.weight")->dims[1] = 128;
        expect_fail(*v, EH_MODEL_LOAD_FAILED, "'blk.0.attn_q.weight' has dims {256, 128}");
    }
    {   // too few bytes for the shape: must not over-read
        auto v = make_tiny(TinySpec{});
        v->find("output.weight")->nbytes -= 4;
        expect_fail(*v, EH_MODEL_LOAD_FAILED, "output.weight");
    }
    {   // unknown architecture
        TinySpec sp;
        auto v = make_tiny(sp);
        OwnedView other("mamba");
        expect_fail(other, EH_UNSUPPORTED, "mamba");
    }
    {   // absurd hyperparameters are refused before any size is computed
        OwnedView v("llama");
        v.u32("llama.embedding_length", 1ull << 30);
        v.u32("llama.block_count", 1);
        v.u32("llama.attention.head_count", 1);
        v.u32("llama.feed_forward_length", 1);
        expect_fail(v, EH_MODEL_LOAD_FAILED, "out of range");
    }
    {   // missing hyperparameter
        OwnedView empty("llama");
        expect_fail(empty, EH_MODEL_LOAD_FAILED, "llama.embedding_length");
    }
}

TEST(PluginSampling, SeededSamplingRepeatsAndLogitsStayRaw) {
    auto view = make_tiny(TinySpec{});
    const eh_plugin_api& api = plugin();
    auto run = [&](uint64_t seed, float penalty, std::vector<float>* first_logits) {
        Loaded a(view->view(), 40);
        eh_sampling_params p = greedy_params();
        p.temperature = 1.5f;
        p.top_k = 40;
        p.top_p = 0.95f;
        p.min_p = 0.01f;
        p.repetition_penalty = penalty;
        p.seed = seed;
        EXPECT_EQ(api.session_set_sampling(a.session, &p), EH_OK);
        a.prefill(kPrompt);
        if (first_logits) *first_logits = a.logits();
        std::vector<int32_t> out;
        int32_t t;
        EXPECT_EQ(api.session_sample(a.session, &t), EH_OK);
        for (int i = 0; i < 12; ++i) {
            out.push_back(t);
            EXPECT_EQ(api.session_decode(a.session, t, &t), EH_OK);
        }
        return out;
    };
    std::vector<float> raw1, raw2;
    EXPECT_EQ(run(11, 1.3f, &raw1), run(11, 1.3f, nullptr));
    EXPECT_NE(run(11, 1.3f, nullptr), run(12, 1.3f, nullptr));
    run(11, 1.0f, &raw2);
    EXPECT_EQ(raw1, raw2);  // session_logits is before the penalty
}
