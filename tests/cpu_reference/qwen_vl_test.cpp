// Qwen2.5-VL through the cpu-reference plugin. The decoder (GGUF
// architecture qwen2vl): M-RoPE against a second, independent pass written here in double
// precision from the transformers definition (Qwen2_5_VLModel.get_rope_index
// for the positions: text advances time, row and column together, an
// image's token at row r, column c of its grid sits at (p, p + r, p + c),
// the text after it continues one past the largest; apply_multimodal_
// rotary_pos_emb for the rotation: frequency i turns by the component its
// mrope_section names, rotate-half pairing). Wrong variants (sections in
// another order, positions of one axis, text after an image continuing at
// its index) must be far from the plugin. The vision tower (mmproj
// clip.projector_type qwen2.5vl_merger): against a double-precision pass that
// follows transformers' Qwen2_5_VisionTransformerPretrainedModel step by step
// (the processor's patch order, rot_pos_emb, get_window_index with its
// padding, attention within cu_seqlens segments, the merger, the reverse
// window index), and six wrong variants.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "batched_model.hpp"
#include "double_reference.hpp"
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
    auto rms = [](const V& x, const std::vector<float>& g) { return dref::rms_norm(x, g, 1e-5); };
    const auto& lin = dref::linear;
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
            for (size_t hh = 0; hh < kHead; ++hh)
                dref::attend(q[i], hh * kHd, k, vv, hh / (kHead / kHeadKv) * kHd, 0, i + 1, kHd, att, hh * kHd);
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

// A parked copy (ABI 1.7) keeps the positions too: restored, it continues
// with the text positions after the image, not at its length.
TEST(QwenVlDecoder, ParkedCopyKeepsThePositions) {
    Fixture f;
    const Image img{2, 3, 4, random_rows(12, 13)};
    const auto all = prompt_with_image(img, 4);
    const uint32_t split = img.first + 12 + 1;
    eh_seq* s = f.bm.create();
    const eh_embd_span sp{img.first, 12, EH_SPAN_GRID, img.gw, img.rows.data()};
    ASSERT_EQ(plugin().seq_embd_spans(s, &sp, 1), EH_OK);
    eh_step_entry e = entry(s, all.data(), split, EH_STEP_LOGITS);
    ASSERT_EQ(plugin().step(f.bm.model, &e, 1), EH_OK) << f.bm.error();
    eh_parked* parked = nullptr;
    uint64_t bytes = 0;
    ASSERT_EQ(plugin().seq_park(s, split, 1ull << 30, &parked, &bytes), EH_OK) << f.bm.error();
    f.bm.release(s);
    eh_seq* back = nullptr;
    ASSERT_EQ(plugin().seq_unpark(f.bm.model, parked, all.data(), split, &back), EH_OK) << f.bm.error();
    eh_step_entry d = entry(back, &all[split], uint32_t(all.size() - split), EH_STEP_LOGITS);
    ASSERT_EQ(plugin().step(f.bm.model, &d, 1), EH_OK) << f.bm.error();
    EXPECT_LT(max_diff(f.bm.logits(back), reference(*f.view, all, &img)), 2e-4);
    plugin().seq_release(back);
    plugin().parked_release(parked);
}

// A Hugging Face directory's mrope_section (the host passes it as
// hf.rope_parameters.mrope_section, integers as I64) is read as the GGUF key.
TEST(QwenVlDecoder, HfSectionsAreTheGgufKeys) {
    Fixture f;
    TinySpec sp = spec();
    sp.mrope_sections = {};
    auto hf = make_tiny(sp);  // the same seed: the same weights
    hf->i64s("hf.rope_parameters.mrope_section", {2, 3, 3});
    BatchedModel bm{hf->view()};
    const Image img{4, 3, 5, random_rows(15, 7)};
    const auto toks = prompt_with_image(img, 6);
    eh_seq* s = bm.create();
    const eh_embd_span span{img.first, 15, EH_SPAN_GRID, img.gw, img.rows.data()};
    ASSERT_EQ(plugin().seq_embd_spans(s, &span, 1), EH_OK);
    eh_step_entry e = entry(s, toks.data(), uint32_t(toks.size()));
    ASSERT_EQ(plugin().step(bm.model, &e, 1), EH_OK) << bm.error();
    EXPECT_TRUE(same_bits(bm.logits(s), f.run(toks, &img)));
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


// ---- the vision tower

// A toy Qwen2.5-VL tower: patches of 2 pixels (tiles of 4), windows of 8
// pixels (2 x 2 merged squares), three blocks of which the second attends
// over the whole image (n_wa_pattern 2), width 16 in 2 heads.
struct Tower {
    uint32_t patch = 2, W = 16, heads = 2, F = 24, blocks = 3, wa = 2, window_px = 8, T = kEmbd;
    double eps = 1e-6;
    struct Block {
        std::vector<float> ln1, ln2, q, qb, k, kb, v, vb, o, ob, gate, gateb, up, upb, down, downb;
    };
    std::vector<float> pw0, pw1, post, mm0, mm0b, mm2, mm2b;
    std::vector<Block> b;
    explicit Tower(uint64_t seed = 5) {
        std::mt19937_64 rng(seed);
        auto rnd = [&](size_t n, float s, float off = 0.0f) {
            std::uniform_real_distribution<float> d(-s, s);
            std::vector<float> x(n);
            for (auto& e : x) e = off + d(rng);
            return x;
        };
        const size_t P = 3 * patch * patch;
        pw0 = rnd(W * P, 1.0f / std::sqrt(float(P)));
        pw1 = rnd(W * P, 1.0f / std::sqrt(float(P)));
        const float s = 1.5f / std::sqrt(float(W));
        for (uint32_t i = 0; i < blocks; ++i) {
            Block k;
            k.ln1 = rnd(W, 0.3f, 1.0f), k.ln2 = rnd(W, 0.3f, 1.0f);
            k.q = rnd(W * W, s), k.k = rnd(W * W, s), k.v = rnd(W * W, s), k.o = rnd(W * W, s);
            k.qb = rnd(W, 0.3f), k.kb = rnd(W, 0.3f), k.vb = rnd(W, 0.3f), k.ob = rnd(W, 0.3f);
            k.gate = rnd(size_t(F) * W, s), k.gateb = rnd(F, 0.3f), k.up = rnd(size_t(F) * W, s), k.upb = rnd(F, 0.3f);
            k.down = rnd(size_t(W) * F, 1.0f / std::sqrt(float(F))), k.downb = rnd(W, 0.3f);
            b.push_back(std::move(k));
        }
        post = rnd(W, 0.3f, 1.0f);
        mm0 = rnd(16 * W * W, 1.0f / std::sqrt(float(4 * W))), mm0b = rnd(4 * W, 0.3f);
        mm2 = rnd(size_t(4) * W * T, 1.0f / std::sqrt(float(4 * W))), mm2b = rnd(T, 0.3f);
    }
    // The mmproj view, as llama.cpp's converter writes it.
    std::unique_ptr<OwnedView> view(const std::string& projector = "qwen2.5vl_merger", uint32_t block_key = 0) const {
        auto v = std::make_unique<OwnedView>("clip");
        v->str("general.architecture", "clip");
        v->str("clip.projector_type", projector);
        v->u32("clip.has_vision_encoder", 1);
        v->u32("clip.vision.image_size", 32);
        v->u32("clip.vision.patch_size", patch);
        v->u32("clip.vision.embedding_length", W);
        v->u32("clip.vision.feed_forward_length", F);
        v->u32("clip.vision.block_count", block_key ? block_key : blocks);
        v->u32("clip.vision.attention.head_count", heads);
        v->u32("clip.vision.projection_dim", T);
        v->u32("clip.vision.n_wa_pattern", wa);
        v->u32("clip.vision.window_size", window_px);
        v->f32("clip.vision.attention.layer_norm_epsilon", eps);
        v->f32s("clip.vision.image_mean", {0.48145466f, 0.4578275f, 0.40821073f});
        v->f32s("clip.vision.image_std", {0.26862954f, 0.26130258f, 0.27577711f});
        const uint64_t w = W, f = F, p = patch;
        auto t = [&](const std::string& n, std::vector<uint64_t> dims, const std::vector<float>& x) {
            v->tensor(n, EH_TYPE_F32, std::move(dims), x);
        };
        t("v.patch_embd.weight", {p, p, 3, w}, pw0);
        t("v.patch_embd.weight.1", {p, p, 3, w}, pw1);
        for (uint32_t i = 0; i < blocks; ++i) {
            const Block& k = b[i];
            const std::string s = "v.blk." + std::to_string(i) + ".";
            t(s + "ln1.weight", {w}, k.ln1), t(s + "ln2.weight", {w}, k.ln2);
            t(s + "attn_q.weight", {w, w}, k.q), t(s + "attn_q.bias", {w}, k.qb);
            t(s + "attn_k.weight", {w, w}, k.k), t(s + "attn_k.bias", {w}, k.kb);
            t(s + "attn_v.weight", {w, w}, k.v), t(s + "attn_v.bias", {w}, k.vb);
            t(s + "attn_out.weight", {w, w}, k.o), t(s + "attn_out.bias", {w}, k.ob);
            t(s + "ffn_gate.weight", {w, f}, k.gate), t(s + "ffn_gate.bias", {f}, k.gateb);
            t(s + "ffn_up.weight", {w, f}, k.up), t(s + "ffn_up.bias", {f}, k.upb);
            t(s + "ffn_down.weight", {f, w}, k.down), t(s + "ffn_down.bias", {w}, k.downb);
        }
        t("v.post_ln.weight", {w}, post);
        t("mm.0.weight", {4 * w, 4 * w}, mm0), t("mm.0.bias", {4 * w}, mm0b);
        t("mm.2.weight", {4 * w, uint64_t(T)}, mm2), t("mm.2.bias", {uint64_t(T)}, mm2b);
        return v;
    }
};

struct TowerWrong {
    bool no_windows = false;        // every layer attends over the whole image
    bool all_windows = false;       // no full-attention layer
    bool rope_column_first = false; // the first quarter of frequencies by the column
    bool first_frame_only = false;  // the still image's second frame forgotten
    bool raster_patches = false;    // patches row by row, not in merge squares
    bool no_merger_norm = false;    // the merger's RMSNorm (ln_q) skipped
};

// transformers' Qwen2_5_VisionTransformerPretrainedModel.forward for one
// still image of h x w pixels (three planes, normalised), double precision:
// (h / 4) * (w / 4) rows of T.
std::vector<double> tower_reference(const Tower& m, const std::vector<float>& px, size_t hgt, size_t wid,
                                    TowerWrong wr = {}) {
    using V = std::vector<double>;
    const size_t p = m.patch, gh = hgt / p, gw = wid / p, N = gh * gw, W = m.W, hd = W / m.heads, P = 3 * p * p;
    // The processor: patches flattened as (grid_h / 2, grid_w / 2, 2, 2), features (C, T, p, p).
    std::vector<size_t> prow(N), pcol(N);
    {
        size_t n = 0;
        if (wr.raster_patches) {
            for (size_t r = 0; r < gh; ++r)
                for (size_t c = 0; c < gw; ++c) prow[n] = r, pcol[n++] = c;
        } else {
            for (size_t uy = 0; uy < gh / 2; ++uy)
                for (size_t ux = 0; ux < gw / 2; ++ux)
                    for (size_t dy = 0; dy < 2; ++dy)
                        for (size_t dx = 0; dx < 2; ++dx) prow[n] = 2 * uy + dy, pcol[n++] = 2 * ux + dx;
        }
    }
    const auto& lin = dref::linear;
    auto rms = [&](const V& x, const std::vector<float>& g) { return dref::rms_norm(x, g, m.eps); };
    std::vector<V> x(N);
    for (size_t n = 0; n < N; ++n) {
        V in(P);
        for (size_t c = 0; c < 3; ++c)
            for (size_t ky = 0; ky < p; ++ky)
                for (size_t kx = 0; kx < p; ++kx)
                    in[(c * p + ky) * p + kx] = px[(c * hgt + prow[n] * p + ky) * wid + pcol[n] * p + kx];
        // Conv3d over the two frames (the same picture): kernel 0 on frame 0 plus kernel 1 on frame 1.
        x[n] = lin(m.pw0, nullptr, in, W);
        if (!wr.first_frame_only) {
            const V second = lin(m.pw1, nullptr, in, W);
            for (size_t e = 0; e < W; ++e) x[n][e] += second[e];
        }
    }
    // rot_pos_emb: VisionRotaryEmbedding(hd / 2), (row, column) per patch.
    const size_t quarter = hd / 4;
    std::vector<V> angle(N, V(hd / 2));
    for (size_t n = 0; n < N; ++n)
        for (size_t i = 0; i < quarter; ++i) {
            const double inv = 1.0 / std::pow(10000.0, double(2 * i) / double(hd / 2));
            const double a = double(wr.rope_column_first ? pcol[n] : prow[n]), b = double(wr.rope_column_first ? prow[n] : pcol[n]);
            angle[n][i] = a * inv;
            angle[n][quarter + i] = b * inv;
        }
    // get_window_index: the merged grid padded to whole windows, windows row
    // by row, each its units row by row; -100 padding dropped.
    const size_t win = m.window_px / 2 / p, lh = gh / 2, lw = gw / 2;
    const size_t nwh = (lh + win - 1) / win + (lh % win == 0 ? 1 : 0), nww = (lw + win - 1) / win + (lw % win == 0 ? 1 : 0);
    std::vector<size_t> window_index, cu = {0};
    for (size_t a = 0; a < nwh; ++a)
        for (size_t c = 0; c < nww; ++c) {
            size_t count = 0;
            for (size_t i = 0; i < win; ++i)
                for (size_t j = 0; j < win; ++j) {
                    const size_t r = a * win + i, col = c * win + j;
                    if (r < lh && col < lw) window_index.push_back(r * lw + col), ++count;
                }
            cu.push_back(cu.back() + count * 4);
        }
    // Reorder patches (in fours) and their angles by the window index.
    std::vector<V> xs, angs;
    for (size_t u : window_index)
        for (size_t k = 0; k < 4; ++k) xs.push_back(x[u * 4 + k]), angs.push_back(angle[u * 4 + k]);
    x.swap(xs);
    auto rope = [&](V& v, const V& ang) {
        for (size_t hh = 0; hh < m.heads; ++hh)
            for (size_t i = 0; i < hd / 2; ++i) {
                const double a = v[hh * hd + i], b = v[hh * hd + i + hd / 2];
                v[hh * hd + i] = a * std::cos(ang[i]) - b * std::sin(ang[i]);
                v[hh * hd + i + hd / 2] = b * std::cos(ang[i]) + a * std::sin(ang[i]);
            }
    };
    for (size_t il = 0; il < m.blocks; ++il) {
        const Tower::Block& k = m.b[il];
        const bool full = wr.no_windows || (!wr.all_windows && (il + 1) % m.wa == 0);
        const std::vector<size_t> seg = full ? std::vector<size_t>{0, N} : cu;
        std::vector<V> q(N), kk(N), v(N);
        for (size_t n = 0; n < N; ++n) {
            const V h = rms(x[n], k.ln1);
            q[n] = lin(k.q, &k.qb, h, W), kk[n] = lin(k.k, &k.kb, h, W), v[n] = lin(k.v, &k.vb, h, W);
            rope(q[n], angs[n]), rope(kk[n], angs[n]);
        }
        for (size_t sgi = 0; sgi + 1 < seg.size(); ++sgi)
            for (size_t n = seg[sgi]; n < seg[sgi + 1]; ++n) {
                V att(W, 0.0);
                for (size_t hh = 0; hh < m.heads; ++hh)
                    dref::attend(q[n], hh * hd, kk, v, hh * hd, seg[sgi], seg[sgi + 1], hd, att, hh * hd);
                const V o = lin(k.o, &k.ob, att, W);
                for (size_t e = 0; e < W; ++e) x[n][e] += o[e];
            }
        for (size_t n = 0; n < N; ++n) {
            const V h = rms(x[n], k.ln2);
            V g = lin(k.gate, &k.gateb, h, m.F);
            const V u = lin(k.up, &k.upb, h, m.F);
            for (size_t f = 0; f < m.F; ++f) g[f] = g[f] / (1.0 + std::exp(-g[f])) * u[f];
            const V d = lin(k.down, &k.downb, g, W);
            for (size_t e = 0; e < W; ++e) x[n][e] += d[e];
        }
    }
    // The merger over the window order, then argsort(window_index) undoes it.
    const size_t M = N / 4;
    std::vector<V> merged(M);
    for (size_t u = 0; u < M; ++u) {
        V cat;
        for (size_t k = 0; k < 4; ++k) {
            const V r = wr.no_merger_norm ? x[u * 4 + k] : rms(x[u * 4 + k], m.post);
            cat.insert(cat.end(), r.begin(), r.end());
        }
        V mid = lin(m.mm0, &m.mm0b, cat, 4 * W);
        for (double& a : mid) a = 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0)));
        merged[window_index[u]] = lin(m.mm2, &m.mm2b, mid, m.T);
    }
    std::vector<double> out;
    for (const V& r : merged) out.insert(out.end(), r.begin(), r.end());
    return out;
}

std::vector<float> random_image(size_t h, size_t w, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-1.5f, 1.5f);
    std::vector<float> px(3 * h * w);
    for (auto& e : px) e = d(rng);
    return px;
}

struct TowerFixture {
    std::unique_ptr<OwnedView> text = make_tiny(spec());
    Tower tower;
    std::unique_ptr<OwnedView> mm = tower.view();
    BatchedModel bm{text->view()};
    eh_image_encoder_info info{};
    TowerFixture() {
        info.struct_size = sizeof(info);
        if (plugin().image_encoder_load(bm.model, mm->view(), &info) != EH_OK)
            throw std::runtime_error("image_encoder_load: " + bm.error());
    }
    std::vector<float> encode(const std::vector<float>& px, uint32_t h, uint32_t w) {
        std::vector<float> rows(size_t(h / 4) * (w / 4) * info.n_embd);
        EXPECT_EQ(plugin().image_encode_sized(bm.model, px.data(), w, h, rows.data()), EH_OK) << bm.error();
        return rows;
    }
};

TEST(QwenVlTower, InfoSaysTileLimitsAndGrid) {
    TowerFixture f;
    EXPECT_EQ(f.info.tile, 4u);
    EXPECT_EQ(f.info.min_tokens, 4u);
    EXPECT_EQ(f.info.max_tokens, 1024u);
    EXPECT_EQ(f.info.span_flags, uint32_t(EH_SPAN_GRID));
    EXPECT_EQ(f.info.n_embd, kEmbd);
    EXPECT_EQ(f.info.image_width, 32u);
    EXPECT_EQ(f.info.n_tokens, 64u);
    EXPECT_FLOAT_EQ(f.info.mean[0], 0.48145466f);
    EXPECT_FLOAT_EQ(f.info.std[2], 0.27577711f);
}

TEST(QwenVlTower, MatchesTransformersDefinition) {
    TowerFixture f;
    // 12 x 20 pixels: a 6 x 10 patch grid, 3 x 5 merged squares, windows of
    // 2 x 2 squares cut short at the bottom and right edges.
    const uint32_t h = 12, w = 20;
    const auto px = random_image(h, w, 21);
    const auto got = f.encode(px, h, w);
    const auto want = tower_reference(f.tower, px, h, w);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(max_diff(got, want), 2e-4);
    const TowerWrong wrongs[] = {{.no_windows = true},        {.all_windows = true},   {.rope_column_first = true},
                                 {.first_frame_only = true}, {.raster_patches = true}, {.no_merger_norm = true}};
    for (size_t i = 0; i < std::size(wrongs); ++i)
        EXPECT_GT(max_diff(got, tower_reference(f.tower, px, h, w, wrongs[i])), 1e-3) << "wrong variant " << i;
    // A square image whose windows divide it: transformers pads a whole extra
    // (empty) window row and column; the rows are the same.
    const auto sq = random_image(16, 16, 22);
    EXPECT_LT(max_diff(f.encode(sq, 16, 16), tower_reference(f.tower, sq, 16, 16)), 2e-4);
}

TEST(QwenVlTower, RefusesSizesAndTypesByName) {
    TowerFixture f;
    std::vector<float> px(3 * 64 * 64), rows(1024 * kEmbd);
    EXPECT_EQ(plugin().image_encode_sized(f.bm.model, px.data(), 18, 12, rows.data()), EH_INVALID_ARGUMENT);
    EXPECT_NE(f.bm.error().find("multiple of 4"), std::string::npos) << f.bm.error();
    EXPECT_EQ(plugin().image_encode_sized(f.bm.model, px.data(), 4, 8, rows.data()), EH_INVALID_ARGUMENT);  // 2 tiles
    // The fixed-size call is refused: the encoder needs the size.
    EXPECT_EQ(plugin().image_encode(f.bm.model, px.data(), rows.data()), EH_INVALID_ARGUMENT);
    EXPECT_NE(f.bm.error().find("image_encode_sized"), std::string::npos) << f.bm.error();
    // A file missing the second frame, or for another width.
    auto text = make_tiny(spec());
    BatchedModel bm{text->view()};
    eh_image_encoder_info info{};
    info.struct_size = sizeof(info);
    auto mm = f.tower.view();
    mm->remove("v.patch_embd.weight.1");
    EXPECT_EQ(plugin().image_encoder_load(bm.model, mm->view(), &info), EH_MODEL_LOAD_FAILED);
    EXPECT_NE(bm.error().find("v.patch_embd.weight.1"), std::string::npos) << bm.error();
    // A host before 1.8 (a 48-byte info) cannot take an encoder with a tile.
    eh_image_encoder_info old{};
    old.struct_size = 48;
    EXPECT_EQ(plugin().image_encoder_load(bm.model, f.tower.view()->view(), &old), EH_UNSUPPORTED);
    EXPECT_NE(bm.error().find("ABI 1.8"), std::string::npos) << bm.error();
    EXPECT_EQ(old.tile, 0u);
    // A block count no tower has: refused before anything is sized by it.
    EXPECT_EQ(plugin().image_encoder_load(bm.model, f.tower.view("qwen2.5vl_merger", 1u << 20)->view(), &info),
              EH_MODEL_LOAD_FAILED);
    EXPECT_NE(bm.error().find("block_count 1048576 is more than 1024"), std::string::npos) << bm.error();
    Tower other;
    other.T = 32;
    other.mm2 = std::vector<float>(size_t(4) * other.W * 32, 0.01f), other.mm2b = std::vector<float>(32, 0.0f);
    EXPECT_EQ(plugin().image_encoder_load(bm.model, other.view()->view(), &info), EH_MODEL_LOAD_FAILED);
    EXPECT_NE(bm.error().find("projection_dim"), std::string::npos) << bm.error();
}

// The tower's rows on their grid in the decoder: the image changes the
// logits, and a grid span gives what the decoder's own reference gives
// for those rows.
TEST(QwenVlTower, RowsOnTheirGridInTheDecoder) {
    TowerFixture f;
    const uint32_t h = 12, w = 20;
    Image img{3, h / 4, w / 4, f.encode(random_image(h, w, 23), h, w)};
    const auto toks = prompt_with_image(img, 4);
    eh_seq* s = f.bm.create();
    const eh_embd_span sp{img.first, img.gh * img.gw, f.info.span_flags, img.gw, img.rows.data()};
    ASSERT_EQ(plugin().seq_embd_spans(s, &sp, 1), EH_OK);
    eh_step_entry e = entry(s, toks.data(), uint32_t(toks.size()));
    ASSERT_EQ(plugin().step(f.bm.model, &e, 1), EH_OK) << f.bm.error();
    EXPECT_LT(max_diff(f.bm.logits(s), reference(*f.text, toks, &img)), 2e-4);
    Image other = img;
    other.rows = f.encode(random_image(h, w, 24), h, w);
    EXPECT_GT(max_diff(f.bm.logits(s), reference(*f.text, toks, &other)), 1e-3);
}

}  // namespace
