// Diagnostic for issue 8: why gpt-cuda and the CPU reference disagree on
// the top-1 token at some positions of the forged real-shape gpt-oss-20b.
//
// A step-by-step copy of the CPU reference's forward pass (its own building
// blocks from eh_cpuref_core, same order of operations) runs twice: with an
// FP32 KV cache as the reference plugin keeps it by default, and with K and
// V rounded to FP16 as gpt-cuda's KV pool stores them. It records each
// layer's selected expert set. gpt-cuda runs one sequence through its
// batched step. Per pair the test prints top-1 agreement, the max relative
// logit error (max |a - b| over max |b|, per position), the reference's
// top1-top2 margin at the positions that disagree, and per layer how many
// tokens' expert sets differ. That separates a bug (gpt-cuda far from both
// copies) from precision (gpt-cuda matches the copy with the same cache
// precision).
//
// Result on the H200 (issue 8, then gpt-cuda's FP16 session cache, the
// pool's precision): 113/128 against the FP32 reference, logit error median
// 2.8 %, max 24 %, all 15 misses within 2x the error of the reference's
// top1-top2 margin; the FP16 copy on the CPU gives 114/128 and matches
// gpt-cuda 127/128 (median 3.6e-3); expert sets first differ at position 40
// and then in 1..18 of 128 tokens per layer, growing with depth. So no
// real-shape bug: the FP16 cache's rounding, amplified by router near-ties.
// The test asserts that reading: gpt-cuda agrees with the FP16 copy.
//
// Heavy (forges or reads the 13 GB model, four passes over 128 positions):
// runs only with EH_FORGED_DIR holding gpt-oss-20b-mxfp4.gguf or with
// EH_GPT_DIAG=1 (then it forges into the temp dir).
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <eh/model/model_file.hpp>
#include <eh/tools/forge.hpp>

#include "model.hpp"  // cpu-reference core
#include "compare.hpp"
#include "plugins.hpp"

namespace fs = std::filesystem;
using namespace gpttest;

namespace {

constexpr const char* kProfile = "gpt-oss-20b-mxfp4";
constexpr int kPositions = 128;

std::string model_20b() {
    if (const char* dir = std::getenv("EH_FORGED_DIR")) {
        fs::path p = fs::path(dir) / (std::string(kProfile) + ".gguf");
        if (fs::exists(p)) return p.string();
    }
    if (!std::getenv("EH_GPT_DIAG")) return {};
    fs::path p = fs::temp_directory_path() / ("eh-agreement-" + std::string(kProfile) + ".gguf");
    if (!fs::exists(p)) {
        eh::tools::ForgeOptions o;
        o.profile = kProfile;
        o.out = p.string();
        o.seed = 1;
        eh::tools::forge(o);
    }
    return p.string();
}

using Routes = std::vector<std::vector<std::array<int, 32>>>;  // [position][layer] sorted ids, -1 padded

// The reference's forward pass for one token at a time, instrumented.
class Replica {
public:
    Replica(const cpuref::Model& m, bool kv_f16, int n_ctx) : m_(m), kv_f16_(kv_f16) {
        const auto& c = m.config();
        const size_t kv_dim = size_t(c.n_head_kv) * c.head_dim;
        kc_.assign(c.n_layer, std::vector<float>(size_t(n_ctx) * kv_dim));
        vc_.assign(c.n_layer, std::vector<float>(size_t(n_ctx) * kv_dim));
    }

    // Logits after `tok` at the next position; routes[layer] = sorted ids.
    std::vector<float> step(int32_t tok, std::vector<std::array<int, 32>>& routes) {
        const auto& c = m_.config();
        auto& pool = m_.pool();
        const size_t E = c.n_embd, hd = c.head_dim;
        const size_t q_dim = size_t(c.n_head) * hd, kv_dim = size_t(c.n_head_kv) * hd;
        const int64_t pos = pos_++;
        auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
        std::vector<float> x(E), h(E), q(q_dim), k(kv_dim), v(kv_dim), att(q_dim), tmp(E);
        m_.token_embd().dequantize_row(uint64_t(tok), x.data());
        routes.assign(c.n_layer, {});
        for (uint32_t il = 0; il < c.n_layer; ++il) {
            const cpuref::Layer& L = m_.layers()[il];
            cpuref::rms_norm(x.data(), L.attn_norm.data(), c.norm_eps, E, h.data());
            if (L.wqkv) {
                std::vector<float> qkv(q_dim + 2 * kv_dim);
                cpuref::matmul(pool, L.wqkv, 0, qkv.size(), h.data(), 1, E, qkv.data(), qkv.size(), bias(L.bqkv));
                std::copy_n(qkv.begin(), q_dim, q.begin());
                std::copy_n(qkv.begin() + long(q_dim), kv_dim, k.begin());
                std::copy_n(qkv.begin() + long(q_dim + kv_dim), kv_dim, v.begin());
            } else {
                cpuref::matmul(pool, L.wq, 0, q_dim, h.data(), 1, E, q.data(), q_dim, bias(L.bq));
                cpuref::matmul(pool, L.wk, 0, kv_dim, h.data(), 1, E, k.data(), kv_dim, bias(L.bk));
                cpuref::matmul(pool, L.wv, 0, kv_dim, h.data(), 1, E, v.data(), kv_dim, bias(L.bv));
            }
            const auto& rope = m_.rope();
            std::vector<float> cs(rope.n_rot / 2), sn(rope.n_rot / 2);
            cpuref::rope_cos_sin(rope, pos, cs.data(), sn.data());
            for (uint32_t hh = 0; hh < c.n_head; ++hh) cpuref::rope_apply(rope, cs.data(), sn.data(), &q[hh * hd]);
            for (uint32_t hh = 0; hh < c.n_head_kv; ++hh) cpuref::rope_apply(rope, cs.data(), sn.data(), &k[hh * hd]);
            float* kc = kc_[il].data();
            float* vc = vc_[il].data();
            for (size_t i = 0; i < kv_dim; ++i) {
                kc[size_t(pos) * kv_dim + i] = kv_f16_ ? __half2float(__float2half_rn(k[i])) : k[i];
                vc[size_t(pos) * kv_dim + i] = kv_f16_ ? __half2float(__float2half_rn(v[i])) : v[i];
            }
            std::vector<float> scores(size_t(pos) + 1);
            const float scale = 1.0f / std::sqrt(float(hd));
            const uint32_t group = c.n_head / c.n_head_kv;
            for (uint32_t hh = 0; hh < c.n_head; ++hh)
                cpuref::attend_one(&q[hh * hd], kc + (hh / group) * hd, vc + (hh / group) * hd, kv_dim, hd,
                                   cpuref::window_start(pos, L.window), pos, scale,
                                   L.sinks.empty() ? nullptr : &L.sinks[hh], scores.data(), &att[hh * hd]);
            cpuref::matmul(pool, L.wo, 0, E, att.data(), 1, q_dim, tmp.data(), E, bias(L.bo));
            for (size_t i = 0; i < E; ++i) x[i] += tmp[i];

            cpuref::rms_norm(x.data(), L.ffn_norm.data(), c.norm_eps, E, h.data());
            moe(L, h.data(), tmp.data(), routes[il]);
            for (size_t i = 0; i < E; ++i) x[i] += tmp[i];
        }
        cpuref::rms_norm(x.data(), m_.output_norm().data(), c.norm_eps, E, h.data());
        std::vector<float> out(c.n_vocab);
        cpuref::matmul(pool, m_.output(), 0, c.n_vocab, h.data(), 1, E, out.data(), c.n_vocab);
        return out;
    }

private:
    // Experts in ascending index order, as the reference accumulates them.
    void moe(const cpuref::Layer& L, const float* in, float* out, std::array<int, 32>& ids) {
        const auto& c = m_.config();
        auto& pool = m_.pool();
        const size_t E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
        std::vector<float> router(X);
        cpuref::matmul(pool, L.router, 0, X, in, 1, E, router.data(), X, L.router_b.empty() ? nullptr : L.router_b.data());
        auto sel = cpuref::route_top_k(router.data(), int(X), int(c.n_expert_used));
        std::sort(sel.begin(), sel.end());
        ids.fill(-1);
        for (size_t i = 0; i < sel.size() && i < ids.size(); ++i) ids[i] = sel[i].first;
        std::fill(out, out + E, 0.0f);
        std::vector<float> g(F), u(F), y(E);
        for (auto [e, w] : sel) {
            const size_t ue = size_t(e);
            cpuref::matmul(pool, L.gate_exps, ue * F, F, in, 1, E, g.data(), F,
                           L.gate_exps_b.empty() ? nullptr : &L.gate_exps_b[ue * F]);
            cpuref::matmul(pool, L.up_exps, ue * F, F, in, 1, E, u.data(), F,
                           L.up_exps_b.empty() ? nullptr : &L.up_exps_b[ue * F]);
            for (size_t i = 0; i < F; ++i) g[i] = cpuref::swiglu_oai(g[i], u[i], c.swiglu_alpha, c.swiglu_limit);
            cpuref::matmul(pool, L.down_exps, ue * E, E, g.data(), 1, F, y.data(), E,
                           L.down_exps_b.empty() ? nullptr : &L.down_exps_b[ue * E]);
            for (size_t i = 0; i < E; ++i) out[i] += w * y[i];
        }
    }

    const cpuref::Model& m_;
    bool kv_f16_;
    int64_t pos_ = 0;
    std::vector<std::vector<float>> kc_, vc_;
};

struct Trace {
    std::string name;
    std::vector<std::vector<float>> logits;  // [position][vocab]
};

double top_margin(const std::vector<float>& v) {
    const size_t a = argmax(v);
    float second = -INFINITY;
    for (size_t i = 0; i < v.size(); ++i)
        if (i != a) second = std::max(second, v[i]);
    return double(v[a]) - double(second);
}
double max_abs(const std::vector<float>& b) {
    double mx = 0;
    for (float v : b) mx = std::max(mx, double(std::fabs(v)));
    return mx;
}

// Agreement of `got` with `ref`, with the error and margin picture.
int compare(const Trace& got, const Trace& ref) {
    int same = 0;
    std::vector<double> errs;
    std::string mism;
    int explained = 0;  // mismatches whose reference margin is within 2x the logit error
    for (size_t p = 0; p < ref.logits.size(); ++p) {
        const double e = rel_err(got.logits[p], ref.logits[p]);
        errs.push_back(e);
        if (argmax(got.logits[p]) == argmax(ref.logits[p])) {
            ++same;
            continue;
        }
        const double margin = top_margin(ref.logits[p]), scale = max_abs(ref.logits[p]);
        explained += margin <= 2 * e * scale;
        char buf[160];
        std::snprintf(buf, sizeof buf, "    pos %3zu: ref margin %.3g (%.2e of max|logit|), max rel err %.2e\n", p,
                      margin, margin / scale, e);
        mism += buf;
    }
    std::vector<double> sorted = errs;
    std::sort(sorted.begin(), sorted.end());
    std::printf("[diag] %s vs %s: top-1 %d/%zu; max rel logit err median %.2e, p90 %.2e, max %.2e; "
                "%d of %zu mismatches have margin <= 2x error\n%s",
                got.name.c_str(), ref.name.c_str(), same, ref.logits.size(), sorted[sorted.size() / 2],
                sorted[sorted.size() * 9 / 10], sorted.back(), explained, ref.logits.size() - size_t(same),
                mism.c_str());
    std::printf("[diag] %s vs %s per position rel err:", got.name.c_str(), ref.name.c_str());
    for (size_t p = 0; p < errs.size(); ++p) std::printf("%s%.1e", p % 16 ? " " : "\n    ", errs[p]);
    std::printf("\n");
    return same;
}

void compare_routes(const Routes& a, const Routes& b, const char* what) {
    const size_t n_layer = a.empty() ? 0 : a[0].size();
    std::printf("[diag] %s: tokens (of %zu) whose expert set differs, per layer:", what, a.size());
    int first = -1;
    for (size_t l = 0; l < n_layer; ++l) {
        int diff = 0;
        for (size_t p = 0; p < a.size(); ++p) {
            const bool d = a[p][l] != b[p][l];
            diff += d;
            if (d && (first < 0 || int(p) < first)) first = int(p);
        }
        std::printf(" L%zu:%d", l, diff);
    }
    std::printf("\n[diag] %s: first position with any differing expert set: %d\n", what, first);
}

Trace run_gpu(const eh_plugin_api* api, const eh_model_view* view, const std::vector<int32_t>& toks) {
    Trace r{"gpu-kv-f16", {}};
    Engine e(api, view, uint32_t(toks.size() + 8));
    EXPECT_TRUE(e.ok()) << e.failure;
    if (!e.ok()) return r;
    for (int32_t t : toks) r.logits.push_back(e.decode(t));
    return r;
}

TEST(GptOss20bDiagnostic, AgreementErrorsMarginsAndRoutes) {
    if (!plugin_gpu_usable()) GTEST_SKIP() << "no usable CUDA device";
    const std::string path = model_20b();
    if (path.empty()) GTEST_SKIP() << "set EH_FORGED_DIR (with " << kProfile << ".gguf) or EH_GPT_DIAG=1";
    auto file = eh::model::ModelFile::open(path);
    const eh_value* vocab = nullptr;
    for (const auto& kv : std::span(file->view().metadata, file->view().n_metadata))
        if (std::string_view(kv.key.data, kv.key.size) == "tokenizer.ggml.tokens") vocab = &kv.value;
    ASSERT_NE(vocab, nullptr);
    // The same 128 ids as tests/e2e/agreement_gpu_test.cpp.
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> pick(0, int32_t(vocab->count) - 1);
    std::vector<int32_t> toks(kPositions);
    for (auto& t : toks) t = pick(rng);

    // GPU first: its runs need the device memory, the copies only the host.
    const Trace gpu16 = run_gpu(gpu_api(), &file->view(), toks);
    ASSERT_EQ(gpu16.logits.size(), toks.size());

    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = path.c_str();
    lp.view = &file->view();
    const cpuref::Model model(lp);
    Trace ref32{"cpu-copy-kv-f32", {}}, ref16{"cpu-copy-kv-f16", {}};
    Routes routes32, routes16;
    {
        Replica a(model, false, kPositions), b(model, true, kPositions);
        std::vector<std::array<int, 32>> ra, rb;
        for (size_t p = 0; p < toks.size(); ++p) {
            ref32.logits.push_back(a.step(toks[p], ra));
            routes32.push_back(ra);
            ref16.logits.push_back(b.step(toks[p], rb));
            routes16.push_back(rb);
            // One line per position as it comes (the whole run is long).
            int layers = 0;
            for (size_t l = 0; l < ra.size(); ++l) layers += ra[l] != rb[l];
            const auto& r = ref32.logits[p];
            auto top = [&](const Trace& x) { return argmax(x.logits[p]) == argmax(r) ? '=' : 'X'; };
            std::printf("[pos] %3zu margin %.2e | gpu16 %c %.1e | copy16 %c %.1e | gpu16~copy16 %c %.1e"
                        " | layers with f16/f32 expert-set diff %d\n",
                        p, top_margin(r) / max_abs(r), top(gpu16), rel_err(gpu16.logits[p], r), top(ref16),
                        rel_err(ref16.logits[p], r),
                        argmax(gpu16.logits[p]) == argmax(ref16.logits[p]) ? '=' : 'X',
                        rel_err(gpu16.logits[p], ref16.logits[p]), layers);
        }
    }
    // The copy is the reference plugin's arithmetic: check on a prefix.
    {
        Engine cpu(cpu_api(), &file->view(), 24);
        ASSERT_TRUE(cpu.ok()) << cpu.failure;
        double worst = 0;
        for (int p = 0; p < 16; ++p) worst = std::max(worst, rel_err(cpu.decode(toks[size_t(p)]), ref32.logits[size_t(p)]));
        std::printf("[diag] cpu-reference plugin vs cpu-copy-kv-f32, first 16 positions: max rel err %.2e\n", worst);
        EXPECT_LT(worst, 1e-5);
    }

    compare(ref16, ref32);
    compare_routes(routes16, routes32, "cpu-copy kv f16 vs f32");
    const int g32 = compare(gpu16, ref32);
    const int g16 = compare(gpu16, ref16);
    std::printf("[diag] summary: gpu(kv f16) %d/%d against the FP32 reference, %d/%d against the FP16 copy\n", g32,
                kPositions, g16, kPositions);
    // With the same cache precision the engines agree: the bar.
    EXPECT_GE(g16, kPositions * 99 / 100);
}

}  // namespace
