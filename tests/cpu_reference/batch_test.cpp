// The batched ABI (1.2) of the CPU reference: a sequence's logits and tokens
// are bit-identical whether it runs alone, in a batch, in prefill chunks, or
// through the 1.0 session calls; forks share a prefix without disturbing
// their source; KV_FULL and every invalid step change nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "plugin_handle.hpp"
#include "synthetic_model.hpp"

namespace {

using namespace cpuref_test;


// kv_init and a few sequences through the C table.
struct Batched {
    eh_model* model = nullptr;
    eh_kv_info kv{};
    explicit Batched(const eh_model_view* view, uint32_t max_seq_tokens = 64, uint64_t budget = 0,
                     uint32_t max_seqs = 8, uint32_t max_step_tokens = 256) {
        const eh_plugin_api& api = plugin();
        eh_load_params lp = load_params(view);
        if (api.model_load(&lp, &model) != EH_OK) throw std::runtime_error(std::string("load: ") + api.plugin_last_error());
        eh_kv_params p{};
        p.struct_size = sizeof(p);
        p.max_seqs = max_seqs;
        p.max_step_tokens = max_step_tokens;
        p.max_step_entries = max_seqs;
        p.max_seq_tokens = max_seq_tokens;
        p.budget_bytes = budget;
        kv.struct_size = sizeof(kv);
        if (api.kv_init(model, &p, &kv) != EH_OK) throw std::runtime_error(std::string("kv_init: ") + error());
    }
    ~Batched() {
        for (eh_seq* s : seqs) plugin().seq_release(s);
        plugin().model_release(model);
    }
    std::string error() const { return plugin().model_last_error(model); }
    eh_seq* create() {
        eh_seq* s = nullptr;
        EXPECT_EQ(plugin().seq_create(model, &s), EH_OK) << error();
        eh_sampling_params g = greedy_params();
        EXPECT_EQ(plugin().seq_set_sampling(s, &g), EH_OK) << error();
        seqs.push_back(s);
        return s;
    }
    eh_seq* fork(eh_seq* src, uint32_t n) {
        eh_seq* s = nullptr;
        EXPECT_EQ(plugin().seq_fork(src, n, &s), EH_OK) << error();
        eh_sampling_params g = greedy_params();
        EXPECT_EQ(plugin().seq_set_sampling(s, &g), EH_OK) << error();
        seqs.push_back(s);
        return s;
    }
    uint32_t free_blocks() const {
        eh_kv_info i{};
        i.struct_size = sizeof(i);
        EXPECT_EQ(plugin().kv_get_info(model, &i), EH_OK);
        return i.free_blocks;
    }
    std::vector<float> logits(eh_seq* s) const {
        const float* l = nullptr;
        uint32_t n = 0;
        EXPECT_EQ(plugin().seq_logits(s, &l, &n), EH_OK) << error();
        return l ? std::vector<float>(l, l + n) : std::vector<float>();
    }
    std::vector<eh_seq*> seqs;
};

eh_step_entry entry(eh_seq* s, const int32_t* tokens, uint32_t n, uint32_t flags = EH_STEP_SAMPLE | EH_STEP_LOGITS) {
    eh_step_entry e{};
    e.struct_size = sizeof(e);
    e.flags = flags;
    e.seq = s;
    e.tokens = tokens;
    e.n_tokens = n;
    return e;
}

std::vector<int32_t> prompt(uint32_t n, uint32_t salt, uint32_t vocab) {
    std::vector<int32_t> p(n);
    for (uint32_t i = 0; i < n; ++i) p[i] = int32_t((i * 7 + salt * 13 + 1) % vocab);
    return p;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Per position: the sampled token and the logits it came from.
struct Trace {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
};

constexpr int kDecode = 6;

// Each prompt alone: whole prompt, then kDecode single-token steps.
Trace run_alone(const eh_model_view* view, const std::vector<int32_t>& p) {
    Batched b(view);
    eh_seq* s = b.create();
    Trace t;
    eh_step_entry e = entry(s, p.data(), uint32_t(p.size()));
    EXPECT_EQ(plugin().step(b.model, &e, 1), EH_OK) << b.error();
    for (int i = 0; i <= kDecode; ++i) {
        t.tokens.push_back(e.token);
        t.logits.push_back(b.logits(s));
        if (i == kDecode) break;
        int32_t tok = e.token;
        e = entry(s, &tok, 1);
        EXPECT_EQ(plugin().step(b.model, &e, 1), EH_OK) << b.error();
    }
    return t;
}

// All prompts together; prefill in chunks of `chunk` tokens (0 = whole),
// mixed with the decodes of sequences already past their prompt.
std::vector<Trace> run_batched(const eh_model_view* view, const std::vector<std::vector<int32_t>>& prompts,
                               uint32_t chunk) {
    Batched b(view);
    const size_t n = prompts.size();
    std::vector<eh_seq*> s(n);
    std::vector<size_t> fed(n, 0);
    std::vector<int32_t> next(n, -1);
    std::vector<Trace> out(n);
    for (size_t i = 0; i < n; ++i) s[i] = b.create();
    for (int guard = 0; guard < 1000; ++guard) {
        std::vector<eh_step_entry> es;
        std::vector<size_t> who;
        for (size_t i = 0; i < n; ++i) {
            if (out[i].tokens.size() > size_t(kDecode)) continue;
            if (fed[i] < prompts[i].size()) {
                const size_t left = prompts[i].size() - fed[i];
                const uint32_t k = uint32_t(chunk ? std::min<size_t>(chunk, left) : left);
                const bool last = fed[i] + k == prompts[i].size();
                es.push_back(entry(s[i], prompts[i].data() + fed[i], k, last ? EH_STEP_SAMPLE | EH_STEP_LOGITS : 0));
                fed[i] += k;
            } else {
                es.push_back(entry(s[i], &next[i], 1));
            }
            who.push_back(i);
        }
        if (es.empty()) break;
        EXPECT_EQ(plugin().step(b.model, es.data(), uint32_t(es.size())), EH_OK) << b.error();
        for (size_t j = 0; j < es.size(); ++j) {
            const size_t i = who[j];
            if (!(es[j].flags & EH_STEP_SAMPLE)) {
                EXPECT_EQ(es[j].token, -1);
                continue;
            }
            out[i].tokens.push_back(es[j].token);
            out[i].logits.push_back(b.logits(s[i]));
            next[i] = es[j].token;
        }
    }
    return out;
}

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, AloneBatchedChunkedAndSessionGiveEqualBits) {
    TinySpec sp;
    sp.arch = GetParam();
    sp.n_embd = 128;
    sp.n_ff = 128;
    if (sp.arch == "phi3" || sp.arch == "gpt-oss") sp.window = 8;
    auto view = make_tiny(sp);
    const std::vector<std::vector<int32_t>> prompts = {prompt(13, 1, sp.n_vocab), prompt(29, 2, sp.n_vocab),
                                                       prompt(5, 3, sp.n_vocab), prompt(17, 4, sp.n_vocab)};
    std::vector<Trace> alone;
    for (const auto& p : prompts) alone.push_back(run_alone(view->view(), p));
    for (uint32_t chunk : {0u, 4u, 16u}) {
        SCOPED_TRACE("prefill chunk " + std::to_string(chunk));
        auto batched = run_batched(view->view(), prompts, chunk);
        for (size_t i = 0; i < prompts.size(); ++i) {
            ASSERT_EQ(batched[i].tokens, alone[i].tokens) << "sequence " << i;
            for (size_t k = 0; k < alone[i].logits.size(); ++k)
                EXPECT_TRUE(same_bits(batched[i].logits[k], alone[i].logits[k])) << "sequence " << i << " position " << k;
        }
    }
    // The 1.0 session calls run the same forward pass.
    for (size_t i = 0; i < prompts.size(); ++i) {
        Loaded l(view->view(), 64);
        std::vector<float> lg = l.prefill(prompts[i]);
        EXPECT_TRUE(same_bits(lg, alone[i].logits[0])) << "sequence " << i;
        int32_t tok = -1;
        ASSERT_EQ(plugin().session_sample(l.session, &tok), EH_OK);
        EXPECT_EQ(tok, alone[i].tokens[0]);
        ASSERT_EQ(plugin().session_decode(l.session, tok, &tok), EH_OK);
        EXPECT_EQ(tok, alone[i].tokens[1]);
        EXPECT_TRUE(same_bits(l.logits(), alone[i].logits[1]));
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, BatchInvariance, ::testing::Values("llama", "qwen2", "phi3", "gpt2", "gpt-oss"),
                         [](const auto& info) {
                             std::string n = info.param;
                             for (char& c : n)
                                 if (c == '-') c = '_';
                             return n;
                         });

TEST(BatchedSequences, ForkSharesThePrefixAndLeavesTheSourceAlone) {
    TinySpec sp;
    auto view = make_tiny(sp);
    const auto p = prompt(21, 5, sp.n_vocab);  // 21: the fork point falls inside a 16-token block
    Batched b(view->view());
    eh_seq* a = b.create();
    eh_step_entry e = entry(a, p.data(), uint32_t(p.size()));
    ASSERT_EQ(plugin().step(b.model, &e, 1), EH_OK) << b.error();
    const auto a_logits = b.logits(a);
    const int32_t a_next = e.token;
    const uint32_t free_before = b.free_blocks();

    eh_seq* f = b.fork(a, 18);
    EXPECT_EQ(plugin().seq_length(f), 18u);
    EXPECT_EQ(b.free_blocks(), free_before) << "a fork takes no block until it writes";
    // The fork recomputes the last three prompt tokens: same logits, and its
    // write into the shared partial block copies that block.
    e = entry(f, p.data() + 18, 3);
    ASSERT_EQ(plugin().step(b.model, &e, 1), EH_OK) << b.error();
    EXPECT_TRUE(same_bits(b.logits(f), a_logits));
    EXPECT_EQ(e.token, a_next);
    EXPECT_EQ(b.free_blocks(), free_before - 1);
    // The fork diverges; the source continues exactly as an unforked run.
    int32_t other = (a_next + 1) % int32_t(sp.n_vocab);
    e = entry(f, &other, 1);
    ASSERT_EQ(plugin().step(b.model, &e, 1), EH_OK);
    int32_t tok = a_next;
    e = entry(a, &tok, 1);
    ASSERT_EQ(plugin().step(b.model, &e, 1), EH_OK);
    const Trace ref = run_alone(view->view(), p);
    EXPECT_EQ(e.token, ref.tokens[1]);
    EXPECT_TRUE(same_bits(b.logits(a), ref.logits[1]));
}

TEST(BatchedSequences, KvFullChangesNothingAndReleaseGivesBlocksBack) {
    TinySpec sp;
    auto view = make_tiny(sp);
    // 32 tokens per sequence = 2 blocks; a pool of 3 blocks.
    Batched probe(view->view(), 32);
    const uint64_t block = probe.kv.block_bytes;
    Batched b(view->view(), 32, 3 * block);
    ASSERT_EQ(b.kv.total_blocks, 3u);
    ASSERT_EQ(b.kv.block_tokens, 16u);
    eh_seq* x = b.create();
    eh_seq* y = b.create();
    const auto px = prompt(20, 1, sp.n_vocab), py = prompt(20, 2, sp.n_vocab);
    eh_step_entry e = entry(x, px.data(), 20);
    ASSERT_EQ(plugin().step(b.model, &e, 1), EH_OK);
    EXPECT_EQ(b.free_blocks(), 1u);
    eh_step_entry both[2] = {entry(x, px.data(), 1), entry(y, py.data(), 20)};
    EXPECT_EQ(plugin().step(b.model, both, 2), EH_KV_FULL);
    EXPECT_NE(b.error().find("free KV blocks"), std::string::npos) << b.error();
    EXPECT_EQ(plugin().seq_length(x), 20u);
    EXPECT_EQ(plugin().seq_length(y), 0u);
    EXPECT_EQ(b.free_blocks(), 1u);
    ASSERT_EQ(plugin().seq_truncate(x, 10), EH_OK);
    EXPECT_EQ(b.free_blocks(), 2u);
    e = entry(y, py.data(), 20);
    EXPECT_EQ(plugin().step(b.model, &e, 1), EH_OK) << b.error();
    EXPECT_EQ(b.free_blocks(), 0u);
    plugin().seq_release(y);
    b.seqs.erase(b.seqs.begin() + 1);
    EXPECT_EQ(b.free_blocks(), 2u);
}

TEST(BatchedSequences, InvalidStepsAreRefusedWithoutChange) {
    TinySpec sp;
    auto view = make_tiny(sp);
    Batched b(view->view(), 64, 0, 2, 32);
    eh_seq* x = b.create();
    const auto p = prompt(8, 1, sp.n_vocab);
    auto refused = [&](std::vector<eh_step_entry> es, const char* what) {
        EXPECT_EQ(plugin().step(b.model, es.data(), uint32_t(es.size())), EH_INVALID_ARGUMENT) << what;
        EXPECT_NE(b.error().find(what), std::string::npos) << b.error();
        EXPECT_EQ(plugin().seq_length(x), 0u);
    };
    int32_t bad = int32_t(sp.n_vocab);
    refused({entry(x, &bad, 1)}, "outside the vocabulary");
    refused({entry(x, p.data(), 4), entry(x, p.data(), 4)}, "appears twice");
    const auto big = prompt(33, 1, sp.n_vocab);
    refused({entry(x, big.data(), 33)}, "max_step_tokens");
    eh_seq* raw = nullptr;
    ASSERT_EQ(plugin().seq_create(b.model, &raw), EH_OK);
    b.seqs.push_back(raw);
    refused({entry(raw, p.data(), 1)}, "seq_set_sampling");
    eh_seq* third = nullptr;
    EXPECT_EQ(plugin().seq_create(b.model, &third), EH_NO_CAPACITY);  // ABI 1.4: max_seqs are alive
    std::vector<uint32_t> none((sp.n_vocab + 31) / 32, 0);
    eh_step_entry masked = entry(x, p.data(), 8);
    masked.allowed = none.data();
    refused({masked}, "allows no token");
    EXPECT_EQ(plugin().seq_fork(x, 5, &third), EH_INVALID_ARGUMENT);  // longer than x
}

TEST(BatchedSequences, MaskAndBiasSteerTheSampledToken) {
    TinySpec sp;
    auto view = make_tiny(sp);
    Batched b(view->view());
    const auto p = prompt(8, 1, sp.n_vocab);
    eh_seq* x = b.create();
    eh_seq* y = b.create();
    std::vector<uint32_t> only7((sp.n_vocab + 31) / 32, 0);
    only7[0] = 1u << 7;
    const int32_t bias_tok = 3;
    const float bias_val = 1000.0f;
    eh_step_entry es[2] = {entry(x, p.data(), 8), entry(y, p.data(), 8)};
    es[0].allowed = only7.data();
    es[1].n_bias = 1;
    es[1].bias_tokens = &bias_tok;
    es[1].bias_values = &bias_val;
    ASSERT_EQ(plugin().step(b.model, es, 2), EH_OK) << b.error();
    EXPECT_EQ(es[0].token, 7);
    EXPECT_EQ(es[1].token, 3);
    // Raw logits are unbiased: the same for both.
    EXPECT_TRUE(same_bits(b.logits(x), b.logits(y)));
}

}  // namespace

// ABI 1.3: steps in two halves, each begun before the one ahead of it is
// read, its decode tokens taken from the step in flight (EH_STEP_CHAINED).
// Tokens and sequences must be what plain step() calls give, with sampling
// at a temperature (draws keyed by position) and a repetition penalty on
// one sequence (its history includes the chained tokens).
TEST(StepHalves, ChainedStepsGiveThePlainStepsTokens) {
    TinySpec sp;
    sp.n_embd = 128;
    sp.n_ff = 128;
    auto view = make_tiny(sp);
    const std::vector<std::vector<int32_t>> prompts = {prompt(13, 1, sp.n_vocab), prompt(21, 2, sp.n_vocab),
                                                       prompt(6, 3, sp.n_vocab)};
    const size_t n = prompts.size();
    constexpr int kSteps = 12;
    auto setup = [&](Batched& b) {
        std::vector<eh_seq*> s;
        for (size_t i = 0; i < n; ++i) {
            s.push_back(b.create());
            eh_sampling_params p = greedy_params();
            p.temperature = 0.9f;
            p.seed = 40 + i;
            if (i == 1) p.repetition_penalty = 1.3f;
            EXPECT_EQ(plugin().seq_set_sampling(s[i], &p), EH_OK);
        }
        return s;
    };
    // Plain: the prompts, then kSteps decodes of all three.
    std::vector<std::vector<int32_t>> plain(n);
    std::vector<uint32_t> plain_len(n);
    {
        Batched b(view->view());
        auto s = setup(b);
        std::vector<eh_step_entry> es;
        for (size_t i = 0; i < n; ++i) es.push_back(entry(s[i], prompts[i].data(), uint32_t(prompts[i].size()), EH_STEP_SAMPLE));
        std::vector<int32_t> next(n);
        for (int k = 0; k <= kSteps; ++k) {
            ASSERT_EQ(plugin().step(b.model, es.data(), uint32_t(n)), EH_OK) << b.error();
            for (size_t i = 0; i < n; ++i) {
                plain[i].push_back(es[i].token);
                next[i] = es[i].token;
            }
            for (size_t i = 0; i < n; ++i) es[i] = entry(s[i], &next[i], 1, EH_STEP_SAMPLE);
        }
        for (size_t i = 0; i < n; ++i) plain_len[i] = plugin().seq_length(s[i]);
    }
    // Halves: step k+1 begins (chained) before step k ends.
    Batched b(view->view());
    auto s = setup(b);
    std::vector<eh_step_entry> first;
    for (size_t i = 0; i < n; ++i) first.push_back(entry(s[i], prompts[i].data(), uint32_t(prompts[i].size()), EH_STEP_SAMPLE));
    ASSERT_EQ(plugin().step_begin(b.model, first.data(), uint32_t(n)), EH_OK) << b.error();
    std::vector<std::vector<int32_t>> halves(n);
    std::vector<int32_t> out(n);
    for (int k = 1; k <= kSteps + 1; ++k) {
        if (k <= kSteps) {
            std::vector<eh_step_entry> es;
            for (size_t i = 0; i < n; ++i) es.push_back(entry(s[i], nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED));
            ASSERT_EQ(plugin().step_begin(b.model, es.data(), uint32_t(n)), EH_OK) << b.error();
            for (size_t i = 0; i < n; ++i)  // lengths count the step in flight at once
                EXPECT_EQ(plugin().seq_length(s[i]), uint32_t(prompts[i].size()) + uint32_t(k));
        }
        ASSERT_EQ(plugin().step_end(b.model, out.data(), uint32_t(n)), EH_OK) << b.error();
        for (size_t i = 0; i < n; ++i) halves[i].push_back(out[i]);
    }
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(halves[i], plain[i]) << "sequence " << i;
        EXPECT_EQ(plugin().seq_length(s[i]), plain_len[i]);
    }
    // Nothing in flight: the plain calls work again.
    EXPECT_EQ(plugin().seq_truncate(s[0], 3), EH_OK) << b.error();
}

TEST(StepHalves, TheirRulesAreEnforced) {
    TinySpec sp;
    auto view = make_tiny(sp);
    Batched b(view->view(), 64, 0, 4, 64);
    eh_seq* x = b.create();
    eh_seq* y = b.create();
    const auto p = prompt(8, 1, sp.n_vocab);
    auto expect_refused = [&](eh_status st, const char* what, eh_status want = EH_INVALID_ARGUMENT) {
        EXPECT_EQ(st, want) << what;
        EXPECT_NE(b.error().find(what), std::string::npos) << b.error();
    };
    int32_t out[2] = {0, 0};
    // Nothing in flight: no chained entry, no step_end.
    eh_step_entry chained = entry(x, nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED);
    expect_refused(plugin().step(b.model, &chained, 1), "no step in flight samples");
    expect_refused(plugin().step_begin(b.model, &chained, 1), "no step in flight samples");
    expect_refused(plugin().step_end(b.model, out, 1), "no step is in flight");
    EXPECT_EQ(plugin().seq_length(x), 0u);

    eh_step_entry e = entry(x, p.data(), 8, EH_STEP_SAMPLE);
    ASSERT_EQ(plugin().step_begin(b.model, &e, 1), EH_OK) << b.error();
    // While it flies: no seq_* call that changes state, no plain step, no logits.
    eh_seq* z = nullptr;
    // (ABI 1.4: EH_BUSY, a state error, not a bad argument.)
    expect_refused(plugin().seq_create(b.model, &z), "in flight", EH_BUSY);
    expect_refused(plugin().seq_truncate(x, 2), "in flight", EH_BUSY);
    eh_step_entry plain = entry(y, p.data(), 4, EH_STEP_SAMPLE);
    expect_refused(plugin().step(b.model, &plain, 1), "in flight", EH_BUSY);
    eh_step_entry with_logits = entry(y, p.data(), 4, EH_STEP_SAMPLE | EH_STEP_LOGITS);
    expect_refused(plugin().step_begin(b.model, &with_logits, 1), "EH_STEP_LOGITS");
    // y sampled in no step in flight: it cannot chain; x can.
    eh_step_entry ychain = entry(y, nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED);
    expect_refused(plugin().step_begin(b.model, &ychain, 1), "no step in flight samples");
    eh_step_entry two[2] = {entry(x, nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED), entry(y, p.data(), 4, EH_STEP_SAMPLE)};
    ASSERT_EQ(plugin().step_begin(b.model, two, 2), EH_OK) << b.error();
    eh_step_entry third = entry(y, nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED);
    expect_refused(plugin().step_begin(b.model, &third, 1), "two steps are in flight", EH_BUSY);
    expect_refused(plugin().step_end(b.model, out, 2), "differs");
    ASSERT_EQ(plugin().step_end(b.model, out, 1), EH_OK) << b.error();
    const int32_t first = out[0];
    ASSERT_EQ(plugin().step_end(b.model, out, 2), EH_OK) << b.error();
    EXPECT_EQ(plugin().seq_length(x), 9u);
    EXPECT_EQ(plugin().seq_length(y), 4u);
    EXPECT_GE(first, 0);
    EXPECT_GE(out[0], 0);
    EXPECT_GE(out[1], 0);
    // All ended: everything is allowed again.
    EXPECT_EQ(plugin().seq_truncate(x, 2), EH_OK) << b.error();
}
