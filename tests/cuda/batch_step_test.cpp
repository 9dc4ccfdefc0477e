// llama-cuda's batched step (ABI 1.2): several sequences in one step, with
// prefill chunks and decodes mixed, give the logits of a plain CPU forward
// pass at every position (teacher forcing); greedy tokens of a sequence are
// the same alone and in a batch; a fork shares its prefix and a write past
// it copies the shared block on the device; biases and the allowed-token
// mask steer the sampler; KV_FULL changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "gpu_util.hpp"
#include "plugin_handle.hpp"
#include "step_seq.hpp"
#include "tiny_model.hpp"

namespace {

using namespace ehtest;

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double mx = 1e-6, e = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        mx = std::max(mx, double(std::fabs(b[i])));
        e = std::max(e, double(std::fabs(a[i] - b[i])));
    }
    return e / mx;
}

// llama-cuda with kv_init done (step_seq.hpp): 8 sequences a step.
struct Batched : StepModel {
    explicit Batched(const TinyModel& tm, uint64_t budget = 0, uint32_t max_seq_tokens = 256,
                     const char* options = nullptr)
        : StepModel(llama_cuda_api(), tm.view(), shape(budget, max_seq_tokens), options, "tiny") {
        EXPECT_TRUE(ok()) << failure;
    }
    static KvShape shape(uint64_t budget, uint32_t max_seq_tokens) {
        KvShape k;
        k.max_seqs = k.max_step_entries = 8;
        k.max_seq_tokens = max_seq_tokens;
        k.budget_bytes = budget;
        return k;
    }
};

std::vector<int32_t> tokens_of(size_t n, uint32_t salt, int vocab) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 37 + salt * 101 + 7) % size_t(vocab));
    return t;
}

#define REQUIRE_BATCHED()                                                       \
    REQUIRE_GPU();                                                              \
    ASSERT_NE(llama_cuda_api(), nullptr) << "llama-cuda plugin not loadable";   \
    ASSERT_NE(llama_cuda_api()->step, nullptr) << "llama-cuda has no batched step"

struct BatchCase {
    std::string arch;
    uint32_t wtype;
    // The load's options_json: null keeps the FP16 weight mirror (the auto
    // rule takes it for these tiny models); {"fp16_weights":"off"} runs the
    // multi-token GEMMs on slab-dequantized weights instead.
    const char* options = nullptr;
};

class BatchedStep : public ::testing::TestWithParam<BatchCase> {};

constexpr const char* kGroupsOnce =
    R"({"kernels":{"bulk_max_tokens":8,"bulk_group_once":true,"bulk_group_norm":true,"bulk_group_stage_cols":512}})";

// Sequences of `lens` tokens, fed teacher-forced: the first `prompt` of
// each in chunks of `chunk` tokens (0 = whole) beside the others' steps,
// then single tokens (decode steps); every position that asks for logits
// matches the CPU forward pass of its own sequence.
void teacher_forced(const BatchCase& bc, const std::vector<size_t>& lens, size_t prompt,
                    const std::vector<uint32_t>& chunks, size_t min_checked) {
    TinySpec spec;
    spec.arch = bc.arch;
    spec.wtype = bc.wtype;
    if (spec.arch == "phi3") spec.window = 16;
    TinyModel tm(spec);
    std::vector<std::vector<int32_t>> toks;
    std::vector<std::vector<std::vector<float>>> ref;
    for (size_t i = 0; i < lens.size(); ++i) {
        toks.push_back(tokens_of(lens[i], uint32_t(i), spec.n_vocab));
        ref.push_back(tm.reference_logits(toks.back()));
    }
    const double tol = 3e-2;
    for (uint32_t chunk : chunks) {
        SCOPED_TRACE("chunk " + std::to_string(chunk));
        Batched b(tm, 0, 256, bc.options);
        ASSERT_TRUE(b.model);
        std::vector<eh_seq*> s;
        for (size_t i = 0; i < lens.size(); ++i) s.push_back(b.create());
        std::vector<size_t> fed(lens.size(), 0);
        size_t checked = 0;
        for (int guard = 0; guard < 1000; ++guard) {
            std::vector<eh_step_entry> es;
            std::vector<size_t> who;
            for (size_t i = 0; i < lens.size(); ++i) {
                if (fed[i] == lens[i]) continue;
                size_t k = 1;
                if (fed[i] < prompt) {
                    const size_t left = std::min(prompt, lens[i]) - fed[i];
                    k = chunk ? std::min<size_t>(chunk, left) : left;
                }
                es.push_back(step_entry(s[i], toks[i].data() + fed[i], uint32_t(k)));
                who.push_back(i);
                fed[i] += k;
            }
            if (es.empty()) break;
            ASSERT_EQ(b.api->step(b.model, es.data(), uint32_t(es.size())), EH_OK) << b.error();
            for (size_t j = 0; j < es.size(); ++j) {
                const size_t i = who[j], at = fed[i] - 1;
                const auto got = b.logits(s[i]);
                EXPECT_LT(rel_err(got, ref[i][at]), tol) << "sequence " << i << " position " << at;
                ++checked;
            }
        }
        EXPECT_GT(checked, min_checked);
    }
}

// Four sequences of 5..60 tokens, a 4-token prompt part.
TEST_P(BatchedStep, TeacherForcedLogitsMatchTheReferenceInEveryMix) {
    REQUIRE_BATCHED();
    teacher_forced(GetParam(), {13, 60, 5, 29}, 4, {0u, 1u, 7u, 16u}, 90);
}

// Prompt chunks of 64 tokens and more take the tensor-core attention
// through the block tables, beside short chunks and decodes on the paged
// CUDA-core kernel in the same step.
TEST_P(BatchedStep, LongChunksMatchTheReferenceBesideShortOnes) {
    REQUIRE_BATCHED();
    teacher_forced(GetParam(), {200, 90, 9}, 150, {0u, 64u, 100u}, 40);
}

// Greedy continuation of three prompts: alone, then all three in one batch
// (whose matmuls take another kernel path). Positions where the reference's
// top two logits are closer than the tolerance may differ; the rest agree.
TEST_P(BatchedStep, GreedyTokensAreTheSameAloneAndBatched) {
    REQUIRE_BATCHED();
    TinySpec spec;
    spec.arch = GetParam().arch;
    spec.wtype = GetParam().wtype;
    TinyModel tm(spec);
    const std::vector<std::vector<int32_t>> prompts = {tokens_of(11, 1, spec.n_vocab), tokens_of(30, 2, spec.n_vocab),
                                                       tokens_of(3, 3, spec.n_vocab)};
    constexpr int kGen = 24;
    auto run = [&](const std::vector<size_t>& which) {
        Batched b(tm, 0, 256, GetParam().options);
        std::vector<eh_seq*> s;
        std::vector<std::vector<int32_t>> out(which.size());
        std::vector<eh_step_entry> es;
        for (size_t j = 0; j < which.size(); ++j) {
            s.push_back(b.create());
            es.push_back(step_entry(s[j], prompts[which[j]].data(), uint32_t(prompts[which[j]].size()), EH_STEP_SAMPLE));
        }
        std::vector<int32_t> next(which.size());
        for (int g = 0; g < kGen; ++g) {
            EXPECT_EQ(b.api->step(b.model, es.data(), uint32_t(es.size())), EH_OK) << b.error();
            for (size_t j = 0; j < which.size(); ++j) {
                out[j].push_back(es[j].token);
                next[j] = es[j].token;
                es[j] = step_entry(s[j], &next[j], 1, EH_STEP_SAMPLE);
            }
        }
        return out;
    };
    const auto together = run({0, 1, 2});
    size_t same = 0, total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        const auto alone = run({i})[0];
        for (size_t k = 0; k < alone.size(); ++k) {
            ++total;
            if (alone[k] == together[i][k]) ++same;
            else break;  // the continuations part ways; later tokens are not comparable
        }
    }
    std::printf("[batch] greedy agreement alone vs batched: %zu of %zu positions before any divergence\n", same, total);
    EXPECT_GE(double(same), 0.9 * double(total));
}

INSTANTIATE_TEST_SUITE_P(Archs, BatchedStep,
                         ::testing::Values(BatchCase{"llama", EH_TYPE_F32}, BatchCase{"qwen2", EH_TYPE_Q8_0},
                                           BatchCase{"phi3", EH_TYPE_Q4_K},
                                           BatchCase{"qwen2", EH_TYPE_Q8_0, R"({"fp16_weights":"off"})"},
                                           BatchCase{"phi3", EH_TYPE_Q4_K, R"({"fp16_weights":"off"})"},
                                           // token groups of up to 8 tokens (past the mirror's
                                           // cuBLAS threshold: the groups come first), each weight
                                           // chunk decoded once, the RMSNorm in the groups' inputs;
                                           // inputs of 256 columns staged in each block, the down
                                           // projection's 512 quantized once
                                           BatchCase{"qwen2", EH_TYPE_Q8_0, kGroupsOnce},
                                           BatchCase{"phi3", EH_TYPE_Q4_K, kGroupsOnce}),
                         [](const auto& info) {
                             const std::string o = info.param.options ? info.param.options : "";
                             return info.param.arch + (o.empty() ? "" : o.find("bulk_group_once") != std::string::npos ? "_groups" : "_slabs");
                         });

// The FP16 mirror is a load decision the model's memory shows: "on" holds
// two bytes per weight of every matrix more than "off"; a bad value of the
// option fails the load with INVALID_ARGUMENT.
TEST(BatchedStepMirror, OptionDecidesAndDeviceBytesCountIt) {
    REQUIRE_BATCHED();
    TinySpec spec;
    spec.arch = "qwen2";
    spec.wtype = EH_TYPE_Q8_0;
    TinyModel tm(spec);
    const eh_plugin_api* api = llama_cuda_api();
    auto device_bytes = [&](const char* options, eh_status* st) {
        eh_load_params lp{};
        lp.struct_size = sizeof lp;
        lp.path = "tiny";
        lp.view = tm.view();
        lp.options_json = options;
        eh_model* m = nullptr;
        *st = api->model_load(&lp, &m);
        if (*st != EH_OK) return uint64_t(0);
        eh_model_info mi{};
        mi.struct_size = sizeof mi;
        EXPECT_EQ(api->model_get_info(m, &mi), EH_OK);
        api->model_release(m);
        return mi.device_bytes_used;
    };
    eh_status st_on, st_off, st_bad;
    const uint64_t on = device_bytes(R"({"fp16_weights":"on"})", &st_on);
    const uint64_t off = device_bytes(R"({"fp16_weights":"off"})", &st_off);
    ASSERT_EQ(st_on, EH_OK);
    ASSERT_EQ(st_off, EH_OK);
    // Q/K/V, attn_output, gate, up, down per layer and the (tied) LM head.
    const uint64_t per_layer = uint64_t(spec.n_embd) * (spec.n_head + 2 * spec.n_kv) * (spec.n_embd / spec.n_head) +
                               uint64_t(spec.n_head) * (spec.n_embd / spec.n_head) * spec.n_embd + 3ull * spec.n_embd * spec.n_ff;
    const uint64_t expect = 2 * (per_layer * spec.n_layer + uint64_t(spec.n_vocab) * spec.n_embd);
    EXPECT_GE(on - off, expect) << "on " << on << " off " << off;
    EXPECT_LT(on - off, expect + expect / 8 + (1u << 20)) << "on " << on << " off " << off;
    device_bytes(R"({"fp16_weights":"sometimes"})", &st_bad);
    EXPECT_EQ(st_bad, EH_INVALID_ARGUMENT);
    EXPECT_NE(std::string(api->plugin_last_error()).find("fp16_weights"), std::string::npos) << api->plugin_last_error();
}

// A fork at a position inside a block shares the prefix; when the fork and
// its source each append different tokens, the shared partial block is
// copied on the device and neither sees the other's rows.
TEST(BatchedStepFork, ForkedSequencesDivergeWithoutTouchingEachOther) {
    REQUIRE_BATCHED();
    TinySpec spec;
    TinyModel tm(spec);
    auto base = tokens_of(21, 5, spec.n_vocab);  // 21: the fork point is inside the second block
    auto a = base, c = base;
    a.push_back(3);
    a.push_back(4);
    c.push_back(9);
    c.push_back(10);
    const auto ra = tm.reference_logits(a), rc = tm.reference_logits(c);
    Batched b(tm);
    eh_seq* src = b.create();
    eh_step_entry e = step_entry(src, base.data(), uint32_t(base.size()), 0);
    ASSERT_EQ(b.api->step(b.model, &e, 1), EH_OK) << b.error();
    const uint32_t free_before = b.free_blocks();
    eh_seq* f = b.fork(src, uint32_t(base.size()));
    EXPECT_EQ(b.free_blocks(), free_before) << "a fork takes no block";
    eh_step_entry two[2] = {step_entry(src, a.data() + 21, 2), step_entry(f, c.data() + 21, 2)};
    ASSERT_EQ(b.api->step(b.model, two, 2), EH_OK) << b.error();
    EXPECT_LT(rel_err(b.logits(src), ra.back()), 3e-2);
    EXPECT_LT(rel_err(b.logits(f), rc.back()), 3e-2);
    EXPECT_EQ(b.free_blocks(), free_before - 1) << "one copy of the shared partial block";
}

TEST(BatchedStepSampling, BiasAndMaskSteerTheSampledToken) {
    REQUIRE_BATCHED();
    TinySpec spec;
    TinyModel tm(spec);
    Batched b(tm);
    auto p = tokens_of(9, 2, spec.n_vocab);
    eh_seq* s0 = b.create();
    eh_seq* s1 = b.create();
    std::vector<uint32_t> allowed(size_t(spec.n_vocab + 31) / 32, 0u);
    allowed[77 / 32] |= 1u << (77 % 32);
    const int32_t bt[] = {123};
    const float bv[] = {1000.0f};
    eh_step_entry es[2] = {step_entry(s0, p.data(), 9, EH_STEP_SAMPLE), step_entry(s1, p.data(), 9, EH_STEP_SAMPLE)};
    es[0].allowed = allowed.data();
    es[1].n_bias = 1;
    es[1].bias_tokens = bt;
    es[1].bias_values = bv;
    ASSERT_EQ(b.api->step(b.model, es, 2), EH_OK) << b.error();
    EXPECT_EQ(es[0].token, 77);
    EXPECT_EQ(es[1].token, 123);
}

// The sampler applies the allowed-token mask as it reads the logits, on
// each of its paths: greedy over a small vocabulary (one block), greedy over
// a large one (partial argmax per slice, 9,000 tokens here), and drawing
// with a temperature. A biased token outside the mask never comes through,
// and the greedy pick is the best allowed raw logit.
TEST(BatchedStepSampling, MasksHoldOnEverySamplerPath) {
    REQUIRE_BATCHED();
    for (int nv : {512, 9000}) {
        TinySpec spec;
        spec.n_vocab = nv;
        TinyModel tm(spec);
        Batched b(tm);
        auto p = tokens_of(7, 3, nv);
        eh_seq* greedy = b.create();
        eh_seq* drawn = b.create();
        eh_sampling_params sp{};
        sp.struct_size = sizeof sp;
        sp.temperature = 1.5f;
        sp.top_p = 1.0f;
        sp.repetition_penalty = 1.0f;
        sp.repetition_window = -1;
        sp.seed = 7;
        ASSERT_EQ(b.api->seq_set_sampling(drawn, &sp), EH_OK) << b.error();
        const std::vector<int32_t> ok = {5, nv / 2, nv - 1};
        std::vector<uint32_t> allowed(size_t(nv + 31) / 32, 0u);
        for (int32_t t : ok) allowed[size_t(t) / 32] |= 1u << (t % 32);
        const int32_t bt[] = {11};
        const float bv[] = {1000.0f};
        std::vector<int32_t> tg = p, td = p;
        for (int step = 0; step < 6; ++step) {
            eh_step_entry es[2] = {step_entry(greedy, tg.data() + (step ? tg.size() - 1 : 0), step ? 1 : uint32_t(tg.size())),
                                   step_entry(drawn, td.data() + (step ? td.size() - 1 : 0), step ? 1 : uint32_t(td.size()),
                                         EH_STEP_SAMPLE)};
            for (auto& e : es) {
                e.allowed = allowed.data();
                e.n_bias = 1;
                e.bias_tokens = bt;
                e.bias_values = bv;
            }
            ASSERT_EQ(b.api->step(b.model, es, 2), EH_OK) << b.error();
            const auto raw = b.logits(greedy);  // before edits
            int32_t best = ok[0];
            for (int32_t t : ok)
                if (raw[size_t(t)] > raw[size_t(best)]) best = t;
            EXPECT_EQ(es[0].token, best) << "vocabulary " << nv << ", step " << step;
            EXPECT_NE(std::find(ok.begin(), ok.end(), es[1].token), ok.end()) << es[1].token;
            tg.push_back(es[0].token);
            td.push_back(es[1].token);
        }
    }
}

TEST(BatchedStepSampling, SeededDrawsRepeat) {
    REQUIRE_BATCHED();
    TinySpec spec;
    TinyModel tm(spec);
    auto draw = [&] {
        Batched b(tm);
        eh_seq* s = b.create();
        eh_sampling_params sp{};
        sp.struct_size = sizeof sp;
        sp.temperature = 1.5f;
        sp.top_p = 1.0f;
        sp.repetition_penalty = 1.3f;
        sp.repetition_window = -1;
        sp.seed = 42;
        sp.presence_penalty = 0.5f;
        sp.frequency_penalty = 0.5f;
        EXPECT_EQ(b.api->seq_set_sampling(s, &sp), EH_OK) << b.error();
        auto p = tokens_of(5, 1, spec.n_vocab);
        eh_step_entry e = step_entry(s, p.data(), 5, EH_STEP_SAMPLE);
        std::vector<int32_t> out;
        int32_t t = 0;
        for (int i = 0; i < 20; ++i) {
            EXPECT_EQ(b.api->step(b.model, &e, 1), EH_OK) << b.error();
            out.push_back(e.token);
            t = e.token;
            e = step_entry(s, &t, 1, EH_STEP_SAMPLE);
        }
        return out;
    };
    const auto a = draw(), c = draw();
    EXPECT_EQ(a, c);
    EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 3u) << "temperature 1.5 draws more than a few tokens";
}

// Draws are keyed by position: a sequence rebuilt from its prompt and the
// first k sampled tokens in one prefill (what the host does after a
// preemption) draws the same token k+1 as the sequence that decoded them.
TEST(BatchedStepSampling, ARecomputedSequenceDrawsTheSameTokens) {
    REQUIRE_BATCHED();
    TinySpec spec;
    TinyModel tm(spec);
    Batched b(tm);
    eh_sampling_params sp{};
    sp.struct_size = sizeof sp;
    sp.temperature = 1.0f;
    sp.top_p = 1.0f;
    sp.repetition_penalty = 1.0f;
    sp.repetition_window = -1;
    sp.seed = 7;
    auto p = tokens_of(6, 3, spec.n_vocab);
    eh_seq* s = b.create();
    ASSERT_EQ(b.api->seq_set_sampling(s, &sp), EH_OK);
    eh_step_entry e = step_entry(s, p.data(), uint32_t(p.size()), EH_STEP_SAMPLE);
    std::vector<int32_t> out;
    int32_t t = 0;
    for (int i = 0; i < 12; ++i) {
        ASSERT_EQ(b.api->step(b.model, &e, 1), EH_OK) << b.error();
        out.push_back(e.token);
        t = e.token;
        e = step_entry(s, &t, 1, EH_STEP_SAMPLE);
    }
    for (size_t k : {size_t(3), size_t(8)}) {
        std::vector<int32_t> again = p;
        again.insert(again.end(), out.begin(), out.begin() + long(k));
        eh_seq* r = b.create();
        ASSERT_EQ(b.api->seq_set_sampling(r, &sp), EH_OK);
        eh_step_entry f = step_entry(r, again.data(), uint32_t(again.size()), EH_STEP_SAMPLE);
        ASSERT_EQ(b.api->step(b.model, &f, 1), EH_OK) << b.error();
        EXPECT_EQ(f.token, out[k]) << "recomputed after " << k << " sampled tokens";
    }
}

TEST(BatchedStepPool, KvFullChangesNothing) {
    REQUIRE_BATCHED();
    TinySpec spec;
    TinyModel tm(spec);
    // A budget of 4 blocks: 64 positions.
    const uint64_t block = 2ull * spec.n_layer * 16 * uint64_t(spec.n_kv * (spec.n_embd / spec.n_head)) * 2;
    Batched b(tm, 4 * block, 64);
    ASSERT_EQ(b.kv.total_blocks, 4u);
    eh_seq* s = b.create();
    auto p = tokens_of(60, 1, spec.n_vocab);
    eh_step_entry e = step_entry(s, p.data(), 40, 0);
    ASSERT_EQ(b.api->step(b.model, &e, 1), EH_OK) << b.error();
    eh_seq* s2 = b.create();
    eh_step_entry e2 = step_entry(s2, p.data(), 30, 0);
    EXPECT_EQ(b.api->step(b.model, &e2, 1), EH_KV_FULL);
    EXPECT_EQ(b.api->seq_length(s2), 0u);
    EXPECT_EQ(b.free_blocks(), 1u);
}

}  // namespace

// ABI 1.3's halves: step N+1 begun (its decode tokens chained on the device)
// before step N is read gives the tokens plain steps give, bit for bit: a
// greedy sequence and a drawn one take their token on the device, one with
// penalties has it read on the host first, a lone sequence runs the
// one-token graph, and a step whose sampling inputs outgrow the staging
// (a long bias list of zeros) reallocates it while the step ahead flies.
TEST(BatchedStepHalves, ChainedStepsGiveThePlainStepsTokens) {
    REQUIRE_BATCHED();
    ASSERT_NE(llama_cuda_api()->step_begin, nullptr) << "llama-cuda has no step_begin";
    TinySpec spec;
    TinyModel tm(spec);
    constexpr int kSteps = 16, kBigBiasStep = 9;
    std::vector<int32_t> bias_tok(4000);
    std::vector<float> bias_val(4000, 0.0f);
    for (size_t i = 0; i < bias_tok.size(); ++i) bias_tok[i] = int32_t(i % size_t(spec.n_vocab));
    for (int n : {1, 3}) {
        SCOPED_TRACE("sequences: " + std::to_string(n));
        auto setup = [&](Batched& b) {
            std::vector<eh_seq*> s;
            for (int i = 0; i < n; ++i) {
                s.push_back(b.create());
                eh_sampling_params sp{};
                sp.struct_size = sizeof sp;
                sp.temperature = i == 0 ? 0.0f : 1.2f;
                sp.top_p = 1.0f;
                sp.repetition_penalty = i == 2 ? 1.3f : 1.0f;
                sp.repetition_window = -1;
                sp.seed = 7 + uint64_t(i);
                EXPECT_EQ(b.api->seq_set_sampling(s.back(), &sp), EH_OK) << b.error();
            }
            return s;
        };
        std::vector<std::vector<int32_t>> prompts;
        for (int i = 0; i < n; ++i) prompts.push_back(tokens_of(5 + 9 * size_t(i), uint32_t(i), spec.n_vocab));
        auto with_bias = [&](eh_step_entry e, int k) {
            if (k == kBigBiasStep) {
                e.n_bias = uint32_t(bias_tok.size());
                e.bias_tokens = bias_tok.data();
                e.bias_values = bias_val.data();
            }
            return e;
        };
        std::vector<std::vector<int32_t>> plain(static_cast<size_t>(n)), halves(static_cast<size_t>(n));
        {
            Batched b(tm);
            auto s = setup(b);
            std::vector<eh_step_entry> es;
            for (int i = 0; i < n; ++i) es.push_back(step_entry(s[i], prompts[i].data(), uint32_t(prompts[i].size()), EH_STEP_SAMPLE));
            std::vector<int32_t> next(static_cast<size_t>(n));
            for (int k = 0; k <= kSteps; ++k) {
                ASSERT_EQ(b.api->step(b.model, es.data(), uint32_t(n)), EH_OK) << b.error();
                for (int i = 0; i < n; ++i) plain[i].push_back(next[i] = es[i].token);
                for (int i = 0; i < n; ++i) es[i] = with_bias(step_entry(s[i], &next[i], 1, EH_STEP_SAMPLE), k + 1);
            }
        }
        Batched b(tm);
        auto s = setup(b);
        std::vector<eh_step_entry> first;
        for (int i = 0; i < n; ++i) first.push_back(step_entry(s[i], prompts[i].data(), uint32_t(prompts[i].size()), EH_STEP_SAMPLE));
        ASSERT_EQ(b.api->step_begin(b.model, first.data(), uint32_t(n)), EH_OK) << b.error();
        std::vector<int32_t> out(static_cast<size_t>(n));
        for (int k = 1; k <= kSteps + 1; ++k) {
            if (k <= kSteps) {
                std::vector<eh_step_entry> es;
                for (int i = 0; i < n; ++i)
                    es.push_back(with_bias(step_entry(s[i], nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED), k));
                ASSERT_EQ(b.api->step_begin(b.model, es.data(), uint32_t(n)), EH_OK) << b.error();
            }
            ASSERT_EQ(b.api->step_end(b.model, out.data(), uint32_t(n)), EH_OK) << b.error();
            for (int i = 0; i < n; ++i) halves[i].push_back(out[i]);
        }
        for (int i = 0; i < n; ++i) {
            EXPECT_EQ(halves[i], plain[i]) << "sequence " << i;
            EXPECT_EQ(b.api->seq_length(s[i]), uint32_t(prompts[i].size() + kSteps));
        }
        // Ended: the plain calls work again, and a step_end has nothing to end.
        EXPECT_EQ(b.api->step_end(b.model, out.data(), uint32_t(n)), EH_INVALID_ARGUMENT);
        EXPECT_EQ(b.api->seq_truncate(s[0], 2), EH_OK) << b.error();
    }
}
