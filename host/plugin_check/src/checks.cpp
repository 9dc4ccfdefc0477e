#include "checks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>

#include "driver.hpp"
#include "eh/error.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/gguf_writer.hpp"

namespace eh::plugin_check {
namespace {

// A check that does not apply to this plugin (an optional member it does
// not offer, a feature its model lacks).
struct Skipped {
    std::string why;
};

// The main model's KV cache: room for every check but kv_full, which loads
// the model again with a small budget.
constexpr uint32_t kMaxSeqs = 8, kStepTokens = 256, kSeqTokens = 256;

eh_kv_params kv_params(uint32_t max_seqs, uint64_t budget_bytes = 0, uint32_t kv_type = 0) {
    eh_kv_params kp{};
    kp.struct_size = sizeof(kp);
    kp.max_seqs = max_seqs;
    kp.max_step_tokens = kStepTokens;
    kp.max_step_entries = max_seqs;
    kp.max_seq_tokens = kSeqTokens;
    kp.budget_bytes = budget_bytes;
    kp.kv_type = kv_type;
    return kp;
}

struct Context {
    const CheckOptions& options;
    Driver& d;
    uint32_t n;  // tokens a generation samples

    // A check that builds sequences of `tokens` tokens, or steps of
    // `step_tokens`, is skipped (not failed) when the plugin granted less:
    // the ABI lets it grant less than asked.
    void needs(uint32_t tokens, uint32_t step_tokens = 1, uint32_t seqs = 1) const {
        const eh_kv_info& g = d.granted();
        if (g.max_seq_tokens < tokens || g.max_step_tokens < step_tokens || g.max_seqs < seqs ||
            g.max_step_entries < std::min(seqs, 4u))
            throw Skipped{fmt::format("needs sequences of {} tokens, steps of {} tokens and {} sequences; the plugin "
                                      "granted {}, {} and {}",
                                      tokens, step_tokens, seqs, g.max_seq_tokens, g.max_step_tokens, g.max_seqs)};
    }

    // Deterministic prompt ids, clear of the lowest ids (control tokens in
    // most vocabularies).
    std::vector<int32_t> prompt(uint32_t length, uint32_t salt) const {
        const uint32_t lo = d.vocab() > 16 ? 3 : 0, span = std::max<uint32_t>(1, std::min<uint32_t>(d.vocab(), 32000) - lo);
        std::vector<int32_t> p(length);
        uint64_t x = 0x9E3779B97F4A7C15ull * (salt + 1);
        for (auto& t : p) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            t = int32_t(lo + (x >> 33) % span);
        }
        return p;
    }
};

void expect_same(const std::vector<int32_t>& want, const std::vector<int32_t>& got, const std::string& what) {
    if (want == got) return;
    size_t i = 0;
    while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
    fail(fmt::format("{}: token {} differs ({} against {})", what, i, i < got.size() ? got[i] : -1,
                     i < want.size() ? want[i] : -1));
}

void kv_init_grant(Context& c) {
    const eh_kv_info& g = c.d.granted();
    if (!g.block_tokens || !g.total_blocks || !g.max_seqs || !g.max_step_tokens || !g.max_step_entries ||
        !g.max_seq_tokens)
        fail("kv_init granted a zero limit");
    if (g.max_seqs > kMaxSeqs || g.max_step_tokens > kStepTokens || g.max_step_entries > kMaxSeqs ||
        g.max_seq_tokens > kSeqTokens)
        fail(fmt::format("kv_init granted more than asked: max_seqs {} (asked {}), max_step_tokens {} ({}), "
                         "max_step_entries {} ({}), max_seq_tokens {} ({})",
                         g.max_seqs, kMaxSeqs, g.max_step_tokens, kStepTokens, g.max_step_entries, kMaxSeqs,
                         g.max_seq_tokens, kSeqTokens));
    const eh_kv_info now = c.d.kv_info();
    if (now.free_blocks != now.total_blocks)
        fail(fmt::format("{} of {} blocks are free before any sequence exists", now.free_blocks, now.total_blocks));
    if (now.total_blocks != g.total_blocks || now.block_tokens != g.block_tokens)
        fail("kv_get_info disagrees with what kv_init granted");
}

void sequence_lengths(Context& c) {
    c.needs(13, 10);
    eh_seq* s = c.d.create();
    if (c.d.length(s) != 0) fail("a new sequence is not empty");
    const auto p = c.prompt(13, 1);
    std::vector<eh_step_entry> es{entry(s, p.data(), 10, 0)};
    c.d.step_ok(es, "ten tokens");
    es = {entry(s, p.data() + 10, 3, 0)};
    c.d.step_ok(es, "three more");
    if (c.d.length(s) != 13) fail(fmt::format("length {} after 10 + 3 tokens", c.d.length(s)));
    if (c.d.api().seq_truncate(s, 5) != EH_OK) fail("seq_truncate to 5 failed: " + c.d.error());
    if (c.d.length(s) != 5) fail(fmt::format("length {} after truncating to 5", c.d.length(s)));
    if (c.d.api().seq_truncate(s, 6) == EH_OK) fail("seq_truncate past the length succeeded");
    if (c.d.length(s) != 5) fail("a refused seq_truncate changed the length");
}

void no_capacity(Context& c) {
    const uint32_t cap = c.d.granted().max_seqs;
    if (cap > kMaxSeqs) fail(fmt::format("kv_init granted {} sequences, more than the {} asked", cap, kMaxSeqs));
    for (uint32_t i = 0; i < cap; ++i) c.d.create();
    eh_seq* extra = nullptr;
    const eh_status st = c.d.try_create(&extra);
    const eh_status want = c.d.api().abi_minor >= 4 ? EH_NO_CAPACITY : EH_INVALID_ARGUMENT;
    if (st != want)
        fail(fmt::format("seq_create with {} sequences alive returned {}, not {}", cap, eh_status_name(st),
                         eh_status_name(want)));
}

// A block count the ABI fixes: a sequence of `length` tokens holds
// ceil(length / block_tokens) blocks.
uint32_t blocks_for(uint32_t length, uint32_t block_tokens) { return (length + block_tokens - 1) / block_tokens; }

void invalid_steps(Context& c) {
    c.needs(8, 8, 2);
    const eh_kv_info& g = c.d.granted();
    const auto p = c.prompt(std::max<uint32_t>(8, g.max_step_tokens + 1), 19);
    eh_seq* x = c.d.create();
    c.d.set_sampling(x, ehp::greedy_sampling());
    std::vector<eh_step_entry> es{entry(x, p.data(), 4, 0)};
    c.d.step_ok(es, "four tokens");
    eh_seq* raw = c.d.create();  // no sampler
    const uint32_t free_before = c.d.kv_info().free_blocks;
    // Each must be refused with EH_INVALID_ARGUMENT and a message, and
    // change no sequence and no block.
    auto refused = [&](std::vector<eh_step_entry> bad, const std::string& what) {
        const eh_status st = c.d.step(bad);
        const std::string message = c.d.error();
        if (st != EH_INVALID_ARGUMENT)
            fail(fmt::format("a step with {} returned {}, not INVALID_ARGUMENT{}", what, eh_status_name(st),
                             st == EH_OK ? "" : ": " + message));
        if (message.empty()) fail(fmt::format("a step with {} was refused without a message", what));
        if (c.d.length(x) != 4 || c.d.length(raw) != 0)
            fail(fmt::format("a step refused for {} changed a sequence's length", what));
        if (c.d.kv_info().free_blocks != free_before)
            fail(fmt::format("a step refused for {} changed the free block count", what));
    };
    const int32_t past_vocab = int32_t(c.d.vocab()), negative = -1;
    refused({entry(x, &past_vocab, 1, EH_STEP_SAMPLE)}, "a token id equal to the vocabulary size");
    refused({entry(x, &negative, 1, EH_STEP_SAMPLE)}, "a negative token id");
    refused({entry(x, p.data() + 4, 2, 0), entry(x, p.data() + 6, 2, 0)}, "one sequence in two entries");
    refused({entry(x, p.data() + 4, 1, 0), entry(nullptr, p.data(), 1, 0)}, "a NULL sequence");
    refused({entry(x, p.data() + 4, 1, 0), entry(raw, p.data(), 1, EH_STEP_SAMPLE)},
            "sampling for a sequence whose sampler was never set");
    std::vector<uint32_t> none((c.d.vocab() + 31) / 32, 0);
    es = {entry(x, p.data() + 4, 1, EH_STEP_SAMPLE)};
    es[0].allowed = none.data();
    refused(es, "an allowed-token mask that allows no token");
    // One token more than a step may hold, over both sequences.
    const uint32_t over = g.max_step_tokens + 1;
    const uint32_t on_x = std::min(over, g.max_seq_tokens - 4), on_raw = over - on_x;
    if (on_raw <= g.max_seq_tokens)
        refused(on_raw ? std::vector<eh_step_entry>{entry(x, p.data(), on_x, 0), entry(raw, p.data(), on_raw, 0)}
                       : std::vector<eh_step_entry>{entry(x, p.data(), on_x, 0)},
                fmt::format("{} tokens (max_step_tokens is {})", over, g.max_step_tokens));
    // One token more than a sequence may hold.
    if (g.max_seq_tokens - 4 + 1 <= g.max_step_tokens)
        refused({entry(x, p.data(), g.max_seq_tokens - 4 + 1, 0)},
                fmt::format("a sequence past max_seq_tokens ({})", g.max_seq_tokens));
    eh_seq* longer = nullptr;
    const eh_status st = c.d.api().seq_fork(x, 5, &longer);
    if (st == EH_OK) {
        c.d.api().seq_release(longer);
        fail("seq_fork of 5 tokens from a sequence of 4 succeeded");
    }
    if (st != EH_INVALID_ARGUMENT) fail(fmt::format("seq_fork past the source's length returned {}, not INVALID_ARGUMENT",
                                                    eh_status_name(st)));
}

void greedy_repeats(Context& c) {
    c.needs(12 + c.n, 12);
    const auto p = c.prompt(12, 2);
    const auto a = c.d.generate(c.d.create(), p, c.n, ehp::greedy_sampling());
    const auto b = c.d.generate(c.d.create(), p, c.n, ehp::greedy_sampling());
    expect_same(a, b, "the same prompt, greedy, twice");
}

void chunked_prefill(Context& c) {
    c.needs(20 + c.n, 20);
    const auto p = c.prompt(20, 3);
    const auto whole = c.d.generate(c.d.create(), p, c.n, ehp::greedy_sampling());
    const auto chunks = c.d.generate(c.d.create(), p, c.n, ehp::greedy_sampling(), 7);
    expect_same(whole, chunks, "a prompt in chunks of 7 against in one step");
}

void batch_invariance(Context& c) {
    c.needs(14 + c.n, 9 + 5 + 14 + 3, 4);
    const auto p = c.prompt(9, 4);
    const auto alone = c.d.generate(c.d.create(), p, c.n, ehp::greedy_sampling());
    std::vector<eh_seq*> seqs{c.d.create(), c.d.create(), c.d.create(), c.d.create()};
    const auto together = c.d.generate_together(seqs, {p, c.prompt(5, 5), c.prompt(14, 6), c.prompt(3, 7)}, c.n, ehp::greedy_sampling());
    expect_same(alone, together[0], "a sequence in a step of four against alone");
}

// One sequence of a composition (batch_compositions): its prompt, fed
// `chunk` tokens a step (0: whole) from step `start` on, then greedy
// decoding; released at step `stop` (0: kept to the end).
struct Member {
    std::vector<int32_t> prompt;
    uint32_t start = 0, chunk = 0, stop = 0;
};

// Steps the members together, each step holding every member that has
// started and not stopped, until member 0 has c.n tokens; its tokens.
std::vector<int32_t> run_composition(Context& c, const std::vector<Member>& ms) {
    struct State {
        eh_seq* seq = nullptr;
        size_t fed = 0;
        std::vector<int32_t> out;
        bool gone = false;
    };
    std::vector<State> st(ms.size());
    for (State& s : st) {
        s.seq = c.d.create();
        c.d.set_sampling(s.seq, ehp::greedy_sampling());
    }
    std::vector<int32_t> last(ms.size());
    for (uint32_t step = 0; st[0].out.size() < c.n; ++step) {
        std::vector<eh_step_entry> es;
        std::vector<size_t> who;
        for (size_t i = 0; i < ms.size(); ++i) {
            const Member& m = ms[i];
            State& s = st[i];
            if (s.gone || step < m.start) continue;
            if (i > 0 && m.stop && step >= m.stop) {
                c.d.release(s.seq);
                s.gone = true;
                continue;
            }
            if (s.fed < m.prompt.size()) {
                const size_t k = std::min<size_t>(m.chunk ? m.chunk : m.prompt.size(), m.prompt.size() - s.fed);
                const bool done = s.fed + k == m.prompt.size();
                es.push_back(entry(s.seq, m.prompt.data() + s.fed, uint32_t(k), done ? EH_STEP_SAMPLE : 0));
                s.fed += k;
            } else {
                last[i] = s.out.back();
                es.push_back(entry(s.seq, &last[i], 1, EH_STEP_SAMPLE));
            }
            who.push_back(i);
        }
        const auto got = c.d.step_ok(es, "a composition's step");
        for (size_t j = 0; j < es.size(); ++j)
            if (es[j].flags & EH_STEP_SAMPLE) st[who[j]].out.push_back(got[j]);
    }
    for (State& s : st)
        if (!s.gone) c.d.release(s.seq);
    return st[0].out;
}

// A probe's greedy tokens alone against among others in many step makeups:
// others starting with it, before it (its prompt beside their prompts and
// decode rows), joining and leaving while it decodes (its steps grow and
// shrink past 8 rows and past 9 tokens, where the dense matmuls change
// kernels), and its own prompt in chunks beside others' decoding.
void batch_compositions(Context& c) {
    c.needs(9 + c.n + 64, 128, 8);
    const auto p = c.prompt(9, 4);
    eh_seq* solo = c.d.create();
    const auto alone = c.d.generate(solo, p, c.n, ehp::greedy_sampling());
    c.d.release(solo);
    auto other = [&](uint32_t len, uint32_t salt, uint32_t start = 0, uint32_t chunk = 0, uint32_t stop = 0) {
        return Member{c.prompt(len, 100 + salt), start, chunk, stop};
    };
    struct Case {
        const char* what;
        std::vector<Member> members;
    };
    std::vector<Case> cases;
    cases.push_back({"beside one other, from the start", {{p}, other(5, 1)}});
    {
        Case k{"beside seven others of 3 to 17 prompt tokens, from the start", {{p}}};
        for (uint32_t i = 0; i < 7; ++i) k.members.push_back(other(3 + 2 * i, 10 + i));
        cases.push_back(k);
    }
    {
        Case k{"joining seven others three steps into their 40-token prompts (chunks of 16)", {{p, 3}}};
        for (uint32_t i = 0; i < 7; ++i) k.members.push_back(other(40, 20 + i, 0, 16));
        cases.push_back(k);
    }
    {
        Case k{"its prompt in chunks of 4 beside three others decoding", {{p, 2, 4}}};
        for (uint32_t i = 0; i < 3; ++i) k.members.push_back(other(6 + i, 30 + i));
        cases.push_back(k);
    }
    {
        Case k{"beside five others that leave one by one", {{p}}};
        for (uint32_t i = 0; i < 5; ++i) k.members.push_back(other(4 + i, 40 + i, 0, 0, 2 + 2 * i));
        cases.push_back(k);
    }
    {
        Case k{"while others join with 20-token prompts, one a step", {{p}}};
        for (uint32_t i = 0; i < 7; ++i) k.members.push_back(other(20, 50 + i, 1 + i));
        cases.push_back(k);
    }
    cases.push_back({"its prompt in the step of two 60-token prompts", {{p}, other(60, 60), other(60, 61)}});
    for (const Case& k : cases) expect_same(alone, run_composition(c, k.members), std::string("a sequence ") + k.what);
}

void prefill_beside_decode(Context& c) {
    c.needs(std::max(10 + c.n, 4 * c.n), 10, 2);
    const auto p = c.prompt(10, 8);
    const auto alone = c.d.generate(c.d.create(), p, c.n, ehp::greedy_sampling());
    eh_seq* a = c.d.create();
    eh_seq* b = c.d.create();
    c.d.set_sampling(a, ehp::greedy_sampling());
    std::vector<eh_step_entry> es{entry(a, p.data(), uint32_t(p.size()), EH_STEP_SAMPLE)};
    std::vector<int32_t> got{c.d.step_ok(es, "prefill")[0]};
    const auto other = c.prompt(4 * c.n, 9);
    for (uint32_t i = 1; i < c.n; ++i) {
        const int32_t tok = got.back();
        es = {entry(a, &tok, 1, EH_STEP_SAMPLE), entry(b, other.data() + 4 * (i - 1), 4, 0)};
        got.push_back(c.d.step_ok(es, "decode beside a prefill chunk")[0]);
    }
    expect_same(alone, got, "decoding beside another sequence's prefill chunks against alone");
}

void fork_shares_prefix(Context& c) {
    // A fork point inside a block (13 tokens, unless the blocks are 13 or
    // fewer), so the fork and its source share a partly filled block: the
    // first to write must copy it, and the other must not see that write.
    const uint32_t bt = c.d.granted().block_tokens;
    const uint32_t at = bt > 13 ? 13 : bt + bt / 2 + (bt == 1);
    c.needs(at + 8 + c.n, at + 8, 3);
    const auto p = c.prompt(at + 8, 10);
    const auto q = c.prompt(8, 18);  // the source's own continuation
    eh_seq* src = c.d.create();
    std::vector<eh_step_entry> es{entry(src, p.data(), at, 0)};
    c.d.step_ok(es, "source prefill");
    const uint32_t free_before = c.d.kv_info().free_blocks;
    eh_seq* f = c.d.fork(src, at);
    if (c.d.length(f) != at) fail(fmt::format("a fork of {} tokens has length {}", at, c.d.length(f)));
    if (c.d.length(src) != at) fail("seq_fork changed its source's length");
    const uint32_t free_after = c.d.kv_info().free_blocks;
    if (free_after != free_before)
        fail(fmt::format("seq_fork took {} free blocks (a fork shares its source's blocks)",
                         int64_t(free_before) - int64_t(free_after)));
    // The fork writes first, then the source goes on with other tokens.
    const std::vector<int32_t> rest(p.begin() + at, p.end());
    const auto forked = c.d.generate(f, rest, c.n, ehp::greedy_sampling());
    // Its writes took the blocks past the shared whole ones: the copy of the
    // shared, partly filled block and the new ones.
    const uint32_t took = free_before - c.d.kv_info().free_blocks;
    const uint32_t want = blocks_for(c.d.length(f), bt) - at / bt;
    if (took != want)
        fail(fmt::format("a fork of {} tokens grown to {} took {} free blocks, not {} (blocks of {} tokens)", at,
                         c.d.length(f), took, want, bt));
    const auto source = c.d.generate(src, q, c.n, ehp::greedy_sampling());
    std::vector<int32_t> src_whole(p.begin(), p.begin() + at);
    src_whole.insert(src_whole.end(), q.begin(), q.end());
    expect_same(c.d.generate(c.d.create(), p, c.n, ehp::greedy_sampling()), forked,
                "a fork continued with the rest of the prompt against the whole prompt");
    expect_same(c.d.generate(c.d.create(), src_whole, c.n, ehp::greedy_sampling()), source,
                "the source continued after its fork wrote against a fresh sequence (copy on write)");
}

void truncate_regrow(Context& c) {
    c.needs(16 + c.n, 16);
    const auto p = c.prompt(16, 11);
    eh_seq* s = c.d.create();
    const uint32_t bt = c.d.granted().block_tokens, free_before = c.d.kv_info().free_blocks;
    auto held = [&]() { return free_before - c.d.kv_info().free_blocks; };
    const auto first = c.d.generate(s, p, c.n, ehp::greedy_sampling());
    if (held() != blocks_for(c.d.length(s), bt))
        fail(fmt::format("a sequence of {} tokens holds {} blocks, not {}", c.d.length(s), held(),
                         blocks_for(c.d.length(s), bt)));
    if (c.d.api().seq_truncate(s, 15) != EH_OK) fail("seq_truncate failed: " + c.d.error());
    if (held() != blocks_for(15, bt))
        fail(fmt::format("truncated to 15 tokens, the sequence holds {} blocks, not {}", held(), blocks_for(15, bt)));
    const auto again = c.d.generate(s, std::span<const int32_t>(p).subspan(15), c.n, ehp::greedy_sampling());
    expect_same(first, again, "truncated to 15 tokens and the 16th stepped again against the first time");
}

eh_sampling_params sampled(float temperature, int32_t top_k, float top_p, uint64_t seed) {
    eh_sampling_params sp = ehp::greedy_sampling();
    sp.temperature = temperature;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.seed = seed;
    return sp;
}

void seeded_sampling(Context& c) {
    c.needs(8 + c.n, 8);
    const eh_sampling_params sp = sampled(0.9f, 40, 0.95f, 1234);
    const auto p = c.prompt(8, 12);
    expect_same(c.d.generate(c.d.create(), p, c.n, sp), c.d.generate(c.d.create(), p, c.n, sp),
                "the same seed and input, sampled, twice");
}

void top_k_one_is_greedy(Context& c) {
    c.needs(8 + c.n, 8);
    const auto p = c.prompt(8, 13);
    expect_same(c.d.generate(c.d.create(), p, c.n, ehp::greedy_sampling()),
                c.d.generate(c.d.create(), p, c.n, sampled(1.0f, 1, 1.0f, 99)), "top_k 1 at temperature 1 against greedy");
}

void allowed_mask(Context& c) {
    c.needs(8 + c.n, 8);
    const auto p = c.prompt(8, 14);
    const int32_t g = c.d.generate(c.d.create(), p, 1, ehp::greedy_sampling())[0];
    const int32_t only = int32_t((uint32_t(g) + 1) % c.d.vocab());
    std::vector<uint32_t> mask((c.d.vocab() + 31) / 32, 0);
    mask[uint32_t(only) / 32] |= 1u << (uint32_t(only) % 32);
    eh_seq* s = c.d.create();
    c.d.set_sampling(s, ehp::greedy_sampling());
    std::vector<eh_step_entry> es{entry(s, p.data(), uint32_t(p.size()), EH_STEP_SAMPLE)};
    es[0].allowed = mask.data();
    const int32_t got = c.d.step_ok(es, "masked prefill")[0];
    if (got != only) fail(fmt::format("a mask allowing only token {} sampled {}", only, got));
}

void logit_bias(Context& c) {
    if (!c.d.api().seq_logits) throw Skipped{"the plugin offers no seq_logits"};
    c.needs(8 + c.n, 8);
    const auto p = c.prompt(8, 15);
    eh_seq* s = c.d.create();
    c.d.set_sampling(s, ehp::greedy_sampling());
    std::vector<eh_step_entry> es{entry(s, p.data(), uint32_t(p.size()), EH_STEP_SAMPLE | EH_STEP_LOGITS)};
    const int32_t g = c.d.step_ok(es, "prefill with logits")[0];
    const float* logits = nullptr;
    uint32_t n = 0;
    if (c.d.api().seq_logits(s, &logits, &n) != EH_OK || !logits) fail("seq_logits failed: " + c.d.error());
    if (n != c.d.vocab()) fail(fmt::format("seq_logits gave {} values for a vocabulary of {}", n, c.d.vocab()));
    const std::vector<float> raw(logits, logits + n);
    const int32_t best = int32_t(std::max_element(logits, logits + n) - logits);
    if (logits[g] < logits[best]) fail(fmt::format("greedy sampled {} (logit {}), not the largest {} (logit {})", g,
                                                   logits[g], best, logits[best]));
    // The runner-up (finite: a plugin may set padded ids to -inf) lifted
    // just past the best.
    int32_t second = -1;
    for (uint32_t i = 0; i < n; ++i)
        if (int32_t(i) != best && std::isfinite(logits[i]) && (second < 0 || logits[i] > logits[second])) second = int32_t(i);
    if (second < 0) throw Skipped{"no second finite logit to lift"};
    const int32_t low = second;
    const int32_t bias_token = low;
    const float bias_value = logits[best] - logits[second] + 1.0f;
    eh_seq* b = c.d.create();
    c.d.set_sampling(b, ehp::greedy_sampling());
    es = {entry(b, p.data(), uint32_t(p.size()), EH_STEP_SAMPLE | EH_STEP_LOGITS)};
    es[0].n_bias = 1;
    es[0].bias_tokens = &bias_token;
    es[0].bias_values = &bias_value;
    const int32_t got = c.d.step_ok(es, "biased prefill")[0];
    if (got != low) fail(fmt::format("a bias lifting token {} past the best sampled {}", low, got));
    // seq_logits are the raw logits: the bias is the sampler's, not theirs.
    if (c.d.api().seq_logits(b, &logits, &n) != EH_OK || !logits || n != raw.size())
        fail("seq_logits after the biased step failed: " + c.d.error());
    if (std::abs(logits[low] - raw[low]) > bias_value / 2)
        fail(fmt::format("seq_logits after a step biasing token {} by {} gives it {}, unbiased {}: not the raw logits",
                         low, bias_value, logits[low], raw[low]));
}

// A second load of the model beside the first, with KV params kp; Skipped
// (its reason after `passed`) when it does not fit.
std::unique_ptr<Driver> second_load(const Context& c, const eh_kv_params& kp, const std::string& passed) {
    try {
        return std::make_unique<Driver>(c.options.plugin, c.options.model, kp, c.options.engine_options,
                                        c.options.devices);
    } catch (const Failure& f) {
        const std::string why = f.what();
        if (why.find("INSUFFICIENT_VRAM") != std::string::npos || why.find("VRAM_OOM") != std::string::npos ||
            why.find("memory") != std::string::npos)
            throw Skipped{passed + "a second copy of the model does not fit beside the first: " + why};
        throw;
    }
}

void kv_full_changes_nothing(Context& c) {
    // A second load of the model with room for three blocks.
    const eh_kv_params kp = kv_params(kMaxSeqs, 3 * c.d.granted().block_bytes, c.options.kv_type);
    const std::unique_ptr<Driver> loaded = second_load(c, kp, "");
    Driver& small = *loaded;
    const eh_kv_info g = small.granted();
    if (uint64_t(g.total_blocks) * g.block_bytes > kp.budget_bytes)
        fail(fmt::format("kv_init with a budget of {} bytes granted {} blocks of {} bytes", kp.budget_bytes,
                         g.total_blocks, g.block_bytes));
    const uint32_t chunk = std::min({g.block_tokens, g.max_step_tokens, g.max_seq_tokens});
    const auto p = c.prompt(chunk, 16);
    std::vector<eh_seq*> seqs;
    std::vector<int32_t> one(1, p[0]);
    for (uint32_t round = 0; round < 4 * g.total_blocks + g.max_seqs; ++round) {
        eh_seq* s = nullptr;
        if (small.try_create(&s) != EH_OK) break;
        seqs.push_back(s);
        std::vector<uint32_t> lengths;
        for (eh_seq* x : seqs) lengths.push_back(small.length(x));
        const uint32_t free = small.kv_info().free_blocks;
        // The new sequence's first block, beside a token for every sequence
        // already alive that has room: a refusal must change none of them.
        std::vector<eh_step_entry> es{entry(s, p.data(), chunk, 0)};
        uint32_t tokens = chunk;
        for (size_t i = 0; i + 1 < seqs.size() && es.size() < g.max_step_entries && tokens < g.max_step_tokens; ++i)
            if (lengths[i] + 1 <= g.max_seq_tokens) {
                es.push_back(entry(seqs[i], one.data(), 1, 0));
                ++tokens;
            }
        const eh_status st = small.step(es);
        if (st == EH_OK) continue;
        const std::string message = small.error();  // before any other call on the model replaces it
        if (st != EH_KV_FULL)
            fail(fmt::format("step returned {}, not KV_FULL, with {} free blocks: {}", eh_status_name(st), free, message));
        if (message.empty()) fail("KV_FULL without a message");
        for (size_t i = 0; i < seqs.size(); ++i)
            if (small.length(seqs[i]) != lengths[i]) fail("a step refused with KV_FULL changed a sequence's length");
        if (small.kv_info().free_blocks != free) fail("a step refused with KV_FULL changed the free block count");
        return;
    }
    throw Skipped{fmt::format("no step ran out of blocks within {} sequences", seqs.size())};
}

// Steps begun with step_begin and not yet ended; whatever a failed check
// leaves in flight is ended, so the checks after it find the model idle.
class Flights {
public:
    explicit Flights(Driver& d) : d_(d) {}
    ~Flights() {
        std::vector<int32_t> out;
        for (uint32_t n : counts_) {
            out.assign(n, -1);
            d_.api().step_end(d_.model(), out.data(), n);
        }
    }
    Flights(const Flights&) = delete;
    Flights& operator=(const Flights&) = delete;
    eh_status try_begin(std::vector<eh_step_entry>& es) {
        const eh_status st = d_.api().step_begin(d_.model(), es.data(), uint32_t(es.size()));
        if (st == EH_OK) counts_.push_back(uint32_t(es.size()));
        return st;
    }
    void begin(std::vector<eh_step_entry>& es, const char* what) {
        const eh_status st = try_begin(es);
        if (st != EH_OK) fail(fmt::format("{}: step_begin returned {}: {}", what, eh_status_name(st), d_.error()));
    }
    std::vector<int32_t> end(const char* what) {
        if (counts_.empty()) fail(std::string(what) + ": no step to end");
        std::vector<int32_t> out(counts_.front(), -1);
        const eh_status st = d_.api().step_end(d_.model(), out.data(), counts_.front());
        if (st != EH_OK) fail(fmt::format("{}: step_end returned {}: {}", what, eh_status_name(st), d_.error()));
        counts_.pop_front();
        return out;
    }

private:
    Driver& d_;
    std::deque<uint32_t> counts_;
};

void step_halves(Context& c) {
    if (!loader::api_has_step_halves(c.d.api())) throw Skipped{"the plugin offers no step_begin / step_end"};
    c.needs(21 + c.n, 21 + 13 + 6, 3);
    {   // One sequence, each half at once after the other.
        const auto p = c.prompt(10, 17);
        const auto plain = c.d.generate(c.d.create(), p, c.n, ehp::greedy_sampling());
        eh_seq* s = c.d.create();
        c.d.set_sampling(s, ehp::greedy_sampling());
        Flights flights(c.d);
        std::vector<int32_t> got;
        int32_t tok = -1;
        for (uint32_t i = 0; i < c.n; ++i) {
            std::vector<eh_step_entry> es{i == 0 ? entry(s, p.data(), uint32_t(p.size()), EH_STEP_SAMPLE)
                                                 : entry(s, &tok, 1, EH_STEP_SAMPLE)};
            flights.begin(es, "one sequence");
            tok = flights.end("one sequence")[0];
            got.push_back(tok);
        }
        expect_same(plain, got, "step_begin + step_end against step");
        c.d.release_all();
    }
    // Three sequences sampled at a temperature, one with a repetition
    // penalty (its history holds the chained tokens): each step begun,
    // EH_STEP_CHAINED, before the one ahead of it is read.
    const std::vector<std::vector<int32_t>> prompts{c.prompt(13, 30), c.prompt(21, 31), c.prompt(6, 32)};
    const size_t n = prompts.size();
    auto make = [&]() {
        std::vector<eh_seq*> seqs;
        for (size_t i = 0; i < n; ++i) {
            eh_sampling_params sp = sampled(0.9f, 0, 1.0f, 40 + i);
            if (i == 1) sp.repetition_penalty = 1.3f;
            seqs.push_back(c.d.create());
            c.d.set_sampling(seqs.back(), sp);
        }
        return seqs;
    };
    std::vector<std::vector<int32_t>> plain(n), halves(n);
    std::vector<uint32_t> plain_length(n);
    {
        const auto seqs = make();
        std::vector<eh_step_entry> es;
        for (size_t i = 0; i < n; ++i)
            es.push_back(entry(seqs[i], prompts[i].data(), uint32_t(prompts[i].size()), EH_STEP_SAMPLE));
        std::vector<int32_t> next(n);
        for (uint32_t k = 0; k < c.n; ++k) {
            const auto t = c.d.step_ok(es, "plain steps");
            for (size_t i = 0; i < n; ++i) plain[i].push_back(next[i] = t[i]);
            for (size_t i = 0; i < n; ++i) es[i] = entry(seqs[i], &next[i], 1, EH_STEP_SAMPLE);
        }
        for (size_t i = 0; i < n; ++i) plain_length[i] = c.d.length(seqs[i]);
        c.d.release_all();
    }
    const auto seqs = make();
    Flights flights(c.d);
    std::vector<eh_step_entry> es;
    for (size_t i = 0; i < n; ++i)
        es.push_back(entry(seqs[i], prompts[i].data(), uint32_t(prompts[i].size()), EH_STEP_SAMPLE));
    flights.begin(es, "the prompts");
    for (uint32_t k = 1; k <= c.n; ++k) {
        if (k < c.n) {
            es.clear();
            for (size_t i = 0; i < n; ++i) es.push_back(entry(seqs[i], nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED));
            flights.begin(es, "a chained step");
            for (size_t i = 0; i < n; ++i)
                if (c.d.length(seqs[i]) != prompts[i].size() + k)
                    fail(fmt::format("seq_length {} while a chained step is in flight, not {} (it counts the step "
                                     "in flight at once)",
                                     c.d.length(seqs[i]), prompts[i].size() + k));
        }
        const auto t = flights.end("a chained step");
        for (size_t i = 0; i < n; ++i) halves[i].push_back(t[i]);
    }
    for (size_t i = 0; i < n; ++i) {
        expect_same(plain[i], halves[i], fmt::format("sequence {}, sampled, chained steps against plain steps", i));
        if (c.d.length(seqs[i]) != plain_length[i])
            fail(fmt::format("sequence {} is {} tokens long after chained steps, {} after plain ones", i,
                             c.d.length(seqs[i]), plain_length[i]));
    }
}

void step_halves_rules(Context& c) {
    if (!loader::api_has_step_halves(c.d.api())) throw Skipped{"the plugin offers no step_begin / step_end"};
    c.needs(16, 16, 3);
    const eh_status busy = c.d.api().abi_minor >= 4 ? EH_BUSY : EH_INVALID_ARGUMENT;
    eh_seq* x = c.d.create();
    eh_seq* y = c.d.create();
    c.d.set_sampling(x, ehp::greedy_sampling());
    c.d.set_sampling(y, ehp::greedy_sampling());
    const auto p = c.prompt(8, 33);
    Flights flights(c.d);
    auto expect = [&](eh_status st, eh_status want, const std::string& what) {
        if (st != want)
            fail(fmt::format("{} returned {}, not {}{}", what, eh_status_name(st), eh_status_name(want),
                             st == EH_OK ? "" : ": " + c.d.error()));
        if (c.d.error().empty()) fail(what + " was refused without a message");
    };
    int32_t out[2] = {-1, -1};
    // Nothing in flight: nothing to chain to, nothing to end.
    std::vector<eh_step_entry> es{entry(x, nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED)};
    expect(c.d.step(es), EH_INVALID_ARGUMENT, "step with a chained entry and no step in flight");
    expect(flights.try_begin(es), EH_INVALID_ARGUMENT, "step_begin with a chained entry and no step in flight");
    expect(c.d.api().step_end(c.d.model(), out, 1), EH_INVALID_ARGUMENT, "step_end with no step in flight");
    if (c.d.length(x) != 0) fail("a refused step changed the sequence's length");

    es = {entry(x, p.data(), 8, EH_STEP_SAMPLE)};
    flights.begin(es, "x's prompt");
    if (c.d.length(x) != 8) fail(fmt::format("seq_length {} with an 8-token step in flight, not 8", c.d.length(x)));
    // While it flies: no call that changes a sequence, no plain step.
    eh_seq* z = nullptr;
    const eh_status created = c.d.api().seq_create(c.d.model(), &z);
    if (created == EH_OK) c.d.api().seq_release(z);
    expect(created, busy, "seq_create while a step is in flight");
    expect(c.d.api().seq_truncate(x, 2), busy, "seq_truncate while a step is in flight");
    es = {entry(y, p.data(), 4, EH_STEP_SAMPLE)};
    expect(c.d.step(es), busy, "step while a step is in flight");
    es = {entry(y, p.data(), 4, EH_STEP_SAMPLE | EH_STEP_LOGITS)};
    expect(flights.try_begin(es), EH_INVALID_ARGUMENT, "step_begin asking EH_STEP_LOGITS while a step is in flight");
    es = {entry(y, nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED)};
    expect(flights.try_begin(es), EH_INVALID_ARGUMENT,
           "step_begin chaining a sequence the step in flight does not sample for");
    if (c.d.length(x) != 8 || c.d.length(y) != 0) fail("a refused call changed a sequence's length");
    es = {entry(x, nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED), entry(y, p.data(), 4, EH_STEP_SAMPLE)};
    flights.begin(es, "x chained beside y's prompt");
    es = {entry(y, nullptr, 1, EH_STEP_SAMPLE | EH_STEP_CHAINED)};
    expect(flights.try_begin(es), busy, "step_begin with two steps in flight");
    expect(c.d.api().step_end(c.d.model(), out, 2), EH_INVALID_ARGUMENT,
           "step_end with a count other than the oldest step's");
    flights.end("x's prompt");
    flights.end("x chained beside y's prompt");
    if (c.d.length(x) != 9 || c.d.length(y) != 4)
        fail(fmt::format("lengths {} and {} after the steps ended, not 9 and 4", c.d.length(x), c.d.length(y)));
    // All ended: the calls refused in flight work again.
    if (c.d.api().seq_truncate(x, 2) != EH_OK) fail("seq_truncate after every step ended failed: " + c.d.error());
}

void load_progress_cancel(Context& c) {
    // A second load of the model, its progress recorded; then one whose
    // cancel callback asks to stop at every poll.
    eh_load_params lp{};
    lp.struct_size = sizeof(lp);
    lp.path = c.options.model->path().c_str();
    lp.view = &c.options.model->view();
    if (!c.options.engine_options.empty()) lp.options_json = c.options.engine_options.c_str();
    if (c.options.devices.size() > 1) {
        lp.device = c.options.devices[0];
        lp.n_devices = uint32_t(c.options.devices.size());
        lp.devices = c.options.devices.data();
    }
    std::vector<float> seen;
    lp.progress = [](void* user, float fraction, const char*) { static_cast<std::vector<float>*>(user)->push_back(fraction); };
    lp.progress_user = &seen;
    eh_model* m = nullptr;
    eh_status st = c.d.api().model_load(&lp, &m);
    if (st != EH_OK) {
        const std::string why = c.d.api().plugin_last_error();
        if (st == EH_INSUFFICIENT_VRAM || st == EH_VRAM_OOM)
            throw Skipped{"a second copy of the model does not fit beside the first: " + why};
        fail(fmt::format("a second model_load returned {}: {}", eh_status_name(st), why));
    }
    c.d.api().model_release(m);
    for (size_t i = 0; i < seen.size(); ++i) {
        if (!(seen[i] >= 0.0f && seen[i] <= 1.0f)) fail(fmt::format("progress reported {}, outside [0, 1]", seen[i]));
        if (i && seen[i] < seen[i - 1]) fail(fmt::format("progress went back from {} to {}", seen[i - 1], seen[i]));
    }
    if (!seen.empty() && (seen.back() != 1.0f || std::count(seen.begin(), seen.end(), 1.0f) != 1))
        fail(fmt::format("progress reported 1.0 {} times, the last report {}: want 1.0 once, at the end",
                         std::count(seen.begin(), seen.end(), 1.0f), seen.back()));
    lp.progress = nullptr;
    int polls = 0;
    lp.cancel = [](void* user) -> int32_t { return ++*static_cast<int*>(user) > 0; };
    lp.cancel_user = &polls;
    m = reinterpret_cast<eh_model*>(&polls);  // must come back NULL on failure
    st = c.d.api().model_load(&lp, &m);
    if (st == EH_OK) {
        c.d.api().model_release(m);
        if (polls) fail(fmt::format("model_load polled a cancel that asked to stop {} times and loaded anyway", polls));
        // A load with no safe point to stop at may ignore the callback.
        if (seen.empty()) throw Skipped{"model_load reports no progress and polls no cancel callback"};
        return;
    }
    if (st != EH_CANCELLED)
        fail(fmt::format("a cancelled model_load returned {}, not CANCELLED: {}", eh_status_name(st),
                         c.d.api().plugin_last_error()));
    if (m) fail("a cancelled model_load left *out_model set");
}

void kv_cache_type(Context& c) {
    const eh_kv_info g = c.d.granted();
    if (g.struct_size < offsetof(eh_kv_info, kv_type) + sizeof(g.kv_type))
        throw Skipped{"the plugin predates ABI 1.4's KV cache types (its eh_kv_info has no kv_type)"};
    if (c.options.kv_type && g.kv_type != c.options.kv_type)
        fail(fmt::format("kv_init asked for KV type {} granted type {} (a plugin must refuse a type it cannot store)",
                         c.options.kv_type, g.kv_type));
    if (c.d.kv_info().kv_type != g.kv_type)
        fail(fmt::format("kv_get_info says KV type {}, kv_init granted {}", c.d.kv_info().kv_type, g.kv_type));
    // A second load asking an id no one has defined.
    constexpr uint32_t kUndefined = 77;
    try {
        Driver other(c.options.plugin, c.options.model, kv_params(2, 0, kUndefined), c.options.engine_options,
                     c.options.devices);
    } catch (const Failure& f) {
        const std::string why = f.what();
        if (why.rfind("model_load failed", 0) == 0)
            throw Skipped{"a second copy of the model does not load beside the first: " + why};
        if (why.rfind(std::string("kv_init returned ") + eh_status_name(EH_UNSUPPORTED), 0) != 0 ||
            why.find(std::to_string(kUndefined)) == std::string::npos)
            fail(fmt::format("kv_init asked for the undefined KV type {}: want EH_UNSUPPORTED and a message naming "
                             "it, got {}",
                             kUndefined, why));
        return;
    }
    fail(fmt::format("kv_init granted the undefined KV type {}", kUndefined));
}

// ABI 1.5: the final hidden state of an entry's last position, alone and
// beside another sequence's prefill in chunked steps, must agree; a step
// that does not ask drops it; a plugin without seq_hidden refuses the flag.
// (1.6) Rows in place of token embeddings for a span of a step's tokens.
// Random rows: what they compute is the model's business; that they are
// used, used once, and checked is the ABI's.
void embd_spans(Context& c) {
    const eh_plugin_api& api = c.d.api();
    const bool has = api.abi_minor >= 6 && api.struct_size >= loader::api_table_size(6) && api.image_encoder_load &&
                     api.image_encode && api.seq_embd_spans;
    if (!has) throw Skipped{"the plugin has no image calls (ABI 1.6 image_encoder_load, image_encode, seq_embd_spans)"};
    if (!api.seq_logits) throw Skipped{"the plugin offers no seq_logits"};
    c.needs(8, 8, 1);
    const std::string arch(c.options.model->architecture());
    const std::optional<uint64_t> width = c.options.model->get_uint(arch + ".embedding_length");
    if (!width || *width == 0 || *width > (1u << 16)) throw Skipped{"the model file names no embedding_length"};
    const size_t E = *width;
    std::vector<float> rows(4 * E);
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (float& r : rows) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        r = float(int64_t(x >> 40) - (1 << 23)) / float(1 << 23);
    }
    const auto p = c.prompt(8, 41);
    auto run = [&](const std::vector<eh_embd_span>& spans, const char* what) {
        eh_seq* s = c.d.create();
        if (api.seq_embd_spans(s, spans.data(), uint32_t(spans.size())) != EH_OK)
            fail(fmt::format("seq_embd_spans ({}) failed: {}", what, c.d.error()));
        std::vector<eh_step_entry> es{entry(s, p.data(), 8, EH_STEP_LOGITS)};
        c.d.step_ok(es, what);
        const float* l = nullptr;
        uint32_t n = 0;
        if (api.seq_logits(s, &l, &n) != EH_OK || !l) fail(fmt::format("seq_logits after {} failed: {}", what, c.d.error()));
        std::vector<float> out(l, l + n);
        c.d.release(s);
        return out;
    };
    const std::vector<float> plain = run({}, "a prompt without spans");
    const std::vector<float> with = run({{2, 4, 0, 0, rows.data()}}, "a prompt with 4 rows for tokens 2..5");
    if (with == plain) fail("rows given for tokens 2..5 left the logits as the tokens' own embeddings gave them");
    if (run({{2, 4, 0, 0, rows.data()}}, "the same rows again") != with)
        fail("the same rows for the same tokens gave other logits");
    {
        // A bidirectional span: taken, or refused by name where the plugin's
        // attention cannot run one on this load (llama-cuda: a quantized KV
        // cache, a tensor-parallel load), with nothing changed.
        eh_seq* b = c.d.create();
        const eh_embd_span bi{2, 4, EH_SPAN_BIDIRECTIONAL, 0, rows.data()};
        if (api.seq_embd_spans(b, &bi, 1) != EH_OK) fail("seq_embd_spans failed: " + c.d.error());
        std::vector<eh_step_entry> be{entry(b, p.data(), 8, EH_STEP_LOGITS)};
        const eh_status bst = c.d.step(be);
        if (bst == EH_UNSUPPORTED) {
            if (c.d.error().find("bidirectional") == std::string::npos)
                fail("a bidirectional span was refused without saying so: " + c.d.error());
            if (c.d.length(b) != 0) fail("a step refused for its bidirectional span changed the sequence");
        } else if (bst != EH_OK) {
            fail(fmt::format("a bidirectional span gave {}: {}", eh_status_name(bst), c.d.error()));
        }
        c.d.release(b);
    }
    if (api.abi_minor >= 8) {
        // 1.8: a grid of 2 x 2 is taken; a width that does not divide the span is refused, changing nothing.
        (void)run({{2, 4, EH_SPAN_GRID, 2, rows.data()}}, "a grid span of 2 x 2");
        eh_seq* g = c.d.create();
        const eh_embd_span uneven{2, 4, EH_SPAN_GRID, 3, rows.data()};
        if (api.seq_embd_spans(g, &uneven, 1) != EH_OK) fail("seq_embd_spans failed: " + c.d.error());
        std::vector<eh_step_entry> ge{entry(g, p.data(), 8, EH_STEP_LOGITS)};
        const eh_status gst = c.d.step(ge);
        if (gst != EH_INVALID_ARGUMENT)
            fail(fmt::format("a grid span of width 3 over 4 positions gave {}, not INVALID_ARGUMENT", eh_status_name(gst)));
        if (c.d.length(g) != 0) fail("a step refused for its grid span changed the sequence");
        c.d.release(g);
    }
    // A span past the entry: refused, nothing changed, and dropped.
    eh_seq* s = c.d.create();
    const eh_embd_span bad{6, 4, 0, 0, rows.data()};
    if (api.seq_embd_spans(s, &bad, 1) != EH_OK) fail("seq_embd_spans failed: " + c.d.error());
    std::vector<eh_step_entry> es{entry(s, p.data(), 8, EH_STEP_LOGITS)};
    const eh_status st = c.d.step(es);
    if (st != EH_INVALID_ARGUMENT)
        fail(fmt::format("a span ending past its entry's 8 tokens gave {}, not INVALID_ARGUMENT", eh_status_name(st)));
    if (c.d.length(s) != 0) fail("a step refused for its span changed the sequence");
    es = {entry(s, p.data(), 8, EH_STEP_LOGITS)};
    c.d.step_ok(es, "the step after a refused one");
    const float* l = nullptr;
    uint32_t n = 0;
    if (api.seq_logits(s, &l, &n) != EH_OK || !l) fail("seq_logits failed: " + c.d.error());
    if (std::vector<float>(l, l + n) != plain) fail("a refused step's spans were used by the next step (they must be dropped)");
}

void hidden_state(Context& c) {
    c.needs(12, 12, 2);
    const auto p = c.prompt(12, 23), q = c.prompt(12, 29);
    if (!loader::api_has_hidden(c.d.api())) {
        eh_seq* s = c.d.create();
        std::vector<eh_step_entry> es{entry(s, p.data(), 4, EH_STEP_HIDDEN)};
        const eh_status st = c.d.step(es);
        if (st != EH_INVALID_ARGUMENT)
            fail(fmt::format("the plugin has no seq_hidden, yet a step asking EH_STEP_HIDDEN returned {}, not "
                             "INVALID_ARGUMENT (an unknown flag)",
                             eh_status_name(st)));
        if (c.d.length(s) != 0) fail("a step refused for EH_STEP_HIDDEN changed the sequence");
        return;
    }
    auto read = [&](eh_seq* s, const char* what) {
        const float* h = nullptr;
        uint32_t n = 0;
        const eh_status st = c.d.api().seq_hidden(s, &h, &n);
        if (st != EH_OK || !h || n == 0)
            fail(fmt::format("seq_hidden after {} returned {}{}", what, eh_status_name(st),
                             st == EH_OK ? " and no values" : ": " + c.d.error()));
        std::vector<float> v(h, h + n);
        for (float x : v)
            if (!std::isfinite(x)) fail(fmt::format("the hidden state after {} holds a non-finite value", what));
        return v;
    };
    eh_seq* a = c.d.create();
    std::vector<eh_step_entry> es{entry(a, p.data(), 12, EH_STEP_HIDDEN)};
    c.d.step_ok(es, "a prompt asking its hidden state");
    const std::vector<float> alone = read(a, "a whole prompt alone");
    // The same prompt in chunks of 5, beside another sequence that samples.
    eh_seq* b = c.d.create();
    eh_seq* other = c.d.create();
    c.d.set_sampling(other, ehp::greedy_sampling());
    for (uint32_t at = 0; at < 12; at += 5) {
        const uint32_t k = std::min(5u, 12 - at);
        es = {entry(other, q.data() + at, k, at + k == 12 ? EH_STEP_SAMPLE : 0u),
              entry(b, p.data() + at, k, at + k == 12 ? EH_STEP_HIDDEN : 0u)};
        c.d.step_ok(es, "chunks beside another sequence");
    }
    const std::vector<float> mixed = read(b, "the same prompt in chunks beside another sequence");
    if (mixed.size() != alone.size())
        fail(fmt::format("the hidden state has {} values alone and {} in a batch", alone.size(), mixed.size()));
    float scale = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < alone.size(); ++i) {
        scale = std::max(scale, std::abs(alone[i]));
        if (std::abs(alone[i] - mixed[i]) > worst) worst = std::abs(alone[i] - mixed[i]), at = i;
    }
    if (worst > 1e-3f * (1.0f + scale))
        fail(fmt::format("the hidden state differs alone and in a mixed batch: value {} is {} against {}", at,
                         mixed[at], alone[at]));
    // A later step that does not ask drops it.
    const int32_t next = p[0];
    es = {entry(a, &next, 1, 0)};
    c.d.step_ok(es, "a step not asking");
    const float* h = nullptr;
    uint32_t n = 0;
    if (c.d.api().seq_hidden(a, &h, &n) != EH_INVALID_ARGUMENT)
        fail("seq_hidden after a step that did not ask EH_STEP_HIDDEN did not return INVALID_ARGUMENT");
}

// ABI 1.6 LoRA adapters, forged for the model (llama.cpp's GGUF LoRA format,
// rank 4 on every layer's attention q/v and feed-forward down weights):
// an adapter whose lora_b is zero gives the base model's tokens; an
// adapter's sequence gives the same tokens alone and in one step beside the
// base model's and another adapter's; a fork keeps its source's adapter; a
// sequence holding tokens refuses another adapter. A plugin without the
// adapter calls is skipped.
struct ForgedAdapter {
    std::unique_ptr<model::ModelFile> file;
    eh_adapter* raw = nullptr;
};

std::vector<uint8_t> forge_adapter(const eh_model_view& base, uint32_t seed, bool zero_b) {
    static const char* const kTargets[] = {"attn_q.weight", "attn_v.weight", "ffn_down.weight"};
    model::GgufWriter w;
    w.set("general.architecture", model::GgufValue::string(std::string(base.architecture.data, base.architecture.size)));
    w.set("general.type", model::GgufValue::string("adapter"));
    w.set("adapter.type", model::GgufValue::string("lora"));
    w.set("adapter.lora.alpha", model::GgufValue::f32(8.0f));
    auto data = std::make_shared<std::deque<std::vector<float>>>();
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    auto next = [&x] {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        return float(int64_t(x >> 40) - (1 << 23)) / float(1 << 23);  // [-1, 1)
    };
    const uint64_t r = 4;
    for (uint64_t i = 0; i < base.n_tensors; ++i) {
        const eh_tensor& t = base.tensors[i];
        const std::string name(t.name.data, t.name.size);
        if (t.n_dims != 2 || name.rfind("blk.", 0) != 0) continue;
        bool target = false;
        for (const char* suffix : kTargets)
            target = target || (name.size() > std::strlen(suffix) && name.compare(name.size() - std::strlen(suffix), std::string::npos, suffix) == 0);
        if (!target) continue;
        const uint64_t n_in = t.dims[0], n_out = t.dims[1];
        auto& a = data->emplace_back(r * n_in);
        for (float& v : a) v = next() / std::sqrt(float(n_in));
        auto& b = data->emplace_back(n_out * r);
        for (float& v : b) v = zero_b ? 0.0f : 0.5f * next();
        w.add_tensor(name + ".lora_a", EH_TYPE_F32, {n_in, r}, a.data());
        w.add_tensor(name + ".lora_b", EH_TYPE_F32, {r, n_out}, b.data());
    }
    return w.to_bytes();  // reads `data` before it goes
}

void lora_adapters(Context& c) {
    const eh_plugin_api& api = c.d.api();
    if (!loader::api_has_adapters(api)) throw Skipped{"the plugin has no adapter calls (ABI 1.6 adapter_load)"};
    c.needs(12 + c.n, 12 * 3, 3);
    ForgedAdapter ads[3];
    struct Release {
        Driver& d;
        ForgedAdapter* ads;
        ~Release() {
            d.release_all();  // the sequences that use them go first
            for (int i = 0; i < 3; ++i)
                if (ads[i].raw) d.api().adapter_release(ads[i].raw);
        }
    } release{c.d, ads};
    for (int i = 0; i < 3; ++i) {
        const auto bytes = forge_adapter(c.options.model->view(), uint32_t(i), i == 0);
        ads[i].file = model::ModelFile::open_gguf_buffer(bytes.data(), bytes.size(), "forged-adapter.gguf");
        eh_adapter_params p{};
        p.struct_size = sizeof(p);
        p.view = &ads[i].file->view();
        p.scale = 1.0f;
        p.alpha = 8.0f;
        const eh_status st = api.adapter_load(c.d.model(), &p, &ads[i].raw);
        if (st == EH_UNSUPPORTED) throw Skipped{"the plugin does not adapt this model's weights: " + c.d.error()};
        if (st != EH_OK || !ads[i].raw)
            fail(fmt::format("adapter_load of a forged adapter returned {}: {}", eh_status_name(st), c.d.error()));
    }
    auto with = [&](eh_adapter* a) {
        eh_seq* s = c.d.create();
        const eh_status st = api.seq_set_adapter(s, a);
        if (st != EH_OK) fail(fmt::format("seq_set_adapter on an empty sequence returned {}: {}", eh_status_name(st), c.d.error()));
        return s;
    };
    const auto p = c.prompt(12, 41), q = c.prompt(9, 43);
    auto gen = [&](eh_adapter* a, const std::vector<int32_t>& prompt) {
        eh_seq* s = a ? with(a) : c.d.create();
        auto out = c.d.generate(s, prompt, c.n, ehp::greedy_sampling());
        c.d.release(s);
        return out;
    };
    const auto base = gen(nullptr, p);
    expect_same(base, gen(ads[0].raw, p), "an adapter whose lora_b is zero against the base model");
    const auto alone = gen(ads[1].raw, p);
    const auto other = gen(ads[2].raw, q);
    std::vector<eh_seq*> three{with(ads[1].raw), c.d.create(), with(ads[2].raw)};
    const auto together = c.d.generate_together(three, {p, p, q}, c.n, ehp::greedy_sampling());
    for (eh_seq* s : three) c.d.release(s);
    expect_same(alone, together[0], "an adapter's sequence beside the base model's and another adapter's");
    expect_same(base, together[1], "the base model's sequence beside two adapters' sequences");
    expect_same(other, together[2], "the other adapter's sequence in the same steps");
    // And it does adapt: with the same prompt, some logit moves.
    if (api.seq_logits) {
        auto logits = [&](eh_adapter* a) {
            eh_seq* s = a ? with(a) : c.d.create();
            c.d.set_sampling(s, ehp::greedy_sampling());
            std::vector<eh_step_entry> e1{entry(s, p.data(), 12, EH_STEP_SAMPLE | EH_STEP_LOGITS)};
            c.d.step_ok(e1, "a prompt asking its logits");
            const float* l = nullptr;
            uint32_t n = 0;
            if (api.seq_logits(s, &l, &n) != EH_OK || !l) fail("seq_logits after a step asking EH_STEP_LOGITS failed: " + c.d.error());
            std::vector<float> v(l, l + n);
            c.d.release(s);
            return v;
        };
        const auto lb = logits(nullptr), la = logits(ads[1].raw);
        float moved = 0;
        for (size_t i = 0; i < lb.size() && i < la.size(); ++i) moved = std::max(moved, std::abs(la[i] - lb[i]));
        if (moved < 1e-4f) fail("a forged rank-4 adapter on every layer changed no logit by 1e-4: it was not applied");
    }
    // A fork continues with its source's adapter.
    eh_seq* src = with(ads[1].raw);
    std::vector<eh_step_entry> es{entry(src, p.data(), 12, 0)};
    c.d.step_ok(es, "an adapter's prefill");
    if (api.seq_set_adapter(src, ads[2].raw) != EH_INVALID_ARGUMENT)
        fail("seq_set_adapter gave a sequence holding tokens another adapter (want EH_INVALID_ARGUMENT)");
    if (api.seq_set_adapter(src, nullptr) != EH_INVALID_ARGUMENT)
        fail("seq_set_adapter took the adapter off a sequence holding tokens (want EH_INVALID_ARGUMENT)");
    eh_seq* f = c.d.fork(src, 11);
    c.d.set_sampling(f, ehp::greedy_sampling());
    const int32_t last = p[11];
    es = {entry(f, &last, 1, EH_STEP_SAMPLE)};
    if (c.d.step_ok(es, "the fork's step")[0] != alone[0])
        fail("a fork of an adapter's sequence did not continue with its source's adapter");
}

// ABI 1.6: a step entry [t, d1..dk] with EH_STEP_VERIFY keeps t and the
// drafts greedy would have picked, says how many, and samples the next
// token; the rejected drafts leave no trace (the sequence continues as plain
// greedy decoding, and holds only its own blocks); its rules are enforced. A
// plugin that grants no draft tokens refuses the flag as unknown.
void speculative_verify(Context& c) {
    if (c.d.api().abi_minor < 6) throw Skipped{"the plugin predates ABI 1.6"};
    const uint32_t k_max = c.d.granted().max_draft_tokens;
    const auto p = c.prompt(8, 31);
    if (k_max == 0) {
        eh_seq* s = c.d.create();
        c.d.set_sampling(s, ehp::greedy_sampling());
        std::vector<eh_step_entry> es{entry(s, p.data(), 3, EH_STEP_SAMPLE | EH_STEP_VERIFY)};
        const eh_status st = c.d.step(es);
        if (st != EH_INVALID_ARGUMENT)
            fail(fmt::format("kv_init granted no draft tokens, yet a step asking EH_STEP_VERIFY returned {}, not "
                             "INVALID_ARGUMENT (an unknown flag)",
                             eh_status_name(st)));
        if (c.d.length(s) != 0) fail("a step refused for EH_STEP_VERIFY changed the sequence");
        return;
    }
    const uint32_t k = std::min(k_max, 4u), n = 3 * (k + 1);
    c.needs(8 + n + k + 1, 8, 2);
    const auto truth = c.d.generate(c.d.create(), p, n, ehp::greedy_sampling());
    eh_seq* s = c.d.create();
    const uint32_t free0 = c.d.kv_info().free_blocks;
    c.d.set_sampling(s, ehp::greedy_sampling());
    std::vector<eh_step_entry> es{entry(s, p.data(), 8, EH_STEP_SAMPLE)};
    std::vector<int32_t> got{c.d.step_ok(es, "prefill")[0]};
    auto verify = [&](std::vector<int32_t> t, uint32_t want_accepted, const char* what) {
        const uint32_t len = c.d.length(s);
        es = {entry(s, t.data(), uint32_t(t.size()), EH_STEP_SAMPLE | EH_STEP_VERIFY)};
        const int32_t tok = c.d.step_ok(es, what)[0];
        if (es[0].n_accepted != want_accepted)
            fail(fmt::format("{}: {} drafts accepted, not {}", what, es[0].n_accepted, want_accepted));
        if (c.d.length(s) != len + 1 + want_accepted)
            fail(fmt::format("{}: the sequence grew by {}, not {} (the rejected drafts must leave it)", what,
                             c.d.length(s) - len, 1 + want_accepted));
        got.insert(got.end(), t.begin() + 1, t.begin() + 1 + want_accepted);
        got.push_back(tok);
    };
    // Every draft right: all k accepted, and the token after them.
    std::vector<int32_t> t{got.back()};
    t.insert(t.end(), truth.begin() + 1, truth.begin() + 1 + k);
    verify(t, k, "a verify of right drafts");
    // The second draft wrong: the first stays, the right token replaces it.
    t.assign(1, got.back());
    for (uint32_t j = 0; j < k; ++j) t.push_back(truth[got.size() + j]);
    if (k >= 2) t[2] = (t[2] + 1) % int32_t(c.d.vocab());
    verify(t, k >= 2 ? 1 : k, "a verify whose second draft is wrong");
    while (got.size() < truth.size()) {  // plain decoding from there
        es = {entry(s, &got.back(), 1, EH_STEP_SAMPLE)};
        got.push_back(c.d.step_ok(es, "decode after verifies")[0]);
    }
    got.resize(truth.size());
    expect_same(truth, got, "greedy through verify steps against plain greedy decoding");
    const uint32_t held = free0 - c.d.kv_info().free_blocks, bt = c.d.granted().block_tokens;
    if (held != blocks_for(c.d.length(s), bt))
        fail(fmt::format("after verify steps the sequence of {} tokens holds {} blocks, not {}", c.d.length(s), held,
                         blocks_for(c.d.length(s), bt)));
    // The rules: each refused with EH_INVALID_ARGUMENT, nothing changed.
    const uint32_t len = c.d.length(s);
    std::vector<int32_t> many(k_max + 2, p[0]), two{p[0], p[1]}, one{p[0]};
    auto refused = [&](const std::vector<int32_t>& toks, uint32_t flags, const std::string& what) {
        es = {entry(s, toks.data(), uint32_t(toks.size()), flags)};
        const eh_status st = c.d.step(es);
        if (st != EH_INVALID_ARGUMENT)
            fail(fmt::format("a verify step with {} returned {}, not INVALID_ARGUMENT", what, eh_status_name(st)));
        if (c.d.length(s) != len) fail(fmt::format("a verify step refused for {} changed the sequence", what));
    };
    refused(one, EH_STEP_SAMPLE | EH_STEP_VERIFY, "no draft token");
    refused(many, EH_STEP_SAMPLE | EH_STEP_VERIFY, fmt::format("{} drafts (max_draft_tokens is {})", k_max + 1, k_max));
    refused(two, EH_STEP_VERIFY, "no EH_STEP_SAMPLE");
    refused(two, EH_STEP_SAMPLE | EH_STEP_LOGITS | EH_STEP_VERIFY, "EH_STEP_LOGITS");
    refused(two, EH_STEP_SAMPLE | EH_STEP_HIDDEN | EH_STEP_VERIFY, "EH_STEP_HIDDEN");
    refused(two, EH_STEP_SAMPLE | EH_STEP_CHAINED | EH_STEP_VERIFY, "EH_STEP_CHAINED");
    if (loader::api_has_step_halves(c.d.api())) {  // step() only
        es = {entry(s, two.data(), 2, EH_STEP_SAMPLE | EH_STEP_VERIFY)};
        const eh_status st = c.d.api().step_begin(c.d.model(), es.data(), 1);
        if (st == EH_OK) {
            int32_t out = -1;
            c.d.api().step_end(c.d.model(), &out, 1);
            fail("step_begin took an EH_STEP_VERIFY entry (verification is for step() alone)");
        }
        if (st != EH_INVALID_ARGUMENT)
            fail(fmt::format("step_begin with an EH_STEP_VERIFY entry returned {}, not INVALID_ARGUMENT", eh_status_name(st)));
        if (c.d.length(s) != len) fail("a step_begin refused for EH_STEP_VERIFY changed the sequence");
    }
}

// (1.7) The host-memory tier: a sequence parked, released and restored
// continues exactly as its never-parked fork does, its logits bit for bit.
class ParkedCopy {
public:
    ParkedCopy(const eh_plugin_api& api) : api_(api) {}
    ~ParkedCopy() {
        if (p_) api_.parked_release(p_);
    }
    ParkedCopy(const ParkedCopy&) = delete;
    ParkedCopy& operator=(const ParkedCopy&) = delete;
    eh_parked** out() { return &p_; }
    eh_parked* get() const { return p_; }

private:
    const eh_plugin_api& api_;
    eh_parked* p_ = nullptr;
};

// park_restore's case: a source sequence holding the first `at` tokens of
// p (inside a block), and the steps that check its parked copies.
class ParkCase {
public:
    explicit ParkCase(Context& c)
        : c_(c), api_(c.d.api()), bt_(c.d.granted().block_tokens),
          at_(bt_ > 13 ? 13 : bt_ + bt_ / 2 + (bt_ == 1)),  // inside a block, as fork_shares_prefix
          with_logits_(api_.seq_logits != nullptr) {
        c.needs(at_ + 8 + c.n, at_ + 8, 3);
        p_ = c.prompt(at_ + 8, 21);
        mine_.assign(p_.begin(), p_.begin() + at_);
    }

    // The continuation of `s` (holding p's first `at` tokens): the raw
    // logits of its first sampled position and its greedy tokens.
    std::vector<int32_t> continuation(eh_seq* s, std::vector<float>* logits) {
        c_.d.set_sampling(s, ehp::greedy_sampling());
        std::vector<eh_step_entry> es{
            entry(s, p_.data() + at_, 8, EH_STEP_SAMPLE | (with_logits_ ? uint32_t(EH_STEP_LOGITS) : 0u))};
        std::vector<int32_t> got{c_.d.step_ok(es, "the continuation's prefill")[0]};
        if (with_logits_) {
            const float* l = nullptr;
            uint32_t nv = 0;
            if (api_.seq_logits(s, &l, &nv) != EH_OK) fail("seq_logits failed: " + c_.d.error());
            logits->assign(l, l + nv);
        }
        while (got.size() < c_.n) {
            const int32_t t = got.back();
            es = {entry(s, &t, 1, EH_STEP_SAMPLE)};
            got.push_back(c_.d.step_ok(es, "the continuation's decode")[0]);
        }
        return got;
    }

    // The source, parked: the refused parks first (nothing made), then the
    // copy, which holds the bytes a refusal asked for.
    void park_source(ParkedCopy& parked) {
        src_ = c_.d.create();
        std::vector<eh_step_entry> es{entry(src_, p_.data(), at_, 0)};
        c_.d.step_ok(es, "the source's prefill");
        refused_park(0, UINT64_MAX, EH_INVALID_ARGUMENT, "0 tokens");
        refused_park(at_ + 1, UINT64_MAX, EH_INVALID_ARGUMENT, "more tokens than the sequence holds");
        const uint64_t need = refused_park(at_, 0, EH_NO_CAPACITY, "a copy larger than max_bytes 0");
        if (need == 0) fail("seq_park refused for max_bytes 0 did not say how many bytes it needs");
        uint64_t bytes = 0;
        if (api_.seq_park(src_, at_, UINT64_MAX, parked.out(), &bytes) != EH_OK || !parked.get())
            fail("seq_park failed: " + c_.d.error());
        if (bytes != need) fail(fmt::format("seq_park holds {} bytes but asked for {} when refused", bytes, need));
        if (c_.d.length(src_) != at_) fail("seq_park changed its sequence's length");
    }

    // Restores of the copy, alone (everything else released): other tokens
    // or another count refused with nothing changed; twice (the copy
    // unchanged by a restore) the never-parked fork's continuation, logits
    // bit for bit.
    void restore(const ParkedCopy& parked) {
        std::vector<float> want_logits, got_logits;
        const auto want = continuation(c_.d.fork(src_, at_), &want_logits);
        c_.d.release_all();  // the parked copy stands alone
        const uint32_t free_before = c_.d.kv_info().free_blocks;
        std::vector<int32_t> other = mine_;
        other[at_ / 2] = (other[at_ / 2] + 1) % int32_t(c_.d.vocab());
        refused_unpark(parked, other, fmt::format("token {} changed", at_ / 2), free_before);
        refused_unpark(parked, std::vector<int32_t>(mine_.begin(), mine_.end() - 1), "one token fewer", free_before);
        for (int round = 0; round < 2; ++round) {
            eh_seq* r = nullptr;
            if (c_.d.try_unpark(parked.get(), mine_, &r) != EH_OK || !r) fail("seq_unpark failed: " + c_.d.error());
            if (c_.d.length(r) != at_)
                fail(fmt::format("a restored sequence of {} tokens has length {}", at_, c_.d.length(r)));
            const uint32_t took = free_before - c_.d.kv_info().free_blocks;
            if (took != blocks_for(at_, bt_))
                fail(fmt::format("seq_unpark of {} tokens took {} free blocks, not {}", at_, took, blocks_for(at_, bt_)));
            const auto got = continuation(r, &got_logits);
            if (with_logits_) {
                if (got_logits.size() != want_logits.size()) fail("the restored sequence's logits have another length");
                for (size_t i = 0; i < want_logits.size(); ++i)
                    if (std::memcmp(&got_logits[i], &want_logits[i], sizeof(float)) != 0)
                        fail(fmt::format("restore {}: logit {} is {} after the restore, {} without the park (bit for "
                                         "bit expected)",
                                         round + 1, i, got_logits[i], want_logits[i]));
            }
            expect_same(want, got, fmt::format("restore {} continued against the never-parked fork", round + 1));
            c_.d.release(r);
        }
    }

    // Not enough free blocks: KV_FULL, nothing changes. On a second load of
    // the model with room for twice the copy's blocks (the first holds more
    // blocks than its sequences can fill), another sequence holds all but
    // fewer than the copy needs; this load's copy is refused by the first.
    void refuse_foreign_and_full() {
        const uint32_t needed = blocks_for(at_, bt_);
        const std::unique_ptr<Driver> loaded =
            second_load(c_, kv_params(2, 2ull * needed * c_.d.granted().block_bytes, c_.options.kv_type),
                        "the rest passed; ");
        Driver& small = *loaded;
        if (small.granted().max_seq_tokens < at_ || small.granted().max_step_tokens < at_)
            throw Skipped{"the rest passed; the second load granted sequences shorter than the copy"};
        eh_seq* s2 = small.create();
        std::vector<eh_step_entry> es{entry(s2, p_.data(), at_, 0)};
        small.step_ok(es, "the second load's prefill");
        ParkedCopy parked2(api_);
        uint64_t bytes = 0;
        if (api_.seq_park(s2, at_, UINT64_MAX, parked2.out(), &bytes) != EH_OK || !parked2.get())
            fail("seq_park on the second load failed: " + small.error());
        small.release(s2);
        eh_seq* r = nullptr;
        if (c_.d.try_unpark(parked2.get(), mine_, &r) != EH_INVALID_ARGUMENT || r)
            fail("seq_unpark took another model's parked copy (INVALID_ARGUMENT expected)");
        eh_seq* hog = small.create();
        const auto filler = c_.prompt(small.granted().max_seq_tokens, 22);
        while (small.kv_info().free_blocks >= needed) {
            const uint32_t room = std::min({(small.kv_info().free_blocks - needed + 1) * bt_,
                                            small.granted().max_seq_tokens - small.length(hog),
                                            small.granted().max_step_tokens});
            if (room == 0) throw Skipped{"the rest passed; the second load's blocks outlast one sequence"};
            es = {entry(hog, filler.data(), room, 0)};
            small.step_ok(es, "a sequence taking the free blocks");
        }
        const uint32_t free_full = small.kv_info().free_blocks;
        const eh_status st = small.try_unpark(parked2.get(), mine_, &r);
        if (st != EH_KV_FULL)
            fail(fmt::format("seq_unpark with {} free blocks for a copy of {} returned {}, not KV_FULL", free_full,
                             needed, eh_status_name(st)));
        if (r) fail("seq_unpark refused with KV_FULL still made a sequence");
        if (small.kv_info().free_blocks != free_full) fail("seq_unpark refused with KV_FULL changed the free block count");
        small.release(hog);
        if (small.try_unpark(parked2.get(), mine_, &r) != EH_OK)
            fail("seq_unpark once blocks were free failed: " + small.error());
        small.release_all();
    }

private:
    // A park that must be refused with `want`, making nothing; the bytes it
    // said it needs.
    uint64_t refused_park(uint32_t n, uint64_t max_bytes, eh_status want, const std::string& what) {
        ParkedCopy x(api_);
        uint64_t bytes = 0;
        const eh_status st = api_.seq_park(src_, n, max_bytes, x.out(), &bytes);
        if (st != want) fail(fmt::format("seq_park of {} returned {}, not {}", what, eh_status_name(st), eh_status_name(want)));
        if (x.get()) fail(fmt::format("seq_park of {} was refused and still made a parked copy", what));
        return bytes;
    }

    // A restore of other tokens, or of another count, is refused: nothing changes.
    void refused_unpark(const ParkedCopy& parked, const std::vector<int32_t>& toks, const std::string& what,
                        uint32_t free_before) {
        eh_seq* r = nullptr;
        const eh_status st = c_.d.try_unpark(parked.get(), toks, &r);
        const std::string message = c_.d.error();
        if (st != EH_INVALID_ARGUMENT)
            fail(fmt::format("seq_unpark with {} returned {}, not INVALID_ARGUMENT", what, eh_status_name(st)));
        if (r) fail(fmt::format("seq_unpark with {} was refused and still made a sequence", what));
        if (message.empty()) fail(fmt::format("seq_unpark with {} was refused without a message", what));
        if (c_.d.kv_info().free_blocks != free_before)
            fail(fmt::format("seq_unpark refused for {} changed the free block count", what));
    }

    Context& c_;
    const eh_plugin_api& api_;
    const uint32_t bt_, at_;
    const bool with_logits_;
    std::vector<int32_t> p_, mine_;
    eh_seq* src_ = nullptr;
};

void park_restore(Context& c) {
    if (!loader::api_has_park(c.d.api())) throw Skipped{"the plugin has no park calls (ABI 1.7 seq_park)"};
    ParkCase pc(c);
    ParkedCopy parked(c.d.api());
    pc.park_source(parked);
    pc.restore(parked);
    pc.refuse_foreign_and_full();
}

void reference_agreement(Context& c) {
    if (!c.options.reference) throw Skipped{"no --reference plugin given"};
    c.needs(12 + 2 * c.n, 12);
    Driver ref(c.options.reference, c.options.model, kv_params(2));
    if (ref.vocab() != c.d.vocab())
        fail(fmt::format("the reference's vocabulary is {} tokens, the plugin's {}", ref.vocab(), c.d.vocab()));
    // Teacher-forced: the plugin is fed the reference's tokens and its greedy
    // pick compared at every position, so one early difference does not
    // count for every later token.
    uint32_t same = 0, total = 0;
    for (uint32_t salt = 0; salt < 2; ++salt) {
        const auto p = c.prompt(12, 20 + salt);
        const auto want = ref.generate(ref.create(), p, 2 * c.n, ehp::greedy_sampling());
        eh_seq* s = c.d.create();
        c.d.set_sampling(s, ehp::greedy_sampling());
        std::vector<eh_step_entry> es{entry(s, p.data(), uint32_t(p.size()), EH_STEP_SAMPLE)};
        int32_t got = c.d.step_ok(es, "prefill")[0];
        for (size_t i = 0; i < want.size(); ++i) {
            same += got == want[i];
            ++total;
            if (i + 1 == want.size()) break;
            es = {entry(s, &want[i], 1, EH_STEP_SAMPLE)};
            got = c.d.step_ok(es, "teacher-forced decode")[0];
        }
    }
    if (same * 10 < total * 9)
        fail(fmt::format("greedy top-1 agrees with the reference at {} of {} positions (at least 90 % wanted)", same,
                         total));
}

struct Check {
    const char* name;
    const char* what;
    void (*run)(Context&);
    bool asked_only = false;  // runs only when --only names it
};

// In the order they run; names are stable (scripts select them with --only).
const Check kChecks[] = {
    {"kv_init_grant", "kv_init grants no more than asked, and every block starts free", kv_init_grant},
    {"sequence_lengths", "steps append, truncation keeps a prefix, a refused truncation changes nothing",
     sequence_lengths},
    {"no_capacity", "seq_create past max_seqs returns EH_NO_CAPACITY (EH_INVALID_ARGUMENT before 1.4)", no_capacity},
    {"invalid_steps", "a step with a bad token, sequence, mask or size, or a fork past the source, is refused "
                      "with EH_INVALID_ARGUMENT and changes nothing",
     invalid_steps},
    {"greedy_repeats", "the same prompt, greedy, gives the same tokens", greedy_repeats},
    {"chunked_prefill", "a prompt prefilled in chunks continues as in one step", chunked_prefill},
    {"batch_invariance", "a sequence's tokens do not depend on the others in its steps", batch_invariance},
    {"prefill_beside_decode", "decoding beside another sequence's prefill chunks changes nothing",
     prefill_beside_decode},
    {"batch_compositions", "a sequence's greedy tokens are its own alone in seven step makeups (others starting, "
                           "joining, leaving, prompts in chunks beside it); runs only when --only names it",
     batch_compositions, true},
    {"fork_shares_prefix", "seq_fork takes no free block and continues as the whole prompt would",
     fork_shares_prefix},
    {"truncate_regrow", "a truncated sequence stepped again continues as before", truncate_regrow},
    {"seeded_sampling", "the same seed and input give the same sampled tokens", seeded_sampling},
    {"top_k_one_is_greedy", "top_k 1 samples what greedy picks", top_k_one_is_greedy},
    {"allowed_mask", "a step entry's allowed-token mask is obeyed", allowed_mask},
    {"logit_bias", "greedy picks the largest logit, and a logit bias moves it (needs seq_logits)", logit_bias},
    {"kv_full_changes_nothing", "kv_init keeps to its budget, and a step refused with EH_KV_FULL changes nothing",
     kv_full_changes_nothing},
    {"step_halves", "step_begin + step_end give what step gives, chained steps included (needs the 1.3 halves)",
     step_halves},
    {"step_halves_rules", "chaining and ending with nothing in flight, and calls that change state while a step "
                          "flies, are refused (needs the 1.3 halves)",
     step_halves_rules},
    {"load_progress_cancel", "load progress only grows and ends at 1.0 once; a cancelled load returns "
                             "EH_CANCELLED and no model (loads the model twice more)",
     load_progress_cancel},
    {"kv_cache_type", "kv_init grants the KV cache type asked (--kv-type) and refuses an undefined one with "
                      "EH_UNSUPPORTED naming it (ABI 1.4)",
     kv_cache_type},
    {"hidden_state", "the final hidden state (EH_STEP_HIDDEN, 1.5) is the same alone and in a mixed, chunked "
                     "batch, and the next step drops it; without seq_hidden the flag is refused",
     hidden_state},
    {"speculative_verify", "a verify entry (EH_STEP_VERIFY, 1.6) keeps the drafts greedy would pick and no "
                           "other, and its rules hold; without max_draft_tokens the flag is refused",
     speculative_verify},
    {"lora_adapters", "a LoRA adapter (1.6) with lora_b zero changes nothing; adapters' and the base model's "
                      "sequences give the same tokens alone and in one step; a fork keeps its adapter; a "
                      "sequence holding tokens keeps its own (skipped without the adapter calls)",
     lora_adapters},
    {"embd_spans", "rows given for a span of a step's tokens (seq_embd_spans, 1.6) change its logits the same "
                   "way every time, a span past its entry is refused with nothing changed, a bidirectional span "
                   "is taken or refused by name (EH_UNSUPPORTED) with nothing changed, and spans last one "
                   "step (skipped without the image calls)",
     embd_spans},
    {"park_restore", "a sequence parked in host memory (seq_park, 1.7), released and restored continues as "
                     "its never-parked fork, logits bit for bit; a restore of other tokens or past the free blocks "
                     "is refused and changes nothing",
     park_restore},
    {"reference_agreement", "greedy tokens agree with the reference plugin, teacher-forced (needs --reference)",
     reference_agreement},
};

}  // namespace

std::vector<std::pair<std::string, std::string>> check_names() {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Check& c : kChecks) out.emplace_back(c.name, c.what);
    return out;
}

std::vector<CheckResult> run_checks(const CheckOptions& options) {
    if (!loader::api_has_step(*options.plugin))
        throw Error(Code::InvalidRequest,
                    "the plugin has no batched step (ABI 1.2's kv_init .. step): eh-plugin-check drives that path");
    if (options.reference && !loader::api_has_step(*options.reference))
        throw Error(Code::InvalidRequest, "the reference plugin has no batched step (ABI 1.2's kv_init .. step)");
    for (const std::string& name : options.only)
        if (std::none_of(std::begin(kChecks), std::end(kChecks), [&](const Check& c) { return name == c.name; }))
            throw Error(Code::InvalidRequest, fmt::format("no check is named '{}'", name));
    std::unique_ptr<Driver> d;
    try {
        d = std::make_unique<Driver>(options.plugin, options.model, kv_params(kMaxSeqs, 0, options.kv_type),
                                     options.engine_options, options.devices);
    } catch (const Failure& f) {
        throw Error(Code::ModelLoadFailed, f.what());
    }
    std::vector<CheckResult> out;
    for (const Check& check : kChecks) {
        if (options.only.empty() ? check.asked_only
                                 : std::find(options.only.begin(), options.only.end(), check.name) == options.only.end())
            continue;
        CheckResult r{check.name, check.what, CheckResult::Status::Pass, {}};
        Context c{options, *d, std::max<uint32_t>(2, options.n_tokens)};
        try {
            check.run(c);
        } catch (const Skipped& s) {
            r.status = CheckResult::Status::Skip;
            r.detail = s.why;
        } catch (const std::exception& e) {
            r.status = CheckResult::Status::Fail;
            r.detail = e.what();
        }
        d->release_all();
        // Every check's sequences are gone: each block must be free again.
        if (r.status != CheckResult::Status::Fail) {
            try {
                const eh_kv_info now = d->kv_info();
                if (now.free_blocks != now.total_blocks) {
                    r.status = CheckResult::Status::Fail;
                    r.detail = fmt::format("after its sequences were released, {} of {} blocks are free",
                                           now.free_blocks, now.total_blocks);
                }
            } catch (const std::exception& e) {
                r.status = CheckResult::Status::Fail;
                r.detail = e.what();
            }
        }
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace eh::plugin_check
