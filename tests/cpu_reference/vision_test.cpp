// Images in through the cpu-reference plugin (ABI 1.6): Gemma 3's encoder
// from an mmproj view against a second, independent pass written here in
// double precision from the transformers definition (SigLIP: patch conv,
// learned positions, pre-LN blocks of full attention and a gelu_tanh MLP,
// post-LN; Gemma3MultiModalProjector: average pooling of the patch grid,
// RMSNorm with (1 + w), a [width, text] projection), and the step's
// embedding spans: rows replace token embeddings, a bidirectional span's
// tokens see each other, spans last one step, bad spans change nothing.
// Each step of the encoder is also computed wrongly on purpose, and the
// plugin must be far from every wrong variant.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "batched_model.hpp"
#include "double_reference.hpp"
#include "plugin_handle.hpp"
#include "synthetic_model.hpp"

using namespace cpuref_test;

namespace {

// A tiny SigLIP + Gemma 3 projector: 16x16 pixels in patches of 2 (an 8x8
// grid) pooled by 2 into 16 tokens.
struct Vit {
    uint32_t size = 16, patch = 2, W = 12, heads = 3, F = 20, blocks = 2, merge = 2, T = 32;
    double eps = 1e-6;
    struct Block {
        std::vector<float> ln1w, ln1b, ln2w, ln2b, q, qb, k, kb, v, vb, o, ob, up, upb, down, downb;
    };
    std::vector<float> pw, pb, pos, postw, postb, soft, proj;  // soft: Gemma's w (the file stores 1 + w); proj [W][T]
    std::vector<Block> b;
    uint32_t grid() const { return size / patch; }
    uint32_t n_tokens() const { return (grid() / merge) * (grid() / merge); }

    explicit Vit(uint32_t text_width, uint64_t seed = 3) : T(text_width) {
        std::mt19937_64 rng(seed);
        auto rnd = [&](size_t n, float s) {
            std::uniform_real_distribution<float> d(-s, s);
            std::vector<float> x(n);
            for (auto& e : x) e = d(rng);
            return x;
        };
        const size_t P = 3 * patch * patch, N = size_t(grid()) * grid();
        pw = rnd(W * P, 1.0f / std::sqrt(float(P)));
        pb = rnd(W, 0.5f);
        pos = rnd(N * W, 0.5f);
        for (uint32_t i = 0; i < blocks; ++i) {
            Block k;
            k.ln1w = rnd(W, 1.0f), k.ln1b = rnd(W, 0.5f), k.ln2w = rnd(W, 1.0f), k.ln2b = rnd(W, 0.5f);
            const float s = 1.5f / std::sqrt(float(W));
            k.q = rnd(W * W, s), k.k = rnd(W * W, s), k.v = rnd(W * W, s), k.o = rnd(W * W, s);
            k.qb = rnd(W, 0.3f), k.kb = rnd(W, 0.3f), k.vb = rnd(W, 0.3f), k.ob = rnd(W, 0.3f);
            k.up = rnd(size_t(F) * W, s), k.upb = rnd(F, 0.3f), k.down = rnd(size_t(W) * F, 1.0f / std::sqrt(float(F)));
            k.downb = rnd(W, 0.3f);
            b.push_back(std::move(k));
        }
        postw = rnd(W, 1.0f), postb = rnd(W, 0.5f), soft = rnd(W, 0.5f);
        proj = rnd(size_t(W) * T, 1.0f / std::sqrt(float(W)));
    }
};

// The mmproj view, as llama.cpp's converter writes it.
class MmprojView {
public:
    MmprojView(const Vit& m, const std::string& projector = "gemma3") {
        str("general.architecture", "clip");
        str("clip.projector_type", projector);
        u32("clip.vision.image_size", m.size);
        u32("clip.vision.patch_size", m.patch);
        u32("clip.vision.embedding_length", m.W);
        u32("clip.vision.feed_forward_length", m.F);
        u32("clip.vision.block_count", m.blocks);
        u32("clip.vision.attention.head_count", m.heads);
        u32("clip.vision.projection_dim", m.T);
        u32("clip.vision.projector.scale_factor", m.merge);
        f32("clip.vision.attention.layer_norm_epsilon", m.eps);
        floats3("clip.vision.image_mean", {0.5f, 0.25f, 0.125f});
        floats3("clip.vision.image_std", {0.5f, 0.75f, 1.0f});
        const uint64_t W = m.W, F = m.F, p = m.patch, N = uint64_t(m.grid()) * m.grid();
        tensor("v.patch_embd.weight", {p, p, 3, W}, m.pw);
        tensor("v.patch_embd.bias", {W}, m.pb);
        tensor("v.position_embd.weight", {W, N}, m.pos);
        for (uint32_t i = 0; i < m.blocks; ++i) {
            const Vit::Block& k = m.b[i];
            const std::string s = "v.blk." + std::to_string(i) + ".";
            tensor(s + "ln1.weight", {W}, k.ln1w), tensor(s + "ln1.bias", {W}, k.ln1b);
            tensor(s + "ln2.weight", {W}, k.ln2w), tensor(s + "ln2.bias", {W}, k.ln2b);
            tensor(s + "attn_q.weight", {W, W}, k.q), tensor(s + "attn_q.bias", {W}, k.qb);
            tensor(s + "attn_k.weight", {W, W}, k.k), tensor(s + "attn_k.bias", {W}, k.kb);
            tensor(s + "attn_v.weight", {W, W}, k.v), tensor(s + "attn_v.bias", {W}, k.vb);
            tensor(s + "attn_out.weight", {W, W}, k.o), tensor(s + "attn_out.bias", {W}, k.ob);
            tensor(s + "ffn_up.weight", {W, F}, k.up), tensor(s + "ffn_up.bias", {F}, k.upb);
            tensor(s + "ffn_down.weight", {F, W}, k.down), tensor(s + "ffn_down.bias", {W}, k.downb);
        }
        tensor("v.post_ln.weight", {W}, m.postw), tensor("v.post_ln.bias", {W}, m.postb);
        std::vector<float> stored = m.soft;
        for (float& x : stored) x += 1.0f;  // the converter's correction
        tensor("mm.soft_emb_norm.weight", {W}, stored);
        tensor("mm.input_projection.weight", {uint64_t(m.T), W}, m.proj);
    }
    void remove(const std::string& name) {
        for (size_t i = 0; i < tensors_.size(); ++i)
            if (std::string(tensors_[i].name.data, tensors_[i].name.size) == name) tensors_.erase(tensors_.begin() + long(i));
    }
    const eh_model_view* view() {
        view_ = {};
        view_.struct_size = sizeof(view_);
        view_.format = EH_FORMAT_GGUF;
        view_.architecture = s("clip");
        view_.n_metadata = kvs_.size();
        view_.metadata = kvs_.data();
        view_.n_tensors = tensors_.size();
        view_.tensors = tensors_.data();
        return &view_;
    }

private:
    eh_string s(const std::string& v) {
        const std::string& x = strings_.emplace_back(v);
        return {x.data(), x.size()};
    }
    eh_value& add(const std::string& key, uint32_t type) {
        eh_metadata_kv kv{};
        kv.key = s(key);
        kv.value.type = type;
        kv.value.count = 1;
        kvs_.push_back(kv);
        return kvs_.back().value;
    }
    void str(const std::string& k, const std::string& v) { add(k, EH_VALUE_STRING).v.str = s(v); }
    void u32(const std::string& k, uint64_t v) { add(k, EH_VALUE_U32).v.u64 = v; }
    void f32(const std::string& k, double v) { add(k, EH_VALUE_F32).v.f64 = v; }
    void floats3(const std::string& k, std::vector<float> v) {
        const auto& stored = arrays_.emplace_back(std::move(v));
        eh_value& x = add(k, EH_VALUE_ARRAY);
        x.elem_type = EH_VALUE_F32;
        x.count = stored.size();
        x.v.array = stored.data();
    }
    void tensor(const std::string& name, std::vector<uint64_t> dims, const std::vector<float>& values) {
        const auto& stored = arrays_.emplace_back(values);
        eh_tensor t{};
        t.name = s(name);
        t.type = EH_TYPE_F32;
        t.n_dims = uint32_t(dims.size());
        for (size_t i = 0; i < EH_MAX_DIMS; ++i) t.dims[i] = i < dims.size() ? dims[i] : 1;
        t.data = stored.data();
        t.nbytes = stored.size() * sizeof(float);
        tensors_.push_back(t);
    }
    std::deque<std::string> strings_;
    std::deque<std::vector<float>> arrays_;
    std::vector<eh_metadata_kv> kvs_;
    std::vector<eh_tensor> tensors_;
    eh_model_view view_{};
};

struct Wrong {
    bool causal = false, no_post_ln = false, plain_norm_weight = false, no_positions = false, pool_columns_first = false;
};

// The encoder in double precision: n_tokens rows of T.
std::vector<double> reference(const Vit& m, const std::vector<float>& px, Wrong w = {}) {
    const size_t W = m.W, p = m.patch, G = m.grid(), N = G * G, P = 3 * p * p, hd = W / m.heads, S = m.size;
    using V = std::vector<double>;
    auto ln = [&](const V& x, const std::vector<float>& g, const std::vector<float>& b) {
        double mean = 0, var = 0;
        for (double e : x) mean += e;
        mean /= double(x.size());
        for (double e : x) var += (e - mean) * (e - mean);
        var /= double(x.size());
        V y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) / std::sqrt(var + m.eps) * g[i] + b[i];
        return y;
    };
    auto lin = [](const std::vector<float>& Wt, const std::vector<float>& b, const V& x, size_t rows) {
        return dref::linear(Wt, &b, x, rows);
    };
    std::vector<V> x(N);
    for (size_t py = 0; py < G; ++py)
        for (size_t qx = 0; qx < G; ++qx) {
            V in(P);
            for (size_t c = 0; c < 3; ++c)
                for (size_t ky = 0; ky < p; ++ky)
                    for (size_t kx = 0; kx < p; ++kx)
                        in[(c * p + ky) * p + kx] = px[(c * S + py * p + ky) * S + qx * p + kx];
            const size_t n = py * G + qx;
            x[n] = lin(m.pw, m.pb, in, W);
            if (!w.no_positions)
                for (size_t e = 0; e < W; ++e) x[n][e] += m.pos[n * W + e];
        }
    for (const Vit::Block& k : m.b) {
        std::vector<V> q(N), kk(N), v(N);
        for (size_t n = 0; n < N; ++n) {
            const V h = ln(x[n], k.ln1w, k.ln1b);
            q[n] = lin(k.q, k.qb, h, W), kk[n] = lin(k.k, k.kb, h, W), v[n] = lin(k.v, k.vb, h, W);
        }
        for (size_t n = 0; n < N; ++n) {
            V att(W, 0.0);
            for (size_t hh = 0; hh < m.heads; ++hh)
                dref::attend(q[n], hh * hd, kk, v, hh * hd, 0, w.causal ? n + 1 : N, hd, att, hh * hd);
            const V o = lin(k.o, k.ob, att, W);
            for (size_t e = 0; e < W; ++e) x[n][e] += o[e];
        }
        for (size_t n = 0; n < N; ++n) {
            V u = lin(k.up, k.upb, ln(x[n], k.ln2w, k.ln2b), m.F);
            for (double& a : u) a = 0.5 * a * (1.0 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
            const V d = lin(k.down, k.downb, u, W);
            for (size_t e = 0; e < W; ++e) x[n][e] += d[e];
        }
    }
    if (!w.no_post_ln)
        for (auto& r : x) r = ln(r, m.postw, m.postb);
    const size_t k = m.merge, n = G / k;
    std::vector<double> out;
    for (size_t oy = 0; oy < n; ++oy)
        for (size_t ox = 0; ox < n; ++ox) {
            V pooled(W, 0.0);
            for (size_t a = 0; a < k; ++a)
                for (size_t c = 0; c < k; ++c) {
                    const size_t row = w.pool_columns_first ? (ox * k + c) * G + oy * k + a : (oy * k + a) * G + ox * k + c;
                    for (size_t e = 0; e < W; ++e) pooled[e] += x[row][e] / double(k * k);
                }
            double ss = 0;
            for (double e : pooled) ss += e * e;
            const double inv = 1.0 / std::sqrt(ss / double(W) + m.eps);
            for (size_t e = 0; e < W; ++e) pooled[e] *= inv * ((w.plain_norm_weight ? 0.0 : 1.0) + m.soft[e]);
            for (size_t t = 0; t < m.T; ++t) {
                double s = 0;
                for (size_t e = 0; e < W; ++e) s += pooled[e] * m.proj[e * m.T + t];
                out.push_back(s);
            }
        }
    return out;
}

double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
    return d;
}

std::vector<float> random_pixels(const Vit& m, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> px(3 * size_t(m.size) * m.size);
    for (auto& e : px) e = d(rng);
    return px;
}

TinySpec text_spec() {
    TinySpec sp;
    sp.n_embd = 32;
    sp.n_head = 4;
    sp.n_head_kv = 2;
    sp.n_ff = 48;
    sp.n_vocab = 40;
    return sp;
}

struct Loaded2 {
    std::unique_ptr<OwnedView> text = make_tiny(text_spec());
    Vit vit{32};
    MmprojView mm{vit};
    BatchedModel bm{text->view()};
    eh_image_encoder_info info{};
    Loaded2() {
        info.struct_size = sizeof(info);
        if (plugin().image_encoder_load(bm.model, mm.view(), &info) != EH_OK)
            throw std::runtime_error("image_encoder_load: " + bm.error());
    }
    std::vector<float> encode(const std::vector<float>& px) {
        std::vector<float> rows(size_t(info.n_tokens) * info.n_embd);
        EXPECT_EQ(plugin().image_encode(bm.model, px.data(), rows.data()), EH_OK) << bm.error();
        return rows;
    }
    // Last-position logits of `tokens` in one step, with `spans`.
    std::vector<float> run(const std::vector<int32_t>& tokens, const std::vector<eh_embd_span>& spans) {
        eh_seq* s = bm.create();
        EXPECT_EQ(plugin().seq_embd_spans(s, spans.data(), uint32_t(spans.size())), EH_OK) << bm.error();
        eh_step_entry e = entry(s, tokens.data(), uint32_t(tokens.size()));
        EXPECT_EQ(plugin().step(bm.model, &e, 1), EH_OK) << bm.error();
        auto l = bm.logits(s);
        bm.release(s);
        return l;
    }
};

TEST(Vision, EncoderMatchesTransformersDefinition) {
    Loaded2 L;
    EXPECT_EQ(L.info.image_width, 16u);
    EXPECT_EQ(L.info.image_height, 16u);
    EXPECT_EQ(L.info.n_tokens, 16u);
    EXPECT_EQ(L.info.n_embd, 32u);
    EXPECT_EQ(L.info.span_flags, EH_SPAN_BIDIRECTIONAL);
    EXPECT_FLOAT_EQ(L.info.mean[1], 0.25f);
    EXPECT_FLOAT_EQ(L.info.std[1], 0.75f);
    const auto px = random_pixels(L.vit, 11);
    const auto got = L.encode(px);
    const auto want = reference(L.vit, px);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(max_diff(got, want), 2e-4);
    const Wrong wrongs[] = {{.causal = true}, {.no_post_ln = true}, {.plain_norm_weight = true},
                            {.no_positions = true}, {.pool_columns_first = true}};
    for (size_t i = 0; i < std::size(wrongs); ++i)
        EXPECT_GT(max_diff(got, reference(L.vit, px, wrongs[i])), 1e-2) << "wrong variant " << i;
    // Another image, other rows.
    EXPECT_GT(max_diff(got, reference(L.vit, random_pixels(L.vit, 12))), 1e-2);
}

TEST(Vision, EncoderLoadRefusesByName) {
    auto text = make_tiny(text_spec());
    BatchedModel bm{text->view()};
    eh_image_encoder_info info{};
    info.struct_size = sizeof(info);
    {
        Vit vit(32);
        MmprojView mm(vit, "mlp");  // llava's
        EXPECT_EQ(plugin().image_encoder_load(bm.model, mm.view(), &info), EH_UNSUPPORTED);
        EXPECT_NE(bm.error().find("'mlp'"), std::string::npos) << bm.error();
    }
    {
        Vit vit(24);  // a projector for a 24-wide model
        MmprojView mm(vit);
        EXPECT_EQ(plugin().image_encoder_load(bm.model, mm.view(), &info), EH_MODEL_LOAD_FAILED);
        EXPECT_NE(bm.error().find("projection_dim"), std::string::npos) << bm.error();
    }
    {
        Vit vit(32);
        MmprojView mm(vit);
        mm.remove("v.post_ln.bias");
        EXPECT_EQ(plugin().image_encoder_load(bm.model, mm.view(), &info), EH_MODEL_LOAD_FAILED);
        EXPECT_NE(bm.error().find("v.post_ln.bias"), std::string::npos) << bm.error();
    }
    std::vector<float> px(3 * 16 * 16), rows(16 * 32);
    EXPECT_EQ(plugin().image_encode(bm.model, px.data(), rows.data()), EH_INVALID_ARGUMENT);
}

TEST(Vision, RowsReplaceTokenEmbeddings) {
    Loaded2 L;
    const std::vector<int32_t> toks = {1, 7, 9, 3, 5};
    const auto plain = L.run(toks, {});
    // Token 9's own embedding row (llama: unscaled) in its place: the same bits.
    const eh_tensor* te = nullptr;
    const eh_model_view* tv = L.text->view();
    for (uint64_t i = 0; i < tv->n_tensors; ++i)
        if (std::string(tv->tensors[i].name.data, tv->tensors[i].name.size) == "token_embd.weight") te = &tv->tensors[i];
    ASSERT_TRUE(te && te->type == EH_TYPE_F32);
    std::vector<float> own(static_cast<const float*>(te->data) + 9 * 32, static_cast<const float*>(te->data) + 10 * 32);
    EXPECT_TRUE(same_bits(plain, L.run(toks, {{2, 1, 0, 0, own.data()}})));
    // An image's rows: other logits, and other ones for another image.
    const auto img = L.encode(random_pixels(L.vit, 1)), img2 = L.encode(random_pixels(L.vit, 2));
    std::vector<int32_t> prompt = {1, 2};
    prompt.insert(prompt.end(), 16, 4);
    prompt.push_back(3), prompt.push_back(5);
    const auto a = L.run(prompt, {{2, 16, EH_SPAN_BIDIRECTIONAL, 0, img.data()}});
    const auto b = L.run(prompt, {{2, 16, EH_SPAN_BIDIRECTIONAL, 0, img2.data()}});
    const auto none = L.run(prompt, {});
    EXPECT_GT(max_abs_diff(a, none), 1e-3f);
    EXPECT_GT(max_abs_diff(a, b), 1e-3f);
}

TEST(Vision, BidirectionalSpanSeesItsLaterRows) {
    Loaded2 L;
    const auto img = L.encode(random_pixels(L.vit, 5));
    std::vector<int32_t> prompt = {1};
    prompt.insert(prompt.end(), 16, 4);
    prompt.push_back(3);
    const auto bi = L.run(prompt, {{1, 16, EH_SPAN_BIDIRECTIONAL, 0, img.data()}});
    const auto causal = L.run(prompt, {{1, 16, 0, 0, img.data()}});
    EXPECT_GT(max_abs_diff(bi, causal), 1e-4f);
    // One position seeing itself "both ways" is plain causal attention.
    EXPECT_TRUE(same_bits(L.run(prompt, {{1, 1, EH_SPAN_BIDIRECTIONAL, 0, img.data()}}),
                          L.run(prompt, {{1, 1, 0, 0, img.data()}})));
    // Batched beside another sequence: the same bits.
    eh_seq* s1 = L.bm.create();
    eh_seq* s2 = L.bm.create();
    const eh_embd_span sp{1, 16, EH_SPAN_BIDIRECTIONAL, 0, img.data()};
    ASSERT_EQ(plugin().seq_embd_spans(s2, &sp, 1), EH_OK);
    const std::vector<int32_t> other = {2, 3, 4};
    eh_step_entry e[2] = {entry(s1, other.data(), 3), entry(s2, prompt.data(), uint32_t(prompt.size()))};
    ASSERT_EQ(plugin().step(L.bm.model, e, 2), EH_OK) << L.bm.error();
    EXPECT_TRUE(same_bits(L.bm.logits(s2), bi));
}

TEST(Vision, SpansLastOneStepAndBadOnesChangeNothing) {
    Loaded2 L;
    const auto img = L.encode(random_pixels(L.vit, 5));
    std::vector<int32_t> prompt(4, 4);
    eh_seq* s = L.bm.create();
    // Past the entry's tokens: refused by name, nothing appended.
    eh_embd_span bad{2, 16, 0, 0, img.data()};
    ASSERT_EQ(plugin().seq_embd_spans(s, &bad, 1), EH_OK);
    eh_step_entry e = entry(s, prompt.data(), 4);
    EXPECT_EQ(plugin().step(L.bm.model, &e, 1), EH_INVALID_ARGUMENT);
    EXPECT_NE(L.bm.error().find("step entry 0"), std::string::npos) << L.bm.error();
    EXPECT_EQ(plugin().seq_length(s), 0u);
    // The refused spans are gone too: the next step reads the tokens.
    ASSERT_EQ(plugin().step(L.bm.model, &e, 1), EH_OK) << L.bm.error();
    const auto plain = L.bm.logits(s);
    EXPECT_TRUE(same_bits(plain, L.run(prompt, {})));
    // Overlapping spans are refused.
    eh_seq* s2 = L.bm.create();
    const eh_embd_span two[2] = {{0, 2, 0, 0, img.data()}, {1, 2, 0, 0, img.data()}};
    ASSERT_EQ(plugin().seq_embd_spans(s2, two, 2), EH_OK);
    eh_step_entry e2 = entry(s2, prompt.data(), 4);
    EXPECT_EQ(plugin().step(L.bm.model, &e2, 1), EH_INVALID_ARGUMENT);
    // A span used once is not used again.
    const eh_embd_span ok{0, 2, 0, 0, img.data()};
    ASSERT_EQ(plugin().seq_embd_spans(s2, &ok, 1), EH_OK);
    ASSERT_EQ(plugin().step(L.bm.model, &e2, 1), EH_OK) << L.bm.error();
    const std::vector<int32_t> more = {5};
    eh_step_entry e3 = entry(s2, more.data(), 1);
    ASSERT_EQ(plugin().step(L.bm.model, &e3, 1), EH_OK) << L.bm.error();
    eh_seq* s3 = L.bm.create();
    std::vector<int32_t> all = prompt;
    all.push_back(5);
    const eh_embd_span ok3{0, 2, 0, 0, img.data()};
    ASSERT_EQ(plugin().seq_embd_spans(s3, &ok3, 1), EH_OK);
    eh_step_entry e4 = entry(s3, all.data(), 5);
    ASSERT_EQ(plugin().step(L.bm.model, &e4, 1), EH_OK) << L.bm.error();
    EXPECT_LT(max_abs_diff(L.bm.logits(s2), L.bm.logits(s3)), 1e-5f);
}

}  // namespace
