// Qwen2.5-VL's decoder (GGUF architecture qwen2vl) through the cpu-reference
// plugin: M-RoPE against a second, independent pass written here in double
// precision from the transformers definition (Qwen2_5_VLModel.get_rope_index
// for the positions: text advances time, row and column together, an
// image's token at row r, column c of its grid sits at (p, p + r, p + c),
// the text after it continues one past the largest; apply_multimodal_
// rotary_pos_emb for the rotation: frequency i turns by the component its
// mrope_section names, rotate-half pairing). Wrong variants (sections in
// another order, positions of one axis, text after an image continuing at
// its index) must be far from the plugin.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "batched_model.hpp"
#include "plugin_handle.hpp"
#include "synthetic_model.hpp"

using namespace cpuref_test;

namespace {

constexpr uint32_t kEmbd = 64, kHead = 4, kHeadKv = 2, kHd = 16, kFf = 48, kVocab = 40, kLayer = 2;
const std::vector<int32_t> kSections = {2, 3, 3};  // of kHd / 2 = 8 frequencies, as 16, 24, 24 of 64

TinySpec spec() {
    TinySpec sp;
    sp.arch = "qwen2vl";
    sp.n_embd = kEmbd;
    sp.n_head = kHead;
    sp.n_head_kv = kHeadKv;
    sp.n_ff = kFf;
    sp.n_vocab = kVocab;
    sp.n_layer = kLayer;
    sp.mrope_sections = {2, 3, 3, 0};
    return sp;
}

// An image of gh x gw tokens at [first, first + gh * gw) of the prompt.
struct Image {
    uint32_t first, gh, gw;
    std::vector<float> rows;
};

struct Wrong {
    bool swap_row_column = false;   // sections read as time, column, row
    bool one_axis = false;          // every position is the token's index
    bool continue_at_index = false; // text after an image resumes at its index
};

// transformers' get_rope_index for one still image (or none).
std::vector<std::array<int64_t, 3>> positions(size_t n, const Image* img, Wrong w) {
    std::vector<std::array<int64_t, 3>> p(n);
    int64_t next = 0;
    for (size_t i = 0; i < n;) {
        if (w.one_axis) {
            p[i] = {int64_t(i), int64_t(i), int64_t(i)};
            ++i;
            continue;
        }
        if (img && i == img->first) {
            int64_t top = next - 1;
            for (uint32_t k = 0; k < img->gh * img->gw; ++k, ++i) {
                p[i] = {next, next + k / img->gw, next + k % img->gw};
                top = std::max({top, p[i][1], p[i][2]});
            }
            next = w.continue_at_index ? int64_t(i) : top + 1;
            continue;
        }
        p[i] = {next, next, next};
        ++next, ++i;
    }
    return p;
}

const std::vector<float>& weights(OwnedView& v, const std::string& name, std::vector<std::vector<float>>& keep) {
    const eh_tensor* t = v.find(name);
    if (!t || t->type != EH_TYPE_F32) throw std::runtime_error("no F32 tensor " + name);
    const float* f = static_cast<const float*>(t->data);
    return keep.emplace_back(f, f + t->nbytes / sizeof(float));
}

// Logits after the last token, double precision.
std::vector<double> reference(OwnedView& v, const std::vector<int32_t>& tokens, const Image* img, Wrong w = {}) {
    using V = std::vector<double>;
    std::vector<std::vector<float>> keep;
    auto W = [&](const std::string& n) -> const std::vector<float>& { return weights(v, n, keep); };
    const size_t n = tokens.size(), E = kEmbd, Q = kHead * kHd, KV = kHeadKv * kHd;
    auto rms = [&](const V& x, const std::vector<float>& g) {
        double ss = 0;
        for (double e : x) ss += e * e;
        const double inv = 1.0 / std::sqrt(ss / double(x.size()) + 1e-5);
        V y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * g[i];
        return y;
    };
    auto lin = [](const std::vector<float>& m, const std::vector<float>* b, const V& x, size_t rows) {
        V y(rows);
        for (size_t r = 0; r < rows; ++r) {
            double s = b ? (*b)[r] : 0.0;
            for (size_t c = 0; c < x.size(); ++c) s += double(m[r * x.size() + c]) * x[c];
            y[r] = s;
        }
        return y;
    };
    const auto pos = positions(n, img, w);
    // Section of frequency j: time, row, column (or time, column, row).
    auto component = [&](size_t j) -> size_t {
        const size_t c = j < size_t(kSections[0]) ? 0 : j < size_t(kSections[0] + kSections[1]) ? 1 : 2;
        return w.swap_row_column && c ? 3 - c : c;
    };
    auto rotate = [&](double* head, const std::array<int64_t, 3>& p) {
        for (size_t j = 0; j < kHd / 2; ++j) {
            const double ang = double(p[component(j)]) * std::pow(10000.0, -2.0 * double(j) / kHd);
            const double a = head[j], b = head[j + kHd / 2];
            head[j] = a * std::cos(ang) - b * std::sin(ang);
            head[j + kHd / 2] = b * std::cos(ang) + a * std::sin(ang);
        }
    };
    const std::vector<float>& emb = W("token_embd.weight");
    std::vector<V> x(n, V(E));
    for (size_t i = 0; i < n; ++i)
        for (size_t e = 0; e < E; ++e)
            x[i][e] = img && i >= img->first && i < img->first + img->gh * img->gw
                          ? img->rows[(i - img->first) * E + e]
                          : emb[size_t(tokens[i]) * E + e];
    for (uint32_t l = 0; l < kLayer; ++l) {
        const std::string b = "blk." + std::to_string(l) + ".";
        std::vector<V> q(n), k(n), vv(n);
        for (size_t i = 0; i < n; ++i) {
            const V h = rms(x[i], W(b + "attn_norm.weight"));
            q[i] = lin(W(b + "attn_q.weight"), &W(b + "attn_q.bias"), h, Q);
            k[i] = lin(W(b + "attn_k.weight"), &W(b + "attn_k.bias"), h, KV);
            vv[i] = lin(W(b + "attn_v.weight"), &W(b + "attn_v.bias"), h, KV);
            for (size_t hh = 0; hh < kHead; ++hh) rotate(&q[i][hh * kHd], pos[i]);
            for (size_t hh = 0; hh < kHeadKv; ++hh) rotate(&k[i][hh * kHd], pos[i]);
        }
        const std::vector<float>& wo = W(b + "attn_output.weight");
        for (size_t i = 0; i < n; ++i) {
            V att(Q, 0.0);
            for (size_t hh = 0; hh < kHead; ++hh) {
                const size_t g = hh / (kHead / kHeadKv);
                V s(i + 1);
                double mx = -1e300, sum = 0;
                for (size_t j = 0; j <= i; ++j) {
                    double d = 0;
                    for (size_t t = 0; t < kHd; ++t) d += q[i][hh * kHd + t] * k[j][g * kHd + t];
                    mx = std::max(mx, s[j] = d / std::sqrt(double(kHd)));
                }
                for (double& e : s) sum += (e = std::exp(e - mx));
                for (size_t j = 0; j <= i; ++j)
                    for (size_t t = 0; t < kHd; ++t) att[hh * kHd + t] += s[j] / sum * vv[j][g * kHd + t];
            }
            const V o = lin(wo, nullptr, att, E);
            for (size_t e = 0; e < E; ++e) x[i][e] += o[e];
        }
        for (size_t i = 0; i < n; ++i) {
            const V h = rms(x[i], W(b + "ffn_norm.weight"));
            V g = lin(W(b + "ffn_gate.weight"), nullptr, h, kFf);
            const V u = lin(W(b + "ffn_up.weight"), nullptr, h, kFf);
            for (size_t f = 0; f < kFf; ++f) g[f] = g[f] / (1.0 + std::exp(-g[f])) * u[f];
            const V d = lin(W(b + "ffn_down.weight"), nullptr, g, E);
            for (size_t e = 0; e < E; ++e) x[i][e] += d[e];
        }
    }
    return lin(W("output.weight"), nullptr, rms(x[n - 1], W("output_norm.weight")), kVocab);
}

double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
    return d;
}

std::vector<float> random_rows(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> r(n * kEmbd);
    for (auto& e : r) e = d(rng);
    return r;
}

struct Fixture {
    std::unique_ptr<OwnedView> view = make_tiny(spec());
    BatchedModel bm{view->view()};
    // Last-position logits of `tokens` in one step, with the image as a grid span.
    std::vector<float> run(const std::vector<int32_t>& tokens, const Image* img, uint32_t flags = EH_SPAN_GRID) {
        eh_seq* s = bm.create();
        if (img) {
            const eh_embd_span sp{img->first, img->gh * img->gw, flags, (flags & EH_SPAN_GRID) ? img->gw : 0,
                                  img->rows.data()};
            EXPECT_EQ(plugin().seq_embd_spans(s, &sp, 1), EH_OK) << bm.error();
        }
        eh_step_entry e = entry(s, tokens.data(), uint32_t(tokens.size()));
        EXPECT_EQ(plugin().step(bm.model, &e, 1), EH_OK) << bm.error();
        auto l = bm.logits(s);
        bm.release(s);
        return l;
    }
};

std::vector<int32_t> prompt_with_image(const Image& img, uint32_t after) {
    std::vector<int32_t> t;
    for (uint32_t i = 0; i < img.first; ++i) t.push_back(int32_t(1 + i % 30));
    t.insert(t.end(), img.gh * img.gw, 33);
    for (uint32_t i = 0; i < after; ++i) t.push_back(int32_t(5 + i % 20));
    return t;
}

TEST(QwenVlDecoder, TextAloneMatchesTransformersDefinition) {
    Fixture f;
    const std::vector<int32_t> toks = {1, 7, 9, 3, 5, 11, 2, 8, 30, 4};
    const auto got = f.run(toks, nullptr);
    EXPECT_LT(max_diff(got, reference(*f.view, toks, nullptr)), 2e-4);
}

TEST(QwenVlDecoder, ImageOnAGridMatchesTransformersDefinition) {
    Fixture f;
    // A 3 x 5 grid: rows and columns differ, so every wrong variant shows.
    const Image img{4, 3, 5, random_rows(15, 7)};
    const auto toks = prompt_with_image(img, 6);
    const auto got = f.run(toks, &img);
    const auto want = reference(*f.view, toks, &img);
    EXPECT_LT(max_diff(got, want), 2e-4);
    const Wrong wrongs[] = {{.swap_row_column = true}, {.one_axis = true}, {.continue_at_index = true}};
    for (size_t i = 0; i < std::size(wrongs); ++i)
        EXPECT_GT(max_diff(got, reference(*f.view, toks, &img, wrongs[i])), 1e-3) << "wrong variant " << i;
    // Without EH_SPAN_GRID the span's positions are text positions: the one-axis variant.
    EXPECT_LT(max_diff(f.run(toks, &img, 0), reference(*f.view, toks, &img, {.one_axis = true})), 2e-4);
}

TEST(QwenVlDecoder, PositionsSurviveLaterStepsForksAndTruncation) {
    Fixture f;
    const Image img{2, 4, 2, random_rows(8, 9)};
    const auto all = prompt_with_image(img, 5);
    // The prompt up to two tokens after the image in one step, the rest one token a step.
    const uint32_t split = img.first + 8 + 2;
    eh_seq* s = f.bm.create();
    const eh_embd_span sp{img.first, 8, EH_SPAN_GRID, img.gw, img.rows.data()};
    ASSERT_EQ(plugin().seq_embd_spans(s, &sp, 1), EH_OK);
    eh_step_entry e = entry(s, all.data(), split, EH_STEP_LOGITS);
    ASSERT_EQ(plugin().step(f.bm.model, &e, 1), EH_OK) << f.bm.error();
    eh_seq* fork = nullptr;
    ASSERT_EQ(plugin().seq_fork(s, split, &fork), EH_OK) << f.bm.error();
    for (uint32_t i = split; i < all.size(); ++i) {
        eh_step_entry d = entry(s, &all[i], 1, EH_STEP_LOGITS);
        ASSERT_EQ(plugin().step(f.bm.model, &d, 1), EH_OK) << f.bm.error();
    }
    EXPECT_LT(max_diff(f.bm.logits(s), reference(*f.view, all, &img)), 2e-4);
    // The fork continues from the same positions.
    eh_step_entry d = entry(fork, &all[split], uint32_t(all.size() - split), EH_STEP_LOGITS);
    ASSERT_EQ(plugin().step(f.bm.model, &d, 1), EH_OK) << f.bm.error();
    EXPECT_TRUE(same_bits(f.bm.logits(fork), f.bm.logits(s)));
    // Cut back to the fork point and stepped again: the same again.
    ASSERT_EQ(plugin().seq_truncate(s, split), EH_OK) << f.bm.error();
    eh_step_entry again = entry(s, &all[split], uint32_t(all.size() - split), EH_STEP_LOGITS);
    ASSERT_EQ(plugin().step(f.bm.model, &again, 1), EH_OK) << f.bm.error();
    EXPECT_TRUE(same_bits(f.bm.logits(s), f.bm.logits(fork)));
    plugin().seq_release(fork);
}

TEST(QwenVlDecoder, GridThatDoesNotDivideItsSpanIsRefused) {
    Fixture f;
    const auto rows = random_rows(6, 3);
    const std::vector<int32_t> toks = {1, 33, 33, 33, 33, 33, 33, 2};
    for (uint32_t gw : {0u, 4u}) {
        eh_seq* s = f.bm.create();
        const eh_embd_span sp{1, 6, EH_SPAN_GRID, gw, rows.data()};
        ASSERT_EQ(plugin().seq_embd_spans(s, &sp, 1), EH_OK);
        eh_step_entry e = entry(s, toks.data(), uint32_t(toks.size()));
        EXPECT_EQ(plugin().step(f.bm.model, &e, 1), EH_INVALID_ARGUMENT) << "grid width " << gw;
        EXPECT_NE(f.bm.error().find("grid of width"), std::string::npos) << f.bm.error();
        EXPECT_EQ(plugin().seq_length(s), 0u);
        f.bm.release(s);
    }
}

TEST(QwenVlDecoder, SectionsThatDoNotCoverTheRotationAreRefused) {
    TinySpec sp = spec();
    sp.mrope_sections = {2, 3, 2, 0};
    auto v = make_tiny(sp);
    eh_load_params p = load_params(v->view());
    eh_model* m = nullptr;
    EXPECT_EQ(plugin().model_load(&p, &m), EH_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(plugin().plugin_last_error()).find("qwen2vl.rope.dimension_sections"), std::string::npos)
        << plugin().plugin_last_error();
    sp.mrope_sections = {};
    auto v2 = make_tiny(sp);
    eh_load_params p2 = load_params(v2->view());
    EXPECT_EQ(plugin().model_load(&p2, &m), EH_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(plugin().plugin_last_error()).find("missing metadata 'qwen2vl.rope.dimension_sections'"),
              std::string::npos)
        << plugin().plugin_last_error();
}

}  // namespace
