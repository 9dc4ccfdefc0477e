// gpt-cuda's batched step (ABI 1.2) against the CPU reference plugin and
// against itself: a sequence's logits at every position, teacher-forced,
// whether it runs alone, beside other sequences' decodes, or prefilled in
// chunks mixed with them; the same step twice gives the same bits; a fork
// shares its prefix and copies the shared block on write; KV_FULL changes
// nothing. The models: the transformers-checked tiny gpt-oss (sliding
// window 4 on even layers, per-head sinks, MXFP4 experts), gpt2 and qwen3moe, and the
// forged tiny-gpt-oss-mxfp4 (window 128, real vocabulary) with sequences
// longer than its window, and the forged tiny-qwen3-moe-q4_k_m. The paged attention kernel's sinks and window are
// also checked alone against a host computation.
//
// KV precision: the batched pool is FP16, the CPU reference's default cache
// FP32. The tolerances below allow for that; the printed lines say how far
// the logits and the top-1 token moved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <eh/model/model_file.hpp>
#include <ehcuda/attention_paged.hpp>
#include <ehcuda/device_memory.hpp>

#include "compare.hpp"  // tests/gpt_cuda: logit comparisons, the test models
#include "plugins.hpp"  // tests/gpt_cuda: the two plugins, a one-sequence Engine
#include "step_feed.hpp"

using namespace gpttest;

namespace {

#define REQUIRE_BATCHED()                                                          \
    if (!plugin_gpu_usable()) GTEST_SKIP() << "no usable CUDA device";                      \
    ASSERT_NE(cpu_api(), nullptr) << "cpu-reference plugin not loadable";          \
    ASSERT_NE(gpu_api()->step, nullptr) << "gpt-cuda exports no batched step"

// Model files, opened once per process.
const eh_model_view* view_of(const std::string& name) {
    static std::map<std::string, std::unique_ptr<eh::model::ModelFile>> files;
    auto& f = files[name];
    if (!f) f = eh::model::ModelFile::open(model_path(name));
    return &f->view();
}

uint32_t vocab_of(const std::string& name) {
    Engine cpu(cpu_api(), view_of(name), 8);
    eh_model_info info{};
    info.struct_size = sizeof info;
    EXPECT_EQ(cpu.api->model_get_info(cpu.model, &info), EH_OK);
    return info.vocab_size;
}

// The CPU reference's logits after each token (one token per prefill).
std::vector<std::vector<float>> reference_logits(const std::string& model, const std::vector<int32_t>& toks) {
    Engine cpu(cpu_api(), view_of(model), uint32_t(toks.size()));
    EXPECT_TRUE(cpu.ok()) << cpu.failure;
    std::vector<std::vector<float>> out;
    for (int32_t t : toks) out.push_back(cpu.decode(t));
    return out;
}

std::vector<int32_t> tokens_of(size_t n, uint32_t salt, uint32_t vocab) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 37 + salt * 101 + 7) % vocab);
    return t;
}

// gpt-cuda with kv_init done (tests/cuda/step_seq.hpp): max_entries
// sequences in a 64 MiB pool unless told.
struct Batched : ehtest::StepModel {
    explicit Batched(const std::string& name, uint64_t budget = 0, uint32_t max_seq_tokens = 256,
                     uint32_t max_entries = 8)
        : StepModel(gpu_api(), view_of(name), shape(budget, max_seq_tokens, max_entries), nullptr, name.c_str()) {
        EXPECT_TRUE(ok()) << failure;
    }
    static ehtest::KvShape shape(uint64_t budget, uint32_t max_seq_tokens, uint32_t max_entries) {
        ehtest::KvShape k;
        k.max_seqs = k.max_step_entries = max_entries;
        k.max_seq_tokens = max_seq_tokens;
        k.budget_bytes = budget ? budget : (64ull << 20);
        return k;
    }
};

using ehtest::step_entry;

// Sequences fed teacher-forced, alone or in mixed steps (step_feed.hpp).
using ehtest::feed;
using ehtest::SeqLogits;

struct Case {
    std::string model;
    std::vector<size_t> lens;
    size_t prompt;
};

class GptBatchedStep : public ::testing::TestWithParam<Case> {};

// Each sequence alone, then all of them in mixes of prefill chunks (1, 7,
// 16 tokens, or the whole prompt) and decodes: every position's logits
// against the CPU reference, and against the sequence's own logits alone
// (greedy teacher-forced: the top token agrees at >= 99 % of positions).
TEST_P(GptBatchedStep, TeacherForcedLogitsMatchTheReferenceAloneAndInEveryMix) {
    REQUIRE_BATCHED();
    const Case& c = GetParam();
    const uint32_t vocab = vocab_of(c.model);
    std::vector<std::vector<int32_t>> toks;
    std::vector<std::vector<std::vector<float>>> ref;
    for (size_t i = 0; i < c.lens.size(); ++i) {
        toks.push_back(tokens_of(c.lens[i], uint32_t(i), vocab));
        ref.push_back(reference_logits(c.model, toks.back()));
    }
    SeqLogits alone(toks.size());
    {
        Batched b(c.model);
        ASSERT_TRUE(b.model);
        for (size_t i = 0; i < toks.size(); ++i) alone[i] = feed(b, toks, c.prompt, 0, int(i))[i];
    }
    constexpr double kTol = 1e-2;  // of the largest |logit| (an FP16 KV pool against FP32)
    ehtest::MixTally t;  // (step_feed.hpp)
    t.tol = kTol;
    t.past_from = 128;
    t.against_reference(alone, ref);
    for (uint32_t chunk : {0u, 1u, 7u, 16u}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk));
        Batched b(c.model);
        ASSERT_TRUE(b.model);
        const SeqLogits mixed = feed(b, toks, c.prompt, chunk);
        t.against_reference(mixed, ref);
        t.against_alone(mixed, alone);
    }
    t.report("gpt-batch", c.model, "128");
    EXPECT_GT(t.n_ref, 100u);
    t.expect_agreement();
}

INSTANTIATE_TEST_SUITE_P(
    Models, GptBatchedStep,
    ::testing::Values(Case{"gpt-oss", {13, 60, 5, 29, 44}, 20}, Case{"gpt2", {13, 60, 5, 29}, 20},
                      Case{"qwen3moe", {13, 60, 5, 29, 44}, 20},
                      // Longer than the window (128): a prompt of 100, then decodes past it.
                      Case{"tiny-gpt-oss-mxfp4", {150, 40, 5, 136}, 100},
                      // Qwen3-MoE: QK-norm, 8 experts of Q4_K / Q6_K (the tensor-core grouped form), plain SwiGLU.
                      Case{"tiny-qwen3-moe-q4_k_m", {150, 40, 5, 136}, 100}),
    [](const auto& info) {
        std::string s = info.param.model;
        for (auto& ch : s)
            if (ch == '-') ch = '_';
        return s;
    });

// Twenty sequences decoding together: the decode steps take the 32-token
// graph (padded), the dense matmuls cuBLAS and the experts one token at a
// time on the side streams; every position against the CPU reference.
TEST(GptBatchedStepWide, TwentySequencesDecodeTogether) {
    REQUIRE_BATCHED();
    const uint32_t vocab = vocab_of("gpt-oss");
    std::vector<std::vector<int32_t>> toks;
    std::vector<std::vector<std::vector<float>>> ref;
    for (uint32_t i = 0; i < 20; ++i) {
        toks.push_back(tokens_of(14, 40 + i, vocab));
        ref.push_back(reference_logits("gpt-oss", toks.back()));
    }
    Batched b("gpt-oss", 0, 256, 32);
    ASSERT_TRUE(b.model);
    const SeqLogits got = feed(b, toks, 4, 0);
    size_t n = 0, ok = 0, top1 = 0;
    double worst = 0;
    for (size_t i = 0; i < toks.size(); ++i)
        for (size_t p = 0; p < toks[i].size(); ++p) {
            if (got[i][p].empty()) continue;
            const double e = rel_err(got[i][p], ref[i][p]);
            worst = std::max(worst, e);
            ++n;
            ok += e < 1e-2;
            top1 += top1_ok(got[i][p], ref[i][p], 1e-2);
        }
    std::printf("[gpt-batch] 20 sequences: %zu positions, within 1e-2: %zu, top-1 ok: %zu, max %.3g\n", n, ok, top1,
                worst);
    EXPECT_EQ(n, 20u * 11u);  // the prompt's last position, then 10 decodes each
    EXPECT_GE(double(ok), 0.97 * double(n));
    EXPECT_GE(double(top1), 0.97 * double(n));
}

// The same mix twice, on two loads and again on the first: the same bits.
TEST(GptBatchedStepRepeat, TheSameStepsGiveTheSameBits) {
    REQUIRE_BATCHED();
    const uint32_t vocab = vocab_of("gpt-oss");
    std::vector<std::vector<int32_t>> toks;
    for (size_t n : {31u, 9u, 50u}) toks.push_back(tokens_of(n, uint32_t(n), vocab));
    Batched a("gpt-oss"), b("gpt-oss");
    ASSERT_TRUE(a.model && b.model);
    const SeqLogits r1 = feed(a, toks, 12, 7), r2 = feed(b, toks, 12, 7), r3 = feed(a, toks, 12, 7);
    size_t n = 0;
    for (size_t i = 0; i < toks.size(); ++i)
        for (size_t p = 0; p < toks[i].size(); ++p) {
            if (r1[i][p].empty()) continue;
            ++n;
            ASSERT_EQ(r1[i][p].size(), r2[i][p].size());
            EXPECT_EQ(std::memcmp(r1[i][p].data(), r2[i][p].data(), r1[i][p].size() * 4), 0) << i << " at " << p;
            EXPECT_EQ(std::memcmp(r1[i][p].data(), r3[i][p].data(), r1[i][p].size() * 4), 0) << i << " at " << p;
        }
    EXPECT_GT(n, 60u);
}

// A fork inside a block shares the prefix; the fork and its source each
// append other tokens, the shared partial block is copied on the device,
// and neither sees the other's rows.
TEST(GptBatchedStepFork, ForkedSequencesDivergeWithoutTouchingEachOther) {
    REQUIRE_BATCHED();
    const uint32_t vocab = vocab_of("gpt-oss");
    auto base = tokens_of(21, 5, vocab);  // 21: the fork point is inside the second block
    auto a = base, c = base;
    for (int32_t t : {3, 4, 200}) a.push_back(t);
    for (int32_t t : {9, 10, 11}) c.push_back(t);
    const auto ra = reference_logits("gpt-oss", a), rc = reference_logits("gpt-oss", c);
    Batched b("gpt-oss");
    eh_seq* src = b.create();
    eh_step_entry e = step_entry(src, base.data(), uint32_t(base.size()), 0);
    ASSERT_EQ(b.api->step(b.model, &e, 1), EH_OK) << b.error();
    const uint32_t free_before = b.free_blocks();
    eh_seq* f = b.fork(src, uint32_t(base.size()));
    EXPECT_EQ(b.free_blocks(), free_before) << "a fork takes no block";
    eh_step_entry two[2] = {step_entry(src, a.data() + 21, 2), step_entry(f, c.data() + 21, 2)};
    ASSERT_EQ(b.api->step(b.model, two, 2), EH_OK) << b.error();
    EXPECT_LT(rel_err(b.logits(src), ra[22]), 1e-2);
    EXPECT_LT(rel_err(b.logits(f), rc[22]), 1e-2);
    EXPECT_EQ(b.free_blocks(), free_before - 1) << "one copy of the shared partial block";
    // And one decode each (the graph path) still sees only its own rows.
    eh_step_entry dec[2] = {step_entry(src, a.data() + 23, 1), step_entry(f, c.data() + 23, 1)};
    ASSERT_EQ(b.api->step(b.model, dec, 2), EH_OK) << b.error();
    EXPECT_LT(rel_err(b.logits(src), ra[23]), 1e-2);
    EXPECT_LT(rel_err(b.logits(f), rc[23]), 1e-2);
}

// A step that does not fit the pool fails with KV_FULL and leaves every
// sequence as it was: the next step gives the bits of a run where the
// failed step never happened.
TEST(GptBatchedStepPool, KvFullChangesNothing) {
    REQUIRE_BATCHED();
    const uint32_t vocab = vocab_of("gpt-oss");
    // gpt-oss reference: 2 layers, kv_dim 2 * 16; 4 blocks = 64 positions.
    const uint64_t block = 2ull * 2 * 16 * 32 * 2;
    auto p = tokens_of(60, 1, vocab);
    auto run = [&](bool overflow) {
        Batched b("gpt-oss", 4 * block, 64);
        EXPECT_EQ(b.kv.total_blocks, 4u);
        eh_seq* s = b.create();
        eh_step_entry e = step_entry(s, p.data(), 40, 0);
        EXPECT_EQ(b.api->step(b.model, &e, 1), EH_OK) << b.error();
        if (overflow) {
            eh_seq* s2 = b.create();
            eh_step_entry e2 = step_entry(s2, p.data(), 30, 0);
            eh_step_entry both[2] = {step_entry(s, p.data() + 40, 1), e2};
            EXPECT_EQ(b.api->step(b.model, both, 2), EH_KV_FULL);
            EXPECT_EQ(b.api->seq_length(s2), 0u);
            EXPECT_EQ(b.api->seq_length(s), 40u);
            EXPECT_EQ(b.free_blocks(), 1u);
        }
        eh_step_entry next = step_entry(s, p.data() + 40, 1);
        EXPECT_EQ(b.api->step(b.model, &next, 1), EH_OK) << b.error();
        return b.logits(s);
    };
    const auto clean = run(false), after_full = run(true);
    ASSERT_EQ(clean.size(), after_full.size());
    EXPECT_EQ(std::memcmp(clean.data(), after_full.data(), clean.size() * 4), 0);
}

// The paged attention kernel alone: rows of three sequences whose blocks
// are scattered over the pool, with and without the per-layer window and
// the per-head sinks, against a host computation over the same FP16 K/V.
TEST(GptPagedAttention, SinksAndWindowMatchTheHostComputation) {
    if (!plugin_gpu_usable()) GTEST_SKIP() << "no usable CUDA device";
    constexpr int B = ehcuda::kPagedBlockTokens;
    for (int hd : {16, 64}) {
        const int n_head = 8, n_kv = 2, kvd = n_kv * hd;
        const std::vector<int> lens = {300, 17, 140};
        std::mt19937 rng{uint32_t(hd)};
        std::normal_distribution<float> nd(0.0f, 1.0f);
        // Block tables: each sequence's blocks taken from a shuffled pool.
        int nblocks = 0;
        for (int l : lens) nblocks += (l + B - 1) / B;
        std::vector<int32_t> ids(size_t(nblocks) + 1);
        for (int i = 0; i <= nblocks; ++i) ids[size_t(i)] = i;
        std::shuffle(ids.begin(), ids.end(), rng);
        std::vector<int32_t> tables, table_of;
        for (int l : lens) {
            table_of.push_back(int32_t(tables.size()));
            for (int k = 0; k < (l + B - 1) / B; ++k) tables.push_back(ids[tables.size()]);
        }
        const size_t rows = size_t(nblocks + 1) * B;
        std::vector<__half> kp(rows * kvd), vp(rows * kvd);
        for (auto& x : kp) x = __float2half(nd(rng));
        for (auto& x : vp) x = __float2half(nd(rng));
        // Query rows: the last positions of each sequence and a few earlier.
        std::vector<int32_t> qpos, qtab, qseq;
        for (size_t sq = 0; sq < lens.size(); ++sq)
            for (int p : {0, 3, lens[sq] / 2, lens[sq] - 2, lens[sq] - 1}) {
                qpos.push_back(p);
                qtab.push_back(table_of[sq]);
                qseq.push_back(int32_t(sq));
            }
        const int T = int(qpos.size());
        std::vector<float> q(size_t(T) * n_head * hd), sinks(static_cast<size_t>(n_head));
        for (auto& x : q) x = nd(rng);
        for (auto& x : sinks) x = 2.0f * nd(rng);
        auto up = [](const void* p, size_t n) {
            ehcuda::DeviceBuffer b(n);
            cudaMemcpy(b.get(), p, n, cudaMemcpyHostToDevice);
            return b;
        };
        auto dq = up(q.data(), q.size() * 4), dk = up(kp.data(), kp.size() * 2), dv = up(vp.data(), vp.size() * 2),
             dpos = up(qpos.data(), qpos.size() * 4), dtab = up(qtab.data(), qtab.size() * 4),
             dtables = up(tables.data(), tables.size() * 4), dsinks = up(sinks.data(), sinks.size() * 4);
        ehcuda::DeviceBuffer dout(q.size() * 4);
        const float scale = 1.0f / std::sqrt(float(hd));
        for (int window : {0, 128})
            for (bool with_sinks : {false, true}) {
                SCOPED_TRACE("head_dim " + std::to_string(hd) + " window " + std::to_string(window) +
                             (with_sinks ? " sinks" : ""));
                ehcuda::PagedAttnArgs a;
                a.q = dq.as<float>();
                a.ldq = n_head * hd;
                a.k_pool = dk.as<__half>();
                a.v_pool = dv.as<__half>();
                a.n_head = n_head;
                a.n_kv = n_kv;
                a.head_dim = hd;
                a.ntok = T;
                a.d_pos = dpos.as<int32_t>();
                a.d_table = dtab.as<int32_t>();
                a.tables = dtables.as<int32_t>();
                a.window = window;
                a.scale = scale;
                a.sinks = with_sinks ? dsinks.as<float>() : nullptr;
                a.out = dout.as<float>();
                a.ldo = n_head * hd;
                ehcuda::attention_paged(a, nullptr);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                std::vector<float> got(q.size());
                cudaMemcpy(got.data(), dout.get(), got.size() * 4, cudaMemcpyDeviceToHost);
                double worst = 0;
                for (int t = 0; t < T; ++t)
                    for (int h = 0; h < n_head; ++h) {
                        const int kvh = h / (n_head / n_kv), qp = qpos[size_t(t)];
                        const int k0 = window > 0 ? std::max(0, qp - window + 1) : 0;
                        std::vector<double> sc;
                        double mx = with_sinks ? double(sinks[size_t(h)]) : -1e300;
                        for (int key = k0; key <= qp; ++key) {
                            const size_t row = size_t(tables[size_t(qtab[size_t(t)] + key / B)]) * B + key % B;
                            double d = 0;
                            for (int i = 0; i < hd; ++i)
                                d += double(q[(size_t(t) * n_head + h) * hd + i]) * scale *
                                     double(__half2float(kp[row * kvd + kvh * hd + i]));
                            sc.push_back(d);
                            mx = std::max(mx, d);
                        }
                        double den = with_sinks ? std::exp(double(sinks[size_t(h)]) - mx) : 0.0;
                        for (double& s : sc) den += (s = std::exp(s - mx));
                        for (int i = 0; i < hd; ++i) {
                            double o = 0;
                            for (int key = k0; key <= qp; ++key) {
                                const size_t row = size_t(tables[size_t(qtab[size_t(t)] + key / B)]) * B + key % B;
                                o += sc[size_t(key - k0)] * double(__half2float(vp[row * kvd + kvh * hd + i]));
                            }
                            worst = std::max(worst, std::fabs(o / den - got[(size_t(t) * n_head + h) * hd + i]));
                        }
                    }
                EXPECT_LT(worst, 1e-4);
            }
    }
}

}  // namespace

// ABI 1.3's halves on gpt-cuda (the CUDA batch base both plugins share):
// steps begun before the one ahead is read, their decode tokens chained on
// the device, give the tokens plain steps give, for a greedy and a drawn
// sequence side by side.
TEST(GptBatchedStepHalves, ChainedStepsGiveThePlainStepsTokens) {
    REQUIRE_BATCHED();
    ASSERT_NE(gpu_api()->step_begin, nullptr) << "gpt-cuda has no step_begin";
    const uint32_t vocab = vocab_of("gpt-oss");
    const std::vector<std::vector<int32_t>> prompts = {tokens_of(11, 1, vocab), tokens_of(23, 2, vocab)};
    const size_t n = prompts.size();
    constexpr int kSteps = 12;
    auto setup = [&](Batched& b) {
        std::vector<eh_seq*> s;
        for (size_t i = 0; i < n; ++i) {
            s.push_back(b.create());
            eh_sampling_params sp{};
            sp.struct_size = sizeof sp;
            sp.temperature = i == 0 ? 0.0f : 1.1f;
            sp.top_p = 1.0f;
            sp.repetition_penalty = 1.0f;
            sp.repetition_window = -1;
            sp.seed = 3;
            EXPECT_EQ(b.api->seq_set_sampling(s[i], &sp), EH_OK) << b.error();
        }
        return s;
    };
    std::vector<std::vector<int32_t>> plain(n), halves(n);
    {
        Batched b("gpt-oss");
        ASSERT_TRUE(b.model);
        auto s = setup(b);
        std::vector<eh_step_entry> es;
        for (size_t i = 0; i < n; ++i) es.push_back(step_entry(s[i], prompts[i].data(), uint32_t(prompts[i].size()), EH_STEP_SAMPLE));
        std::vector<int32_t> next(n);
        for (int k = 0; k <= kSteps; ++k) {
            ASSERT_EQ(b.api->step(b.model, es.data(), uint32_t(n)), EH_OK) << b.error();
            for (size_t i = 0; i < n; ++i) plain[i].push_back(next[i] = es[i].token);
            for (size_t i = 0; i < n; ++i) es[i] = step_entry(s[i], &next[i], 1, EH_STEP_SAMPLE);
        }
    }
    Batched b("gpt-oss");
    ASSERT_TRUE(b.model);
    auto s = setup(b);
    std::vector<eh_step_entry> first;
    for (size_t i = 0; i < n; ++i) first.push_back(step_entry(s[i], prompts[i].data(), uint32_t(prompts[i].size()), EH_STEP_SAMPLE));
    ASSERT_EQ(b.api->step_begin(b.model, first.data(), uint32_t(n)), EH_OK) << b.error();
    std::vector<int32_t> out(n);
    for (int k = 1; k <= kSteps + 1; ++k) {
        if (k <= kSteps) {
            std::vector<eh_step_entry> es;
            for (size_t i = 0; i < n; ++i) es.push_back(step_entry(s[i], nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED));
            ASSERT_EQ(b.api->step_begin(b.model, es.data(), uint32_t(n)), EH_OK) << b.error();
        }
        ASSERT_EQ(b.api->step_end(b.model, out.data(), uint32_t(n)), EH_OK) << b.error();
        for (size_t i = 0; i < n; ++i) halves[i].push_back(out[i]);
    }
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(halves[i], plain[i]) << "sequence " << i;
}
