// Gemma 3 through the cpu-reference plugin against a second, independent
// forward pass written here from the transformers definition (double
// precision, whole sequence at once, HF's own weight conventions):
//   x = embed[token] * sqrt(hidden)
//   per layer: x += postnorm(attn(prenorm(x))); x += postnorm(mlp(prenorm(x)))
//   RMSNorm(v) = v / rms(v) * (1 + w); q and k RMS-normalised per head
//   attention: q . k * query_pre_attn_scalar^-1/2, causal, and on sliding
//   layers only keys less than `window` positions back; rotate_half RoPE with
//   the local base on sliding layers, the global base / linear factor on the
//   others; mlp = down(gelu_tanh(gate(h)) * up(h)); tied head; logits
//   soft-capped as cap * tanh(l / cap).
// Each of those is also computed wrongly on purpose, and the plugin must be
// far from every wrong variant: a test that would pass with any of them off
// does not test it.
// The weights reach the plugin as llama.cpp's converter writes them (a GGUF
// view: norms stored as 1 + w, no attention scale key) and as Hugging Face
// directories on disk (norms as w, through the host's config translation and
// tensor names: Gemma3ForCausalLM, the transformers 5 form with layer_types
// and per-type rope_parameters, and Gemma3ForConditionalGeneration's nested
// text_config and language_model.* names).
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <eh/model/gguf_writer.hpp>
#include <eh/model/model_file.hpp>
#include <engine_host/gemma3.hpp>

#include "../model/safetensors_test_files.hpp"
#include "plugin_handle.hpp"
#include "synthetic_model.hpp"

using namespace cpuref_test;
namespace fs = std::filesystem;

namespace {

// A tiny Gemma 3: head size differs from hidden / heads as on the real
// models; three layers with pattern 2 (sliding, global, sliding); a window
// shorter than the token sequence; a cap the logits exceed.
struct G3 {
    uint32_t E = 32, L = 3, H = 4, KV = 2, hd = 12, F = 48, V = 40;
    uint32_t window = 3, pattern = 2;
    double eps = 1e-6, softcap = 3.0, qpas = 12.0;
    double base_global = 10000.0, base_local = 10.0, linear = 4.0;

    struct Layer {
        std::vector<float> in_norm, wq, wk, wv, wo, q_norm, k_norm, post_attn, pre_ff, post_ff, wg, wu, wd;
    };
    std::vector<float> emb, out_norm;  // emb [V][E], tied head
    std::vector<Layer> layers;

    explicit G3(uint64_t seed = 7) {
        std::mt19937_64 rng(seed);
        auto rnd = [&](size_t n, float scale) {
            std::uniform_real_distribution<float> d(-scale, scale);
            std::vector<float> x(n);
            for (auto& e : x) e = d(rng);
            return x;
        };
        // norm weights around 0: (1 + w) and w are far apart
        emb = rnd(size_t(V) * E, 1.0f);
        const size_t Q = size_t(H) * hd, K = size_t(KV) * hd;
        for (uint32_t i = 0; i < L; ++i) {
            Layer l;
            l.in_norm = rnd(E, 0.5f);
            l.wq = rnd(Q * E, 1.0f / std::sqrt(float(E)));
            l.wk = rnd(K * E, 1.0f / std::sqrt(float(E)));
            l.wv = rnd(K * E, 1.0f / std::sqrt(float(E)));
            l.wo = rnd(E * Q, 1.0f / std::sqrt(float(Q)));
            l.q_norm = rnd(hd, 0.5f);
            l.k_norm = rnd(hd, 0.5f);
            l.post_attn = rnd(E, 0.5f);
            l.pre_ff = rnd(E, 0.5f);
            l.post_ff = rnd(E, 0.5f);
            l.wg = rnd(size_t(F) * E, 2.0f / std::sqrt(float(E)));
            l.wu = rnd(size_t(F) * E, 2.0f / std::sqrt(float(E)));
            l.wd = rnd(E * size_t(F), 1.0f / std::sqrt(float(F)));
            layers.push_back(std::move(l));
        }
        out_norm = rnd(E, 0.5f);
    }
    bool sliding(uint32_t i) const { return i % pattern < pattern - 1; }
};

// What the reference does differently, one thing each.
struct Wrong {
    bool no_window = false, no_softcap = false, plain_norm_weight = false, one_rope = false, no_post_norms = false,
         no_embd_scale = false, head_dim_scale = false, silu_mlp = false;
};

using Mat = std::vector<std::vector<double>>;

// Every position's logits.
Mat reference(const G3& m, const std::vector<int32_t>& tokens, double qpas, Wrong w = {}) {
    const size_t T = tokens.size(), E = m.E, hd = m.hd;
    auto rms = [&](const std::vector<double>& x, const std::vector<float>& g) {
        double ss = 0;
        for (double v : x) ss += v * v;
        const double inv = 1.0 / std::sqrt(ss / double(x.size()) + m.eps);
        std::vector<double> y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * ((w.plain_norm_weight ? 0.0 : 1.0) + g[i]);
        return y;
    };
    auto mv = [](const std::vector<float>& W, const std::vector<double>& x, size_t rows) {
        std::vector<double> y(rows, 0.0);
        for (size_t r = 0; r < rows; ++r)
            for (size_t c = 0; c < x.size(); ++c) y[r] += double(W[r * x.size() + c]) * x[c];
        return y;
    };
    auto rope = [&](double* v, size_t pos, bool local) {
        const bool use_local = local && !w.one_rope;
        const double base = use_local ? m.base_local : m.base_global;
        const double factor = use_local ? 1.0 : m.linear;
        const size_t half = hd / 2;
        for (size_t i = 0; i < half; ++i) {
            const double ang = double(pos) / factor * std::pow(base, -2.0 * double(i) / double(hd));
            const double a = v[i], b = v[i + half];
            v[i] = a * std::cos(ang) - b * std::sin(ang);
            v[i + half] = b * std::cos(ang) + a * std::sin(ang);
        }
    };
    std::vector<std::vector<double>> x(T, std::vector<double>(E));
    const double es = w.no_embd_scale ? 1.0 : std::sqrt(double(E));
    for (size_t t = 0; t < T; ++t)
        for (size_t e = 0; e < E; ++e) x[t][e] = m.emb[size_t(tokens[t]) * E + e] * es;
    const double scale = 1.0 / std::sqrt(w.head_dim_scale ? double(hd) : qpas);

    for (uint32_t il = 0; il < m.L; ++il) {
        const G3::Layer& l = m.layers[il];
        const bool slide = m.sliding(il);
        Mat q(T), k(T), v(T);
        for (size_t t = 0; t < T; ++t) {
            const auto h = rms(x[t], l.in_norm);
            q[t] = mv(l.wq, h, m.H * hd);
            k[t] = mv(l.wk, h, m.KV * hd);
            v[t] = mv(l.wv, h, m.KV * hd);
            for (size_t hh = 0; hh < m.H; ++hh) {
                std::vector<double> head(q[t].begin() + hh * hd, q[t].begin() + (hh + 1) * hd);
                head = rms(head, l.q_norm);
                rope(head.data(), t, slide);
                std::copy(head.begin(), head.end(), q[t].begin() + hh * hd);
            }
            for (size_t hh = 0; hh < m.KV; ++hh) {
                std::vector<double> head(k[t].begin() + hh * hd, k[t].begin() + (hh + 1) * hd);
                head = rms(head, l.k_norm);
                rope(head.data(), t, slide);
                std::copy(head.begin(), head.end(), k[t].begin() + hh * hd);
            }
        }
        for (size_t t = 0; t < T; ++t) {
            std::vector<double> att(m.H * hd, 0.0);
            for (size_t hh = 0; hh < m.H; ++hh) {
                const size_t g = hh / (m.H / m.KV);
                std::vector<double> s;
                std::vector<size_t> keys;
                for (size_t j = 0; j <= t; ++j) {
                    if (slide && !w.no_window && t - j >= m.window) continue;
                    double d = 0;
                    for (size_t i = 0; i < hd; ++i) d += q[t][hh * hd + i] * k[j][g * hd + i];
                    s.push_back(d * scale);
                    keys.push_back(j);
                }
                double mx = -1e300, sum = 0;
                for (double e : s) mx = std::max(mx, e);
                for (double& e : s) sum += (e = std::exp(e - mx));
                for (size_t n = 0; n < keys.size(); ++n)
                    for (size_t i = 0; i < hd; ++i) att[hh * hd + i] += s[n] / sum * v[keys[n]][g * hd + i];
            }
            auto o = mv(l.wo, att, E);
            if (!w.no_post_norms) o = rms(o, l.post_attn);
            for (size_t e = 0; e < E; ++e) x[t][e] += o[e];
            const auto h = rms(x[t], l.pre_ff);
            auto g = mv(l.wg, h, m.F), u = mv(l.wu, h, m.F);
            for (size_t i = 0; i < m.F; ++i) {
                const double a = g[i];
                const double act = w.silu_mlp ? a / (1.0 + std::exp(-a))
                                              : 0.5 * a * (1.0 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
                g[i] = act * u[i];
            }
            auto d = mv(l.wd, g, E);
            if (!w.no_post_norms) d = rms(d, l.post_ff);
            for (size_t e = 0; e < E; ++e) x[t][e] += d[e];
        }
    }
    Mat logits(T);
    for (size_t t = 0; t < T; ++t) {
        const auto h = rms(x[t], m.out_norm);
        logits[t] = mv(m.emb, h, m.V);
        if (!w.no_softcap)
            for (double& l : logits[t]) l = m.softcap * std::tanh(l / m.softcap);
    }
    return logits;
}

// The model as llama.cpp's converter writes it: norms + 1, no output.weight,
// no attention.scale (the plugin then uses the head size, as llama.cpp does
// for every Gemma 3 but the 27B).
std::unique_ptr<OwnedView> gguf_view(const G3& m) {
    auto v = std::make_unique<OwnedView>("gemma3");
    const std::string a = "gemma3.";
    v->str("general.architecture", "gemma3");
    v->u32(a + "embedding_length", m.E);
    v->u32(a + "block_count", m.L);
    v->u32(a + "attention.head_count", m.H);
    v->u32(a + "attention.head_count_kv", m.KV);
    v->u32(a + "attention.key_length", m.hd);
    v->u32(a + "attention.value_length", m.hd);
    v->u32(a + "context_length", 64);
    v->u32(a + "feed_forward_length", m.F);
    v->f32(a + "attention.layer_norm_rms_epsilon", m.eps);
    v->f32(a + "rope.freq_base", m.base_global);
    v->f32(a + "rope.freq_base_swa", m.base_local);
    v->str(a + "rope.scaling.type", "linear");
    v->f32(a + "rope.scaling.factor", m.linear);
    v->u32(a + "attention.sliding_window", m.window);
    v->u32(a + "attention.sliding_window_pattern", m.pattern);
    v->f32(a + "final_logit_softcapping", m.softcap);
    auto shifted = [](std::vector<float> w) {
        for (float& x : w) x += 1.0f;
        return w;
    };
    const uint64_t E = m.E, Q = uint64_t(m.H) * m.hd, K = uint64_t(m.KV) * m.hd, F = m.F;
    v->tensor("token_embd.weight", EH_TYPE_F32, {E, m.V}, m.emb);
    for (uint32_t i = 0; i < m.L; ++i) {
        const G3::Layer& l = m.layers[i];
        const std::string b = "blk." + std::to_string(i) + ".";
        v->tensor(b + "attn_norm.weight", EH_TYPE_F32, {E}, shifted(l.in_norm));
        v->tensor(b + "attn_q.weight", EH_TYPE_F32, {E, Q}, l.wq);
        v->tensor(b + "attn_k.weight", EH_TYPE_F32, {E, K}, l.wk);
        v->tensor(b + "attn_v.weight", EH_TYPE_F32, {E, K}, l.wv);
        v->tensor(b + "attn_output.weight", EH_TYPE_F32, {Q, E}, l.wo);
        v->tensor(b + "attn_q_norm.weight", EH_TYPE_F32, {m.hd}, shifted(l.q_norm));
        v->tensor(b + "attn_k_norm.weight", EH_TYPE_F32, {m.hd}, shifted(l.k_norm));
        v->tensor(b + "post_attention_norm.weight", EH_TYPE_F32, {E}, shifted(l.post_attn));
        v->tensor(b + "ffn_norm.weight", EH_TYPE_F32, {E}, shifted(l.pre_ff));
        v->tensor(b + "post_ffw_norm.weight", EH_TYPE_F32, {E}, shifted(l.post_ff));
        v->tensor(b + "ffn_gate.weight", EH_TYPE_F32, {E, F}, l.wg);
        v->tensor(b + "ffn_up.weight", EH_TYPE_F32, {E, F}, l.wu);
        v->tensor(b + "ffn_down.weight", EH_TYPE_F32, {F, E}, l.wd);
    }
    v->tensor("output_norm.weight", EH_TYPE_F32, {E}, shifted(m.out_norm));
    return v;
}

enum class HfForm {
    CausalLm,            // transformers 4 Gemma3ForCausalLM: rope_scaling, rope_local_base_freq, pattern
    CausalLmV5,          // transformers 5: layer_types, rope_parameters per layer type
    ConditionalGeneration  // model_type gemma3, text_config, language_model.model.* names
};

// The same weights as a Hugging Face directory (norms as w).
void write_hf_dir(const G3& m, const fs::path& dir, HfForm form) {
    using eh::model::testing::StTensor;
    std::vector<StTensor> tensors;
    std::vector<const void*> data;
    const std::string root = form == HfForm::ConditionalGeneration ? "language_model.model." : "model.";
    auto add = [&](const std::string& name, std::vector<uint64_t> shape, const std::vector<float>& w) {
        tensors.push_back({name, "F32", std::move(shape)});
        data.push_back(w.data());
    };
    const uint64_t E = m.E, Q = uint64_t(m.H) * m.hd, K = uint64_t(m.KV) * m.hd, F = m.F;
    add(root + "embed_tokens.weight", {m.V, E}, m.emb);
    for (uint32_t i = 0; i < m.L; ++i) {
        const G3::Layer& l = m.layers[i];
        const std::string b = root + "layers." + std::to_string(i) + ".";
        add(b + "input_layernorm.weight", {E}, l.in_norm);
        add(b + "self_attn.q_proj.weight", {Q, E}, l.wq);
        add(b + "self_attn.k_proj.weight", {K, E}, l.wk);
        add(b + "self_attn.v_proj.weight", {K, E}, l.wv);
        add(b + "self_attn.o_proj.weight", {E, Q}, l.wo);
        add(b + "self_attn.q_norm.weight", {m.hd}, l.q_norm);
        add(b + "self_attn.k_norm.weight", {m.hd}, l.k_norm);
        add(b + "post_attention_layernorm.weight", {E}, l.post_attn);
        add(b + "pre_feedforward_layernorm.weight", {E}, l.pre_ff);
        add(b + "post_feedforward_layernorm.weight", {E}, l.post_ff);
        add(b + "mlp.gate_proj.weight", {F, E}, l.wg);
        add(b + "mlp.up_proj.weight", {F, E}, l.wu);
        add(b + "mlp.down_proj.weight", {E, F}, l.wd);
    }
    add(root + "norm.weight", {E}, m.out_norm);
    // a vision tower tensor the decoder does not read
    std::vector<float> vision(4, 0.5f);
    if (form == HfForm::ConditionalGeneration) add("vision_tower.vision_model.post_layernorm.weight", {4}, vision);
    eh::model::testing::write_st_data(dir / "model.safetensors", tensors, data);

    std::string text = fmt::format(
        "\"hidden_size\": {}, \"intermediate_size\": {}, \"num_hidden_layers\": {}, \"num_attention_heads\": {}, "
        "\"num_key_value_heads\": {}, \"head_dim\": {}, \"rms_norm_eps\": {}, \"vocab_size\": {}, "
        "\"max_position_embeddings\": 64, \"sliding_window\": {}, \"query_pre_attn_scalar\": {}, "
        "\"final_logit_softcapping\": {}, \"attn_logit_softcapping\": null, "
        "\"hidden_activation\": \"gelu_pytorch_tanh\", \"tie_word_embeddings\": true",
        m.E, m.F, m.L, m.H, m.KV, m.hd, m.eps, m.V, m.window, m.qpas, m.softcap);
    if (form == HfForm::CausalLmV5) {
        std::string types;
        for (uint32_t i = 0; i < m.L; ++i)
            types += fmt::format("{}\"{}\"", i ? ", " : "", m.sliding(i) ? "sliding_attention" : "full_attention");
        text += fmt::format(", \"layer_types\": [{}], \"rope_parameters\": {{\"full_attention\": {{\"rope_type\": "
                            "\"linear\", \"factor\": {}, \"rope_theta\": {}}}, \"sliding_attention\": {{\"rope_type\": "
                            "\"default\", \"rope_theta\": {}}}}}",
                            types, m.linear, m.base_global, m.base_local);
    } else {
        text += fmt::format(", \"sliding_window_pattern\": {}, \"rope_theta\": {}, \"rope_local_base_freq\": {}, "
                            "\"rope_scaling\": {{\"rope_type\": \"linear\", \"factor\": {}}}",
                            m.pattern, m.base_global, m.base_local, m.linear);
    }
    std::string config;
    if (form == HfForm::ConditionalGeneration)
        config = "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\", "
                 "\"eos_token_id\": [1, 3], \"text_config\": {\"model_type\": \"gemma3_text\", " + text +
                 "}, \"vision_config\": {\"model_type\": \"siglip_vision_model\", \"hidden_size\": 4}}";
    else
        config = "{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\", " + text + "}";
    eh::model::testing::write_text(dir / "config.json", config);
    std::string vocab;
    for (uint32_t i = 0; i < m.V; ++i) vocab += fmt::format("{}\"t{}\": {}", i ? ", " : "", i, i);
    eh::model::testing::write_text(
        dir / "tokenizer.json",
        "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [], \"normalizer\": null, "
        "\"pre_tokenizer\": {\"type\": \"WhitespaceSplit\"}, \"post_processor\": null, \"decoder\": null, "
        "\"model\": {\"type\": \"WordLevel\", \"vocab\": {" + vocab + "}, \"unk_token\": \"t0\"}}");
}

const std::vector<int32_t> kTokens = {2, 17, 5, 33, 9, 9, 21, 38, 1, 12};

double max_diff(const std::vector<float>& got, const std::vector<double>& want) {
    double m = 0;
    for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::fabs(double(got[i]) - want[i]));
    return m;
}

// Feeds the tokens one at a time (the KV cache path) and checks every
// position against `ref`; returns the plugin's logits.
std::vector<std::vector<float>> check_against(const eh_model_view* view, const Mat& ref, double tol) {
    Loaded p(view, 32);
    std::vector<std::vector<float>> got;
    for (size_t t = 0; t < kTokens.size(); ++t) {
        got.push_back(p.prefill({kTokens[t]}));
        EXPECT_EQ(got.back().size(), ref[t].size());
        EXPECT_LE(max_diff(got.back(), ref[t]), tol) << "position " << t;
    }
    return got;
}

std::string load_error(const eh_model_view* view) {
    eh_load_params lp = load_params(view);
    eh_model* model = nullptr;
    if (plugin().model_load(&lp, &model) == EH_OK) {
        plugin().model_release(model);
        return "";
    }
    return plugin().plugin_last_error();
}

}  // namespace

TEST(Gemma3, GgufMatchesTheIndependentForward) {
    const G3 m;
    auto v = gguf_view(m);
    const Mat ref = reference(m, kTokens, m.hd);  // no attention.scale key: the head size
    const auto got = check_against(v->view(), ref, 2e-4);

    // every feature matters on this model: each wrong variant is far off somewhere
    const std::pair<const char*, Wrong> wrongs[] = {
        {"no sliding window", {.no_window = true}},
        {"no soft-cap", {.no_softcap = true}},
        {"norm by w instead of 1 + w", {.plain_norm_weight = true}},
        {"one RoPE for every layer", {.one_rope = true}},
        {"no post-norms", {.no_post_norms = true}},
        {"no embedding scale", {.no_embd_scale = true}},
        {"SiLU instead of GeLU-tanh", {.silu_mlp = true}},
    };
    for (const auto& [what, w] : wrongs) {
        const Mat bad = reference(m, kTokens, m.hd, w);
        double worst = 0;
        for (size_t t = 0; t < kTokens.size(); ++t) worst = std::max(worst, max_diff(got[t], bad[t]));
        EXPECT_GT(worst, 1e-2) << what << " is indistinguishable from the plugin's output";
    }
}

// A prompt in one prefill gives the last position's logits of the
// token-at-a-time run, bit for bit (the rows are computed alike).
TEST(Gemma3, OnePrefillEqualsTokenByToken) {
    const G3 m;
    auto v = gguf_view(m);
    Loaded a(v->view(), 32), b(v->view(), 32);
    std::vector<float> la;
    for (int32_t t : kTokens) la = a.prefill({t});
    EXPECT_EQ(la, b.prefill(kTokens));
}

// The batched step (what the server runs): two sequences share every step,
// one token each, past the window; each position matches the independent
// forward and is bit-identical to that sequence run alone.
TEST(Gemma3, BatchedStepMatchesTheIndependentForward) {
    const G3 m;
    auto v = gguf_view(m);
    const std::vector<int32_t> other = {7, 7, 30, 2, 19, 0, 11, 25, 3, 39};
    const Mat ref_a = reference(m, kTokens, m.hd), ref_b = reference(m, other, m.hd);
    const eh_plugin_api& api = plugin();
    eh_load_params lp = load_params(v->view());
    eh_model* model = nullptr;
    ASSERT_EQ(api.model_load(&lp, &model), EH_OK) << api.plugin_last_error();
    eh_kv_params kp{};
    kp.struct_size = sizeof(kp);
    kp.max_seqs = 4;
    kp.max_step_tokens = 64;
    kp.max_step_entries = 4;
    kp.max_seq_tokens = 32;
    eh_kv_info info{};
    info.struct_size = sizeof(info);
    ASSERT_EQ(api.kv_init(model, &kp, &info), EH_OK) << api.model_last_error(model);
    eh_seq* a = nullptr;
    eh_seq* b = nullptr;
    ASSERT_EQ(api.seq_create(model, &a), EH_OK);
    ASSERT_EQ(api.seq_create(model, &b), EH_OK);
    auto logits_of = [&](eh_seq* s) {
        const float* l = nullptr;
        uint32_t n = 0;
        EXPECT_EQ(api.seq_logits(s, &l, &n), EH_OK) << api.model_last_error(model);
        return std::vector<float>(l, l + n);
    };
    Loaded alone(v->view(), 32);
    for (size_t t = 0; t < kTokens.size(); ++t) {
        eh_step_entry e[2] = {};
        for (int i = 0; i < 2; ++i) {
            e[i].struct_size = sizeof(eh_step_entry);
            e[i].flags = EH_STEP_LOGITS;
            e[i].seq = i == 0 ? a : b;
            e[i].tokens = i == 0 ? &kTokens[t] : &other[t];
            e[i].n_tokens = 1;
        }
        ASSERT_EQ(api.step(model, e, 2), EH_OK) << api.model_last_error(model);
        const auto la = logits_of(a), lb = logits_of(b);
        EXPECT_LE(max_diff(la, ref_a[t]), 2e-4) << "position " << t;
        EXPECT_LE(max_diff(lb, ref_b[t]), 2e-4) << "position " << t;
        EXPECT_EQ(la, alone.prefill({kTokens[t]})) << "position " << t;
    }
    api.seq_release(a);
    api.seq_release(b);
    api.model_release(model);
}

TEST(Gemma3, AttentionScaleKeyIsUsed) {
    G3 m;
    m.qpas = 20.0;
    auto v = gguf_view(m);
    v->f32("gemma3.attention.scale", 1.0 / std::sqrt(m.qpas));
    const auto got = check_against(v->view(), reference(m, kTokens, m.qpas), 2e-4);
    const Mat bad = reference(m, kTokens, m.qpas, {.head_dim_scale = true});
    double worst = 0;
    for (size_t t = 0; t < kTokens.size(); ++t) worst = std::max(worst, max_diff(got[t], bad[t]));
    EXPECT_GT(worst, 1e-2);
}

TEST(Gemma3, HfDirectoriesMatchTheIndependentForward) {
    G3 m;
    m.qpas = 20.0;  // the HF config's query_pre_attn_scalar reaches the scale
    const Mat ref = reference(m, kTokens, m.qpas);
    for (HfForm form : {HfForm::CausalLm, HfForm::CausalLmV5, HfForm::ConditionalGeneration}) {
        SCOPED_TRACE(static_cast<int>(form));
        eh::model::testing::TempDir dir("gemma3_hf_" + std::to_string(static_cast<int>(form)));
        write_hf_dir(m, dir.path, form);
        auto file = eh::model::ModelFile::open(dir.path.string());
        EXPECT_EQ(file->architecture(), "gemma3");
        check_against(&file->view(), ref, 2e-4);
    }
}

TEST(Gemma3, LayerPatternFollowsTheFile) {
    OwnedView v("gemma3");
    EXPECT_EQ(ehp::gemma3::sliding_layers(ehp::ModelView(v.view()), 12), std::vector<bool>(12, false));  // no window
    v.u32("gemma3.attention.sliding_window", 1024);
    // llama.cpp's default period: five sliding layers, then a global one
    std::vector<bool> six;
    for (int i = 0; i < 12; ++i) six.push_back(i != 5 && i != 11);
    EXPECT_EQ(ehp::gemma3::sliding_layers(ehp::ModelView(v.view()), 12), six);
    v.u32("gemma3.attention.sliding_window_pattern", 3);
    const std::vector<bool> three = {true, true, false, true, true, false};
    EXPECT_EQ(ehp::gemma3::sliding_layers(ehp::ModelView(v.view()), 6), three);
}

// gguf-py may write the pattern key as one bool a layer (other converters
// do); that form is read as given.
TEST(Gemma3, LayerPatternAsOneBoolALayer) {
    using eh::model::GgufValue;
    eh::model::GgufWriter w;
    w.set("general.architecture", GgufValue::string("gemma3"));
    w.set("gemma3.attention.sliding_window", GgufValue::u32(512));
    const uint8_t pattern[4] = {1, 0, 0, 1};
    w.set("gemma3.attention.sliding_window_pattern", GgufValue::numeric_array(EH_VALUE_BOOL, pattern, 4));
    const auto bytes = w.to_bytes();
    auto f = eh::model::ModelFile::open_gguf_buffer(bytes.data(), bytes.size(), "pattern");
    const ehp::ModelView v(&f->view());
    EXPECT_EQ(ehp::gemma3::sliding_layers(v, 4), (std::vector<bool>{true, false, false, true}));
    try {
        ehp::gemma3::sliding_layers(v, 5);
        ADD_FAILURE() << "a 4-entry pattern for 5 layers was accepted";
    } catch (const ehp::Error& e) {
        EXPECT_NE(std::string(e.what()).find("one bool per layer (5)"), std::string::npos) << e.what();
    }
}

TEST(Gemma3, AttentionScaleDefaultsAsLlamaCpp) {
    OwnedView v("gemma3");
    const ehp::ModelView mv(v.view());
    // Gemma 3 27B: 62 layers, hidden 5376, 32 heads of 128 -> query_pre_attn_scalar 168
    EXPECT_FLOAT_EQ(ehp::gemma3::attention_scale(mv, 62, 5376, 32, 128), 1.0f / std::sqrt(168.0f));
    EXPECT_FLOAT_EQ(ehp::gemma3::attention_scale(mv, 26, 1152, 4, 256), 1.0f / 16.0f);  // 1B: the head size
}

TEST(Gemma3, RefusesWhatItDoesNotCompute) {
    const G3 m;
    {
        auto v = gguf_view(m);
        v->str("general.source_format", "safetensors");
        v->f32("hf.attn_logit_softcapping", 50.0);
        EXPECT_NE(load_error(v->view()).find("attn_logit_softcapping"), std::string::npos) << load_error(v->view());
    }
    {
        auto v = gguf_view(m);
        v->str("hf.hidden_activation", "gelu");
        EXPECT_NE(load_error(v->view()).find("hidden_activation 'gelu'"), std::string::npos);
    }
    {
        auto v = gguf_view(m);
        v->u32("hf.use_bidirectional_attention", 1);
        EXPECT_NE(load_error(v->view()).find("use_bidirectional_attention"), std::string::npos);
    }
    {
        auto v = gguf_view(m);
        v->remove("blk.1.post_ffw_norm.weight");
        EXPECT_NE(load_error(v->view()).find("missing tensor 'blk.1.post_ffw_norm.weight'"), std::string::npos);
    }
    {
        G3 neg;
        neg.softcap = -1.0;
        auto v = gguf_view(neg);
        EXPECT_NE(load_error(v->view()).find("final_logit_softcapping' must be >= 0"), std::string::npos);
    }
    {
        eh::model::testing::TempDir dir("gemma3_bad_types");
        write_hf_dir(m, dir.path, HfForm::CausalLmV5);
        std::string cfg;
        {
            std::ifstream in(dir.path / "config.json");
            cfg.assign(std::istreambuf_iterator<char>(in), {});
        }
        const auto at = cfg.find("\"full_attention\"");
        ASSERT_NE(at, std::string::npos);
        cfg.replace(at, 16, "\"chunked_attention\"");
        eh::model::testing::write_text(dir.path / "config.json", cfg);
        auto file = eh::model::ModelFile::open(dir.path.string());
        EXPECT_NE(load_error(&file->view()).find("hf.layer_types[1] is 'chunked_attention'"), std::string::npos)
            << load_error(&file->view());
    }
}
