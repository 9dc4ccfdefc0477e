// The continuous-batching scheduler against a fake engine whose KV blocks
// and steps are counted exactly: batching, admission under a block budget,
// preemption and recompute, cancel mid-batch, FIFO order, prefix reuse.
// The fake's next token is a hash of the sequence's whole content, so any
// mistake in what a sequence holds (a bad fork, a lost chunk, a wrong
// recompute) changes the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "eh/constrain/grammar.hpp"
#include "eh/service/constraint_cache.hpp"
#include "eh/service/scheduler.hpp"

using namespace eh;
using namespace eh::service;

namespace {

class FakeEngine : public SeqEngine {
public:
    FakeEngine(uint32_t block_tokens, uint32_t total_blocks, uint32_t max_seqs, uint32_t step_tokens) {
        l_.block_tokens = block_tokens;
        l_.total_blocks = total_blocks;
        l_.max_seqs = max_seqs;
        l_.max_step_tokens = step_tokens;
        l_.max_step_entries = max_seqs;
        l_.max_seq_tokens = 4096;
        l_.can_fork = true;
        l_.batched = true;
        refs_.assign(total_blocks, 0);
    }
    const SeqLimits& limits() const override { return l_; }
    uint32_t free_blocks() const override {
        std::lock_guard lock(mu_);
        return uint32_t(std::count(refs_.begin(), refs_.end(), 0));
    }
    SeqId create() override {
        std::lock_guard lock(mu_);
        if (seqs_.size() >= l_.max_seqs) throw Error(Code::Internal, "too many sequences");
        seqs_[++next_] = {};
        return next_;
    }
    SeqId fork(SeqId src, uint32_t n) override {
        std::lock_guard lock(mu_);
        Seq s;
        const Seq& from = seqs_.at(src);
        s.tokens.assign(from.tokens.begin(), from.tokens.begin() + n);
        for (size_t i = 0; i < blocks_for(n); ++i) {
            s.blocks.push_back(from.blocks[i]);
            ++refs_[from.blocks[i]];
        }
        seqs_[++next_] = s;
        ++forks;
        return next_;
    }
    void truncate(SeqId id, uint32_t n) override {
        std::lock_guard lock(mu_);
        if (!flight_.empty()) ++calls_in_flight;
        Seq& s = seqs_.at(id);
        if (n > s.tokens.size()) throw Error(Code::Internal, "truncate past the end");
        s.tokens.resize(n);
        while (s.blocks.size() > blocks_for(n)) {
            --refs_[s.blocks.back()];
            s.blocks.pop_back();
        }
        ++truncates;
    }
    void release(SeqId id) override {
        std::lock_guard lock(mu_);
        if (!flight_.empty()) ++calls_in_flight;
        auto it = seqs_.find(id);
        if (it == seqs_.end()) {
            ++unknown_releases;
            return;
        }
        for (uint32_t b : it->second.blocks) --refs_[b];
        seqs_.erase(it);
    }
    void set_sampling(SeqId id, const eh_sampling_params&) override {
        std::lock_guard lock(mu_);
        seqs_.at(id).sampler = true;
    }
    // ABI 1.3's halves when `halves`: begin_step computes the step at once
    // (a chained item appends its sequence's last sample) and end_step hands
    // its tokens out; any other call while a step is in flight is counted.
    bool can_chain() const override { return halves; }
    bool begin_step(std::span<StepItem> items) override {
        {
            std::lock_guard lock(mu_);
            if (flight_.size() >= 2) throw Error(Code::Internal, "fake engine: a third step in flight");
            if (++begins == fail_begin_at) throw Error(Code::Internal, "fake engine: step_begin failed");
            for (auto& it : items)
                if (it.chained) {
                    const Seq& s = seqs_.at(it.seq);
                    if (s.sampled_in != last_begun_ || flight_.empty())
                        throw Error(Code::Internal, "fake engine: chained without a sample in flight");
                    it.tokens = std::span<const int32_t>(&s.last_sample, 1);
                }
            in_begin_ = true;
        }
        const bool ok = step(items);
        std::lock_guard lock(mu_);
        in_begin_ = false;
        if (!ok) return false;
        ++last_begun_;
        std::vector<int32_t> out;
        for (auto& it : items) {
            out.push_back(it.token);
            if (it.sample) {
                seqs_.at(it.seq).sampled_in = last_begun_;
                seqs_.at(it.seq).last_sample = it.token;
            }
            if (it.chained) ++chained;
        }
        if (hold_after >= 0 && held_from_ == SIZE_MAX && std::find(out.begin(), out.end(), hold_after) != out.end())
            held_from_ = last_begun_;
        flight_.push_back({last_begun_, std::move(out)});
        return true;
    }
    void end_step(std::span<StepItem> items) override {
        if (end_delay.count()) std::this_thread::sleep_for(end_delay);  // the step "runs" until here
        std::unique_lock lock(mu_);
        // a step begun after the one that sampled hold_after runs until release()
        if (!flight_.empty() && flight_.front().index > held_from_) released_cv_.wait(lock, [&] { return released_; });
        if (flight_.empty() || flight_.front().tokens.size() != items.size())
            throw Error(Code::Internal, "fake engine: bad end_step");
        for (size_t i = 0; i < items.size(); ++i) items[i].token = flight_.front().tokens[i];
        flight_.erase(flight_.begin());
    }
    void release() {
        {
            std::lock_guard lock(mu_);
            released_ = true;
        }
        released_cv_.notify_all();
    }
    size_t in_flight() const {
        std::lock_guard lock(mu_);
        return flight_.size();
    }
    // Every step that ran, item by item: the sequence's first token (which
    // request it is, when prompts begin differently), where the item starts
    // in the sequence and how many tokens it appends.
    struct Piece {
        int32_t first;
        size_t at, n;
    };
    std::vector<std::vector<Piece>> runs() const {
        std::lock_guard lock(mu_);
        return runs_;
    }
    std::vector<size_t> live_lengths() const {
        std::lock_guard lock(mu_);
        std::vector<size_t> out;
        for (const auto& [id, s] : seqs_) out.push_back(s.tokens.size());
        return out;
    }

    bool step(std::span<StepItem> items) override {
        std::lock_guard lock(mu_);
        if (!flight_.empty() && !in_begin_) ++calls_in_flight;
        if (steps.load() >= crash_at_step) {
            // As an engine process that died: every sequence and block gone.
            crash_at_step = SIZE_MAX;
            seqs_.clear();
            refs_.assign(refs_.size(), 0);
            throw Error(Code::EngineCrashed, "fake engine crashed");
        }
        if (items.size() > l_.max_step_entries) throw Error(Code::Internal, "too many entries");
        uint32_t total = 0, need = 0;
        for (auto& it : items) {
            Seq& s = seqs_.at(it.seq);
            total += uint32_t(it.tokens.size());
            const size_t want = blocks_for(s.tokens.size() + it.tokens.size());
            need += uint32_t(want > s.blocks.size() ? want - s.blocks.size() : 0);
            if (s.tokens.size() % l_.block_tokens && refs_[s.blocks.back()] > 1) ++need;  // copy on write
            if (it.sample && !s.sampler) throw Error(Code::Internal, "sampling without a sampler");
        }
        if (total > l_.max_step_tokens) throw Error(Code::Internal, "step over the token budget");
        size_t deciders = 0;  // decode and verify items of a step that verifies
        bool verifies_now = false;
        for (auto& it : items) {
            verifies_now = verifies_now || it.verify;
            deciders += it.sample && (it.verify || it.tokens.size() == 1);
        }
        if (verifies_now) {
            max_deciders_verifying = std::max(max_deciders_verifying.load(), deciders);
            if (last_full_) ++verify_after_full;
        }
        if (need > uint32_t(std::count(refs_.begin(), refs_.end(), 0))) {
            last_full_ = verifies_now;  // the scheduler must retry this step without its drafts
            ++kv_full;
            if (on_kv_full) on_kv_full();
            return false;
        }
        last_full_ = false;
        max_entries = std::max<size_t>(max_entries, items.size());
        ++steps;
        std::vector<Piece>& run = runs_.emplace_back();
        for (auto& it : items) {
            Seq& s = seqs_.at(it.seq);
            run.push_back({s.tokens.empty() ? it.tokens[0] : s.tokens[0], s.tokens.size(), it.tokens.size()});
            if (s.tokens.size() % l_.block_tokens && refs_[s.blocks.back()] > 1) {
                --refs_[s.blocks.back()];
                s.blocks.back() = take();
            }
            if (it.verify) {
                // Greedy verification: a draft stays while it is the token
                // the fake would have sampled there.
                if (!l_.max_draft_tokens || it.tokens.size() - 1 > l_.max_draft_tokens || !it.sample)
                    throw Error(Code::Internal, "fake engine: a verify item it cannot take");
                s.tokens.push_back(it.tokens[0]);
                it.n_accepted = 0;
                while (it.n_accepted + 1 < it.tokens.size() && it.tokens[it.n_accepted + 1] == next_token(s.tokens))
                    s.tokens.push_back(it.tokens[++it.n_accepted]);
                ++verifies;
            } else {
                s.tokens.insert(s.tokens.end(), it.tokens.begin(), it.tokens.end());
            }
            while (s.blocks.size() < blocks_for(s.tokens.size())) s.blocks.push_back(take());
            computed_tokens += it.tokens.size();
            if (s.tokens.size() == it.tokens.size()) started.emplace_back(it.tokens.begin(), it.tokens.end());
            it.token = it.sample ? next_token(s.tokens) : -1;
            // A draft model that is wrong now and then.
            if (it.sample && perturb_every && s.tokens.size() % perturb_every == 0) it.token = 'a' + (it.token - 'a' + 1) % 26;
            // A pooled job's "hidden state": its length and its hash.
            if (it.hidden) hidden_[it.seq] = {float(s.tokens.size()), float(next_token(s.tokens))};
            // Under a mask: the first allowed id at or above the hashed one.
            if (it.sample && it.allowed && !ignore_mask) {
                ++masked;
                const auto& m = *it.allowed;
                const auto n = int32_t(m.size() * 32);
                for (int32_t k = 0; k < n; ++k) {
                    const int32_t id = (it.token + k) % n;
                    if ((m[size_t(id) / 32] >> (id % 32)) & 1u) {
                        it.token = id;
                        break;
                    }
                }
            }
        }
        if (step_delay.count()) std::this_thread::sleep_for(step_delay);
        return true;
    }
    // ABI 1.7's host tier when `parks`: a parked copy is its tokens (100
    // host bytes each); restoring takes fresh blocks for them.
    bool can_park() const override { return parks; }
    Parked park(SeqId seq, uint32_t n, uint64_t max_bytes) override {
        std::lock_guard lock(mu_);
        if (!flight_.empty()) ++calls_in_flight;
        const Seq& s = seqs_.at(seq);
        if (n > s.tokens.size()) throw Error(Code::Internal, "fake engine: park past the end");
        if (uint64_t(n) * 100 > max_bytes) return {0, uint64_t(n) * 100};
        parked_[++next_parked_].assign(s.tokens.begin(), s.tokens.begin() + n);
        ++parks_made;
        return {next_parked_, uint64_t(n) * 100};
    }
    SeqId unpark(uint64_t id, std::span<const int32_t> tokens) override {
        std::lock_guard lock(mu_);
        if (!flight_.empty()) ++calls_in_flight;
        const std::vector<int32_t>& p = parked_.at(id);
        if (!std::equal(p.begin(), p.end(), tokens.begin(), tokens.end()))
            throw Error(Code::Internal, "fake engine: unpark of other tokens");
        if (blocks_for(p.size()) > size_t(std::count(refs_.begin(), refs_.end(), 0))) return 0;
        if (seqs_.size() >= l_.max_seqs) throw Error(Code::Internal, "too many sequences");
        Seq s;
        s.tokens = p;
        while (s.blocks.size() < blocks_for(s.tokens.size())) s.blocks.push_back(take());
        seqs_[++next_] = std::move(s);
        ++unparks;
        return next_;
    }
    void drop_parked(uint64_t id) override {
        std::lock_guard lock(mu_);
        parked_.erase(id);
    }
    bool parks = false;
    std::atomic<size_t> parks_made{0}, unparks{0};

    std::span<const float> logits(SeqId) override { return {}; }
    bool has_logits() const override { return false; }
    std::span<const float> hidden(SeqId id) override {
        std::lock_guard lock(mu_);
        auto it = hidden_.find(id);
        return it == hidden_.end() ? std::span<const float>() : std::span<const float>(it->second);
    }
    bool has_hidden() const override { return true; }
    void restart(const std::function<bool()>&) override {
        if (restart_fails) throw Error(Code::EngineCrashed, "fake engine: not restarted again");
        ++restarts;
    }

    // 'a'..'z' from a hash of everything in the sequence.
    static int32_t next_token(const std::vector<int32_t>& t) {
        uint64_t h = 1469598103934665603ull;
        for (int32_t x : t) h = (h ^ uint64_t(x)) * 1099511628211ull;
        return int32_t('a' + h % 26);
    }

    std::atomic<size_t> max_entries{0}, steps{0}, kv_full{0}, forks{0}, computed_tokens{0}, masked{0};
    std::atomic<size_t> restarts{0}, unknown_releases{0}, truncates{0}, chained{0}, calls_in_flight{0}, verifies{0};
    size_t perturb_every = 0;  // a sample at a length divisible by it is the next letter instead
    // Verify steps: the most decoding (or verifying) items one held, and
    // how many came right after a verify step that found the pool full.
    std::atomic<size_t> max_deciders_verifying{0}, verify_after_full{0};
    bool last_full_ = false;
    void verifies_up_to(uint32_t n) { l_.max_draft_tokens = n; }  // before the scheduler reads the limits
    bool halves = false;
    std::chrono::milliseconds end_delay{0};
    int32_t hold_after = -1;  // see end_step; set before the first step
    size_t begins = 0, fail_begin_at = SIZE_MAX;  // the begin_step call that throws
    std::atomic<size_t> crash_at_step{SIZE_MAX};  // steps.load() at which step() throws EngineCrashed
    bool restart_fails = false;
    bool ignore_mask = false;
    std::chrono::milliseconds step_delay{0};
    std::function<void()> on_kv_full;  // called (engine lock held) when a step finds the pool full
    std::vector<std::string> started;  // each sequence's first chunk, in step order

private:
    struct Seq {
        std::vector<int32_t> tokens;
        std::vector<uint32_t> blocks;
        bool sampler = false;
        uint64_t sampled_in = 0;   // the last step begun that sampled for it
        int32_t last_sample = -1;
    };
    struct Flying {
        size_t index;  // the step's number (last_begun_ when it was begun)
        std::vector<int32_t> tokens;
    };
    std::vector<Flying> flight_;  // the steps begun, not ended
    std::vector<std::vector<Piece>> runs_;
    std::map<SeqId, std::vector<float>> hidden_;
    size_t held_from_ = SIZE_MAX;
    bool released_ = false;
    std::condition_variable released_cv_;
    uint64_t last_begun_ = 0;
    bool in_begin_ = false;
    size_t blocks_for(size_t n) const { return (n + l_.block_tokens - 1) / l_.block_tokens; }
    uint32_t take() {
        for (uint32_t b = 0; b < refs_.size(); ++b)
            if (refs_[b] == 0) {
                refs_[b] = 1;
                return b;
            }
        throw Error(Code::Internal, "fake engine: no block (the scheduler ignored KV_FULL)");
    }
    SeqLimits l_;
    mutable std::mutex mu_;
    std::vector<uint32_t> refs_;
    std::map<SeqId, Seq> seqs_;
    SeqId next_ = 0;
    std::map<uint64_t, std::vector<int32_t>> parked_;
    uint64_t next_parked_ = 0;
};

struct Outcome {
    std::string text;
    JobEvent end;
    size_t terminals = 0;
};

Outcome drain(Job& job) {
    Outcome r;
    for (int i = 0; i < 2000; ++i) {
        auto ev = job.pop(std::chrono::milliseconds(10));
        if (!ev) continue;
        if (ev->kind == JobEvent::Kind::Token) r.text += ev->text;
        if (ev->kind == JobEvent::Kind::End || ev->kind == JobEvent::Kind::Error) {
            r.end = *ev;
            ++r.terminals;
            // a second terminal would show up right behind the first
            if (job.pop(std::chrono::milliseconds(20))) ++r.terminals;
            break;
        }
    }
    return r;
}

std::shared_ptr<Job> make_job(const std::string& id, const std::string& prompt, uint32_t max_tokens) {
    auto j = std::make_shared<Job>();
    j->request.job_id = id;
    j->request.prompt = prompt;
    j->prompt_tokens.assign(prompt.begin(), prompt.end());
    j->max_tokens = max_tokens;
    j->seed = 1;
    return j;
}

// What the fake produces for this prompt when nothing else is running.
std::string expected(const std::string& prompt, uint32_t n) {
    std::vector<int32_t> t(prompt.begin(), prompt.end());
    std::string out;
    for (uint32_t i = 0; i < n; ++i) {
        const int32_t tok = FakeEngine::next_token(t);
        out += char(tok);
        t.push_back(tok);
    }
    return out;
}

struct Harness {
    FakeEngine* engine;
    std::unique_ptr<Scheduler> sched;
    Harness(uint32_t block_tokens, uint32_t blocks, uint32_t max_seqs, uint32_t step_tokens, SchedulerOptions o = {},
            int32_t eog = -1, bool halves = false, bool parks = false) {
        auto e = std::make_unique<FakeEngine>(block_tokens, blocks, max_seqs, step_tokens);
        e->halves = halves;
        e->parks = parks;
        engine = e.get();
        sched = std::make_unique<Scheduler>(std::move(e), std::make_shared<ByteCodec>(256, eog), std::make_shared<Metrics>(), o);
    }
};

}  // namespace

TEST(Scheduler, ConcurrentRequestsShareStepsAndMatchTheirSoloOutput) {
    Harness h(16, 256, 16, 64);
    h.engine->step_delay = std::chrono::milliseconds(2);
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::string> prompts;
    for (int i = 0; i < 6; ++i) {
        prompts.push_back("prompt number " + std::to_string(i) + std::string(size_t(10 * i), 'x'));
        jobs.push_back(make_job("j" + std::to_string(i), prompts.back(), 20));
    }
    h.sched->enqueue(jobs[0]);  // one alone first, the rest join it mid-flight
    h.sched->enqueue_all({jobs.begin() + 1, jobs.end()});
    for (size_t i = 0; i < jobs.size(); ++i) {
        Outcome r = drain(*jobs[i]);
        EXPECT_EQ(r.terminals, 1u);
        EXPECT_EQ(r.end.kind, JobEvent::Kind::End);
        EXPECT_EQ(r.text, expected(prompts[i], 20)) << "job " << i;
    }
    EXPECT_GE(h.engine->max_entries.load(), 4u) << "requests were not batched";
}

// Pooled jobs (embeddings, rerank): the last prompt chunk asks the hidden
// state instead of a sample (the fake refuses to sample a sequence without
// a sampler, which a pooled job never gets), a long prompt is chunked first,
// a request's inputs count as one against the queue, and a generating job in
// the same steps is unchanged.
TEST(Scheduler, PooledJobsAnswerTheirLastTokensStateBesideGeneration) {
    SchedulerOptions o;
    o.queue_capacity = 3;
    Harness h(16, 256, 16, 16, o);
    h.engine->step_delay = std::chrono::milliseconds(1);
    std::vector<std::shared_ptr<Job>> pooled, second;
    std::vector<std::string> prompts;
    for (int i = 0; i < 6; ++i) {
        prompts.push_back("input " + std::to_string(i) + std::string(size_t(9 * i), 'y'));
        pooled.push_back(make_job("p." + std::to_string(i), prompts.back(), 0));
        pooled.back()->pooled = true;
        second.push_back(make_job("q." + std::to_string(i), prompts.back(), 0));
        second.back()->pooled = true;
    }
    auto gen = make_job("gen", "a prompt that generates", 12);
    // Six jobs are more than the queue holds, but six inputs of one request
    // are one request: three requests fit, however many inputs wait.
    EXPECT_THROW(h.sched->enqueue_all(pooled), QueueFullError);
    for (size_t i = 1; i < pooled.size(); ++i) pooled[i]->same_request = second[i]->same_request = true;
    h.sched->enqueue(gen);
    h.sched->enqueue_all(pooled);
    h.sched->enqueue_all(second);
    for (auto& j : second) EXPECT_EQ(drain(*j).end.kind, JobEvent::Kind::End);
    for (size_t i = 0; i < pooled.size(); ++i) {
        Outcome r = drain(*pooled[i]);
        ASSERT_EQ(r.end.kind, JobEvent::Kind::End) << r.end.message;
        EXPECT_EQ(r.terminals, 1u);
        EXPECT_EQ(r.text, "");
        EXPECT_EQ(r.end.stop_reason, "pooled");
        EXPECT_EQ(r.end.tokens_out, 0u);
        const std::vector<int32_t> t(prompts[i].begin(), prompts[i].end());
        EXPECT_EQ(r.end.hidden, (std::vector<float>{float(t.size()), float(FakeEngine::next_token(t))})) << "input " << i;
    }
    Outcome g = drain(*gen);
    EXPECT_EQ(g.text, expected("a prompt that generates", 12));
    EXPECT_GE(h.engine->max_entries.load(), 2u) << "pooled and generating jobs did not share steps";
}

TEST(Scheduler, PrefillIsChunkedUnderTheStepBudget) {
    Harness h(16, 256, 8, 16);
    const std::string p(100, 'p');
    auto j = make_job("long", p, 5);
    h.sched->enqueue(j);
    Outcome r = drain(*j);
    EXPECT_EQ(r.text, expected(p, 5));
    EXPECT_GE(h.engine->steps.load(), 7u + 4u) << "100 prompt tokens take 7 steps of 16, then 4 decodes";
}

// The chunked-prefill policy: while requests decode, a step holds every
// decode first and then at most prefill_chunk_tokens of prefill, so a decode
// step never waits behind more; the oldest prompt still advances by a whole
// chunk every step (no starvation), and with nothing decoding prefill takes
// the whole step budget.
TEST(Scheduler, PrefillIsCappedPerStepWhileRequestsDecode) {
    SchedulerOptions o;
    o.prefill_chunk_tokens = 8;
    Harness h(16, 256, 8, 64, o);
    h.engine->step_delay = std::chrono::milliseconds(2);
    // Three requests decode for a while (prompts "A...", "B...", "C...").
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::string> prompts;
    for (char c : {'A', 'B', 'C'}) {
        prompts.push_back(std::string(10, c));
        jobs.push_back(make_job(std::string(1, c), prompts.back(), 60));
    }
    h.sched->enqueue_all(jobs);
    auto decoding = [&](int32_t first) {
        for (const auto& run : h.engine->runs())
            for (const auto& p : run)
                if (p.first == first && p.at >= 10) return true;
        return false;
    };
    for (int i = 0; i < 500 && !decoding('C'); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(decoding('C'));
    // Then a long prompt arrives, then a second one behind it.
    prompts.push_back(std::string(100, 'L'));
    jobs.push_back(make_job("long", prompts.back(), 3));
    prompts.push_back(std::string(30, 'M'));
    jobs.push_back(make_job("more", prompts.back(), 3));
    h.sched->enqueue_all({jobs[3], jobs[4]});
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(drain(*jobs[i]).text, expected(prompts[i], i < 3 ? 60 : 3));

    bool long_started = false, long_done = false, saw_decodes_with_prefill = false;
    size_t long_at = 0;
    for (const auto& run : h.engine->runs()) {
        size_t decodes = 0, prefill = 0, total = 0, long_chunk = 0;
        const size_t long_left = 100 - long_at;
        bool prefill_seen = false, has_long = false;
        for (const auto& p : run) {
            total += p.n;
            const size_t prompt = p.first == 'L' ? 100 : p.first == 'M' ? 30 : 10;
            const bool is_prefill = p.at < prompt;
            if (is_prefill) {
                prefill += p.n;
                prefill_seen = true;
            } else {
                EXPECT_EQ(p.n, 1u);
                EXPECT_FALSE(prefill_seen) << "a decode came after a prefill chunk";
                ++decodes;
            }
            if (p.first == 'L' && is_prefill) {
                has_long = true;
                EXPECT_EQ(p.at, long_at) << "the long prompt's chunks follow each other";
                long_at += p.n;
                long_chunk = p.n;
                long_started = true;
            }
        }
        EXPECT_LE(total, 64u);
        if (decodes > 0) {
            EXPECT_LE(prefill, 8u) << "prefill past its per-step budget while requests decode";
            saw_decodes_with_prefill = saw_decodes_with_prefill || prefill > 0;
        }
        // Once begun, the long prompt advances in every step until it is in.
        if (long_started && !long_done) {
            EXPECT_TRUE(has_long) << "a step left the long prompt out";
            if (decodes > 0 && has_long) {
                EXPECT_EQ(long_chunk, std::min<size_t>(8, long_left)) << "the oldest prompt gets the whole chunk";
            }
        }
        long_done = long_at >= 100;
    }
    EXPECT_TRUE(long_done);
    EXPECT_TRUE(saw_decodes_with_prefill);

    // Nothing decoding: a lone prompt fills whole steps.
    const std::string alone(100, 'Z');
    auto z = make_job("alone", alone, 2);
    const size_t before = h.engine->runs().size();
    h.sched->enqueue(z);
    EXPECT_EQ(drain(*z).text, expected(alone, 2));
    const auto runs = h.engine->runs();
    ASSERT_GT(runs.size(), before);
    ASSERT_EQ(runs[before].size(), 1u);
    EXPECT_EQ(runs[before][0].n, 64u) << "with nothing decoding, prefill may use the whole step";
}

TEST(Scheduler, OutOfBlocksPreemptsAndRecomputesWithoutChangingOutput) {
    // 4-token blocks, 12 in all; each request grows to 8 + 24 = 32 tokens =
    // 8 blocks, so two cannot both finish without a preemption.
    SchedulerOptions o;
    o.prefix_cache = false;
    Harness h(4, 12, 8, 64, o);
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::string> prompts = {"aaaaaaaa", "bbbbbbbb", "cccccccc"};
    for (size_t i = 0; i < prompts.size(); ++i) jobs.push_back(make_job("p" + std::to_string(i), prompts[i], 24));
    h.sched->enqueue_all(jobs);  // together, so they contend for blocks whatever the thread timing
    for (size_t i = 0; i < jobs.size(); ++i) {
        Outcome r = drain(*jobs[i]);
        EXPECT_EQ(r.end.kind, JobEvent::Kind::End) << r.end.message;
        EXPECT_EQ(r.text, expected(prompts[i], 24)) << "job " << i;
        EXPECT_EQ(r.terminals, 1u);
    }
    EXPECT_GE(h.sched->stats().preemptions.load() + h.engine->kv_full.load(), 1u);
    EXPECT_EQ(h.engine->free_blocks(), 12u) << "every block came back";
}

// Many requests arriving together whose prompts, all admitted, need more
// blocks than the pool has. Blocks are taken only when a step runs, so an
// admission that looked at free_blocks() alone admitted all of them, the
// step found the pool full, the newest was preempted and at once admitted
// again: millions of preemptions and no token (issue 52, item 1).
TEST(Scheduler, RequestsThatTogetherOverfillThePoolAllFinish) {
    SchedulerOptions o;
    o.prefix_cache = false;
    Harness h(4, 40, 16, 512, o);  // 160 tokens of KV; each request grows to 60 + 16 = 76
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::string> prompts;
    for (int i = 0; i < 12; ++i) {
        prompts.push_back(std::string(58, char('a' + i)) + std::to_string(10 + i));
        jobs.push_back(make_job("o" + std::to_string(i), prompts.back(), 16));
    }
    h.sched->enqueue_all(jobs);
    for (size_t i = 0; i < jobs.size(); ++i) {
        Outcome r = drain(*jobs[i]);
        ASSERT_EQ(r.terminals, 1u) << "job " << i << " never ended (preemptions: "
                                   << h.sched->stats().preemptions.load() << ")";
        EXPECT_EQ(r.end.kind, JobEvent::Kind::End) << r.end.message;
        EXPECT_EQ(r.text, expected(prompts[i], 16)) << "job " << i;
    }
    // Each request is preempted at most a few times, never in a loop.
    EXPECT_LE(h.sched->stats().preemptions.load(), 24u);
    EXPECT_EQ(h.engine->free_blocks(), 40u) << "every block came back";
}

// The decodes of the admitted requests outgrow the pool: the newest gives
// its blocks back, and the oldest is never the one preempted while a
// younger request runs, so it is computed once, from its first chunk to
// its last token.
TEST(Scheduler, TheOldestRequestIsNeverPreemptedForAYoungerOne) {
    SchedulerOptions o;
    o.prefix_cache = false;
    Harness h(4, 24, 16, 512, o);  // 96 tokens; each request grows to 12 + 60 = 72
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::string> prompts;
    for (int i = 0; i < 4; ++i) {
        prompts.push_back("request " + std::to_string(i) + "...");
        jobs.push_back(make_job("y" + std::to_string(i), prompts.back(), 60));
    }
    h.sched->enqueue_all(jobs);
    for (size_t i = 0; i < jobs.size(); ++i) {
        Outcome r = drain(*jobs[i]);
        ASSERT_EQ(r.terminals, 1u) << "job " << i;
        EXPECT_EQ(r.end.kind, JobEvent::Kind::End) << r.end.message;
        EXPECT_EQ(r.text, expected(prompts[i], 60)) << "job " << i;
    }
    EXPECT_GE(h.sched->stats().preemptions.load(), 1u) << "the pool never filled: the test tests nothing";
    EXPECT_EQ(std::count(h.engine->started.begin(), h.engine->started.end(), prompts[0]), 1)
        << "the oldest request was preempted and recomputed";
    EXPECT_EQ(h.engine->free_blocks(), 24u);
}

// The step that found the pool full preempts the newest request; if every
// other running request is cancelled before the retry, the preempted one
// must still be admitted (there is no step left to run first).
TEST(Scheduler, APreemptedRequestRunsWhenTheOthersAreCancelledBeforeTheRetry) {
    SchedulerOptions o;
    o.prefix_cache = false;
    Harness h(4, 12, 8, 64, o);  // 48 tokens; each request grows to 8 + 24 = 32
    auto a = make_job("old", "aaaaaaaa", 24), b = make_job("new", "bbbbbbbb", 24);
    bool cancelled = false;
    h.engine->on_kv_full = [&] {
        if (!cancelled) a->cancel(CancelReason::Client);  // the client of the oldest leaves right then
        cancelled = true;
    };
    h.sched->enqueue_all({a, b});
    Outcome ra = drain(*a), rb = drain(*b);
    ASSERT_TRUE(cancelled) << "the pool never filled: the test tests nothing";
    EXPECT_EQ(ra.end.code, Code::Cancelled);
    ASSERT_EQ(rb.terminals, 1u) << "the preempted request was never admitted again";
    EXPECT_EQ(rb.end.kind, JobEvent::Kind::End) << rb.end.message;
    EXPECT_EQ(rb.text, expected("bbbbbbbb", 24));
    EXPECT_EQ(h.engine->free_blocks(), 12u);
}

// A client that leaves while its request waits to be computed again after
// a preemption, or while it runs, frees what it holds at once and the
// others finish.
TEST(Scheduler, RequestsCancelledWhilePreemptedOrRunningFreeTheirBlocks) {
    SchedulerOptions o;
    o.prefix_cache = false;
    Harness h(4, 24, 16, 512, o);
    h.engine->step_delay = std::chrono::milliseconds(1);
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 0; i < 6; ++i) jobs.push_back(make_job("c" + std::to_string(i), "leaving " + std::to_string(i), 70));
    h.sched->enqueue_all(jobs);
    for (int i = 1; i < 6; ++i) h.sched->cancel(jobs[size_t(i)]->request.job_id, CancelReason::Disconnect);
    for (int i = 1; i < 6; ++i) {
        Outcome r = drain(*jobs[size_t(i)]);
        ASSERT_EQ(r.terminals, 1u);
        if (r.end.kind == JobEvent::Kind::Error) EXPECT_EQ(r.end.code, Code::Cancelled);
    }
    Outcome first = drain(*jobs[0]);
    EXPECT_EQ(first.end.kind, JobEvent::Kind::End);
    EXPECT_EQ(first.text, expected("leaving 0", 70));
    EXPECT_EQ(h.sched->stats().running.load() + h.sched->stats().waiting.load(), 0u);
    EXPECT_EQ(h.engine->free_blocks(), 24u);
}

TEST(Scheduler, CancelMidBatchEndsOnlyThatRequest) {
    Harness h(16, 256, 8, 64);
    h.engine->step_delay = std::chrono::milliseconds(5);
    auto a = make_job("a", "first prompt", 200), b = make_job("b", "second prompt", 30);
    h.sched->enqueue(a);
    h.sched->enqueue(b);
    while (h.sched->stats().running.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(h.sched->cancel("a", CancelReason::Client), "cancelling");
    Outcome ra = drain(*a), rb = drain(*b);
    EXPECT_EQ(ra.end.kind, JobEvent::Kind::Error);
    EXPECT_EQ(ra.end.code, Code::Cancelled);
    EXPECT_EQ(ra.terminals, 1u);
    EXPECT_EQ(rb.end.kind, JobEvent::Kind::End);
    EXPECT_EQ(rb.text, expected("second prompt", 30));
    EXPECT_EQ(h.sched->cancel("a", CancelReason::Client), "finished");
}

TEST(Scheduler, OneAtATimeRunsInArrivalOrder) {
    SchedulerOptions o;
    o.max_running = 1;
    Harness h(16, 256, 8, 64, o);
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 0; i < 4; ++i) {
        jobs.push_back(make_job("f" + std::to_string(i), "prompt " + std::to_string(i), 8));
        h.sched->enqueue(jobs.back());
    }
    for (auto& j : jobs) EXPECT_EQ(drain(*j).end.kind, JobEvent::Kind::End);
    EXPECT_EQ(h.engine->started, (std::vector<std::string>{"prompt 0", "prompt 1", "prompt 2", "prompt 3"}));
    EXPECT_EQ(h.engine->max_entries.load(), 1u);
}

TEST(Scheduler, QueueLimitAndShutdown) {
    SchedulerOptions o;
    o.max_running = 1;
    o.queue_capacity = 1;
    o.shutdown_grace = std::chrono::milliseconds(20);
    Harness h(16, 256, 8, 64, o);
    h.engine->step_delay = std::chrono::milliseconds(5);
    auto r = make_job("r", "running", 1000);
    h.sched->enqueue(r);
    while (h.sched->stats().running.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto q = make_job("q", "queued", 5);
    h.sched->enqueue(q);
    EXPECT_THROW(h.sched->enqueue(make_job("x", "x", 5)), QueueFullError);
    h.sched->shutdown();
    EXPECT_EQ(drain(*q).end.code, Code::ShuttingDown);
    Outcome rr = drain(*r);
    EXPECT_EQ(rr.end.code, Code::ShuttingDown);
    EXPECT_EQ(rr.terminals, 1u);
    EXPECT_EQ(h.engine->free_blocks(), 256u);
}

TEST(Scheduler, APromptSharingACachedPrefixReusesItAndGivesTheSameOutput) {
    Harness h(16, 256, 16, 64);
    const std::string system(40, 's');
    auto first = make_job("t1", system + " first question", 10);
    h.sched->enqueue(first);
    Outcome r1 = drain(*first);
    EXPECT_EQ(r1.text, expected(system + " first question", 10));
    EXPECT_EQ(h.sched->stats().prefix_hits.load(), 0u);

    // The next turn of the chat: the whole first exchange plus more.
    const std::string turn2 = system + " first question" + r1.text + " and then?";
    const size_t before = h.engine->computed_tokens.load();
    auto second = make_job("t2", turn2, 10);
    h.sched->enqueue(second);
    Outcome r2 = drain(*second);
    EXPECT_EQ(r2.text, expected(turn2, 10));
    EXPECT_EQ(h.sched->stats().prefix_hits.load(), 1u);
    EXPECT_GE(h.sched->stats().prefix_hit_tokens.load(), 16u + 32u);
    EXPECT_GE(h.engine->forks.load(), 1u);
    // Only the new tokens (and the decodes) were computed.
    EXPECT_LE(h.engine->computed_tokens.load() - before, turn2.size() - 48 + 10);
}

// The host tier (--kv-host-bytes): a chat's first turn, evicted from a
// 24-block pool by two other prompts, is parked and copied back for the next
// turn, which computes only its new tokens and says the same; without the
// tier the next turn computes everything again.
TEST(Scheduler, AnEvictedPrefixParkedInHostMemoryIsRestoredForTheNextTurn) {
    for (const bool tier : {true, false}) {
        SchedulerOptions o;
        o.kv_host_bytes = tier ? 1 << 20 : 0;
        Harness h(16, 24, 16, 256, o, -1, false, /*parks*/ true);
        const std::string first(100, 'f');  // 7 blocks with its output
        auto j1 = make_job("t1", first, 10);
        h.sched->enqueue(j1);
        Outcome r1 = drain(*j1);
        for (const char c : {'o', 'p'}) {  // 10 blocks each: the second evicts the first turn
            auto j = make_job(std::string(1, c), std::string(150, c), 10);
            h.sched->enqueue(j);
            EXPECT_EQ(drain(*j).text, expected(std::string(150, c), 10));
        }
        EXPECT_EQ(h.engine->parks_made.load() > 0, tier);
        const std::string turn2 = first + r1.text + " and then?";
        const size_t before = h.engine->computed_tokens.load();
        auto j2 = make_job("t2", turn2, 10);
        h.sched->enqueue(j2);
        EXPECT_EQ(drain(*j2).text, expected(turn2, 10)) << "tier " << tier;
        const size_t computed = h.engine->computed_tokens.load() - before;
        if (tier) {
            EXPECT_EQ(h.engine->unparks.load(), 1u);
            EXPECT_EQ(h.sched->stats().host_tier.restores.load(), 1u);
            EXPECT_GE(h.sched->stats().host_tier.parks.load(), 1u);
            EXPECT_LE(computed, turn2.size() - 100 + 10);  // only the new tokens (and the decodes)
        } else {
            EXPECT_EQ(h.engine->unparks.load(), 0u);
            EXPECT_GE(computed, turn2.size());
        }
    }
}

TEST(Scheduler, PrefixCacheOffComputesEverything) {
    SchedulerOptions o;
    o.prefix_cache = false;
    Harness h(16, 256, 16, 64, o);
    const std::string p(40, 's');
    for (int i = 0; i < 2; ++i) {
        auto j = make_job("n" + std::to_string(i), p + std::to_string(i), 4);
        h.sched->enqueue(j);
        EXPECT_EQ(drain(*j).text, expected(p + std::to_string(i), 4));
    }
    EXPECT_EQ(h.sched->stats().prefix_hits.load(), 0u);
    EXPECT_EQ(h.engine->forks.load(), 0u);
}

TEST(Scheduler, EndOfGenerationEndsARequestUnlessIgnoreEos) {
    const std::string p = "a prompt";
    const std::string full = expected(p, 60);
    const char eog = full[10];  // the end token: the 11th output (or an earlier copy of it)
    Harness h(16, 256, 8, 64, {}, eog);
    auto stops = make_job("eos", p, 60);
    h.sched->enqueue(stops);
    Outcome a = drain(*stops);
    EXPECT_EQ(a.end.stop_reason, "eos");
    EXPECT_EQ(a.text, full.substr(0, full.find(eog)));
    auto goes_on = make_job("ignore", p, 60);
    goes_on->request.ignore_eos = true;
    h.sched->enqueue(goes_on);
    Outcome b = drain(*goes_on);
    EXPECT_EQ(b.end.stop_reason, "length");
    EXPECT_EQ(b.end.tokens_out, 60u);
    // An end token generated anyway adds no text of its own.
    std::string without_eog = full;
    std::erase(without_eog, eog);
    EXPECT_EQ(b.text, without_eog);
}

TEST(Scheduler, SiblingsOfAnNRequestForkTheFirstOnesPrompt) {
    SchedulerOptions o;
    o.prefix_cache = false;  // the sharing must come from the sibling fork alone
    Harness h(16, 256, 16, 64, o);
    const std::string p(100, 'q');
    auto lead = make_job("n", p, 8);
    std::vector<std::shared_ptr<Job>> jobs = {lead};
    for (int i = 1; i < 4; ++i) {
        auto j = make_job("n." + std::to_string(i), p, 8);
        j->fork_of = lead;
        jobs.push_back(j);
    }
    h.sched->enqueue_all(jobs);
    for (auto& j : jobs) EXPECT_EQ(drain(*j).text, expected(p, 8));
    EXPECT_EQ(h.engine->forks.load(), 3u);
    // The 100-token prompt once, each sibling its last prompt token, and the decodes.
    EXPECT_EQ(h.engine->computed_tokens.load(), 100u + 3u + 4u * 7u);
}

// Constrained output through the scheduler: every sampled token comes under
// the request's mask, the matcher follows it (also across a preemption and
// recompute), and the request ends with "grammar" once the output is
// complete, before max_tokens. The fake engine picks the first allowed id at
// or above its hashed letter, so the output is deterministic.
TEST(Scheduler, ConstrainedRequestsFollowTheirMaskAndEndWhenComplete) {
    SchedulerOptions o;
    o.prefix_cache = false;
    auto codec = std::make_shared<ByteCodec>(257, 256);
    ConstraintCache constraints(codec, 257);
    OutputConstraint c;
    c.kind = OutputConstraint::Kind::Grammar;
    c.field = "grammar";
    c.text = "root ::= \"{\" [a-z]{3,20} \"}\"\n";
    auto run = [&](uint32_t blocks, size_t n_jobs) {
        auto e = std::make_unique<FakeEngine>(4, blocks, 8, 64);
        FakeEngine* engine = e.get();
        Scheduler sched(std::move(e), codec, std::make_shared<Metrics>(), o);
        std::vector<std::shared_ptr<Job>> jobs;
        for (size_t i = 0; i < n_jobs; ++i) {
            jobs.push_back(make_job("c" + std::to_string(i), std::string(8, char('a' + i)), 60));
            jobs.back()->constraint = constraints.get(c);
        }
        sched.enqueue_all(jobs);
        std::vector<std::string> out;
        for (auto& j : jobs) {
            Outcome r = drain(*j);
            EXPECT_EQ(r.end.kind, JobEvent::Kind::End) << r.end.message;
            EXPECT_EQ(r.end.stop_reason, "grammar");
            EXPECT_LT(r.end.tokens_out, 60u);
            out.push_back(r.text);
        }
        EXPECT_GT(engine->masked.load(), 0u);
        // /metrics' split of a step's time: the engine's calls and the masks.
        EXPECT_GT(sched.stats().engine_steps.load(), 0u);
        EXPECT_GT(sched.stats().engine_step_ns.load(), 0u);
        EXPECT_GT(sched.stats().constraint_ns.load(), 0u);
        return std::make_pair(out, sched.stats().preemptions.load() + engine->kv_full.load());
    };
    auto [alone, p0] = run(256, 1);
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(alone[0].front(), '{');
    EXPECT_EQ(alone[0].back(), '}');
    EXPECT_GE(alone[0].size(), 5u);
    EXPECT_EQ(alone[0].find_first_not_of("abcdefghijklmnopqrstuvwxyz", 1), alone[0].size() - 1) << alone[0];
    // 4-token blocks, 12 in all: three requests growing to ~30 tokens contend.
    auto [crowded, preempted] = run(12, 3);
    EXPECT_EQ(crowded[0], alone[0]) << "batched and preempted, the same output";
    for (const auto& t : crowded) EXPECT_TRUE(t.front() == '{' && t.back() == '}') << t;
    EXPECT_GE(preempted, 1u);
}

// An engine that samples outside the mask fails that request (and only it)
// with a clear error instead of letting invalid output through.
TEST(Scheduler, ATokenOutsideTheMaskFailsOnlyItsRequest) {
    Harness h(16, 256, 8, 64);
    h.engine->ignore_mask = true;
    auto codec = std::make_shared<ByteCodec>(256);
    ConstraintCache constraints(codec, 256);
    OutputConstraint c;
    c.kind = OutputConstraint::Kind::Grammar;
    c.field = "grammar";
    c.text = "root ::= \"0\"+\n";  // the fake's letters are never allowed
    auto bad = make_job("bad", "hello", 10);
    bad->constraint = constraints.get(c);
    auto good = make_job("good", "world", 10);
    h.sched->enqueue_all({bad, good});
    Outcome rb = drain(*bad), rg = drain(*good);
    EXPECT_EQ(rb.end.kind, JobEvent::Kind::Error);
    EXPECT_NE(rb.end.message.find("outside the allowed-token mask"), std::string::npos) << rb.end.message;
    EXPECT_EQ(rg.end.kind, JobEvent::Kind::End);
    EXPECT_EQ(rg.text, expected("world", 10));
}

// A grammar whose token mask needs more than the per-token work budget
// (kMaxMaskWork; a tiny one here) ends its request with INVALID_REQUEST
// naming the limit, and only that request.
TEST(Scheduler, AMaskOverItsWorkBudgetFailsOnlyItsRequest) {
    Harness h(16, 256, 8, 64);
    auto codec = std::make_shared<ByteCodec>(256);
    ConstraintCache constraints(codec, 256);
    auto bad = make_job("bad", "hello", 10);
    bad->constraint =
        std::make_shared<constrain::Automaton>(constrain::gbnf_grammar("root ::= [a-z]{1000}\n"), constraints.vocab(), 50);
    auto good = make_job("good", "world", 10);
    h.sched->enqueue_all({bad, good});
    Outcome rb = drain(*bad), rg = drain(*good);
    EXPECT_EQ(rb.end.kind, JobEvent::Kind::Error);
    EXPECT_EQ(rb.end.code, Code::InvalidRequest);
    EXPECT_NE(rb.end.message.find("more than 50 steps"), std::string::npos) << rb.end.message;
    EXPECT_EQ(rg.end.kind, JobEvent::Kind::End);
    EXPECT_EQ(rg.text, expected("world", 10));
}

// The engine process died: the running requests end with its error, the
// cached prefixes are forgotten (never released, never forked again), the
// engine is restarted, and the request that was waiting runs on it.
TEST(Scheduler, AnEngineThatLosesItsSequencesEndsTheRunningJobsAndKeepsTheQueue) {
    SchedulerOptions o;
    o.max_running = 2;
    Harness h(16, 256, 4, 64, o);
    const std::string shared(40, 's');
    auto warm = make_job("warm", shared, 4);
    h.sched->enqueue(warm);
    ASSERT_EQ(drain(*warm).end.kind, JobEvent::Kind::End);
    EXPECT_EQ(h.sched->stats().prefix_entries.load(), 1u);

    h.engine->step_delay = std::chrono::milliseconds(3);
    h.engine->crash_at_step = h.engine->steps.load() + 6;
    auto a = make_job("a", "first running prompt", 40);
    auto b = make_job("b", "second running prompt", 40);
    auto c = make_job("c", shared + " and more", 5);  // would fork the lost cached prefix
    h.sched->enqueue_all({a, b, c});
    for (auto* j : {&a, &b}) {
        Outcome r = drain(**j);
        EXPECT_EQ(r.terminals, 1u);
        EXPECT_EQ(r.end.kind, JobEvent::Kind::Error);
        EXPECT_EQ(r.end.code, Code::EngineCrashed) << r.end.message;
        EXPECT_TRUE(r.end.retriable);
        EXPECT_EQ(r.end.retry_after_ms.value_or(0), 5000u);
    }
    const size_t forks = h.engine->forks.load();
    Outcome rc = drain(*c);
    EXPECT_EQ(rc.end.kind, JobEvent::Kind::End) << rc.end.message;
    EXPECT_EQ(rc.text, expected(shared + " and more", 5));
    EXPECT_EQ(h.engine->forks.load(), forks) << "forked a sequence that died with the engine";
    EXPECT_EQ(h.engine->restarts.load(), 1u);
    EXPECT_EQ(h.engine->unknown_releases.load(), 0u) << "released sequences that died with the engine";
    EXPECT_EQ(h.sched->stats().engine_restarts.load(), 1u);
    EXPECT_EQ(EngineState(h.sched->stats().engine_state.load()), EngineState::Ready);
    EXPECT_EQ(h.sched->stats().prefix_entries.load(), 1u);  // c's own
}

TEST(Scheduler, AnEngineThatIsNotRestartedFailsTheQueueAndRefusesNewJobs) {
    SchedulerOptions o;
    o.max_running = 1;
    Harness h(16, 256, 4, 64, o);
    h.engine->step_delay = std::chrono::milliseconds(3);
    h.engine->restart_fails = true;
    h.engine->crash_at_step = 3;
    auto a = make_job("a", "running prompt", 40);
    auto b = make_job("b", "waiting prompt", 4);
    h.sched->enqueue_all({a, b});
    Outcome ra = drain(*a), rb = drain(*b);
    EXPECT_EQ(ra.end.code, Code::EngineCrashed);
    EXPECT_TRUE(ra.end.retriable);
    EXPECT_EQ(rb.terminals, 1u);
    EXPECT_EQ(rb.end.code, Code::EngineCrashed);
    EXPECT_FALSE(rb.end.retriable);
    EXPECT_NE(rb.end.message.find("not restarted again"), std::string::npos) << rb.end.message;
    EXPECT_EQ(EngineState(h.sched->stats().engine_state.load()), EngineState::Failed);
    try {
        h.sched->enqueue(make_job("c", "late", 2));
        ADD_FAILURE() << "a job was queued for an engine that is down";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::EngineCrashed);
    }
}

// An engine that runs steps in halves (ABI 1.3) gets step N+1 begun before
// N is read, with the decode tokens chained on its side. Outputs must be
// what plain steps give, and nothing but begin/end may reach it while a step
// is in flight.
TEST(SchedulerChained, ConcurrentRequestsMatchTheirSoloOutput) {
    Harness h(16, 256, 16, 64, {}, -1, true);
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::string> prompts;
    for (int i = 0; i < 6; ++i) {
        prompts.push_back("prompt number " + std::to_string(i) + std::string(size_t(10 * i), 'x'));
        jobs.push_back(make_job("j" + std::to_string(i), prompts.back(), 20 + 3 * uint32_t(i)));
    }
    h.sched->enqueue(jobs[0]);
    h.sched->enqueue_all({jobs.begin() + 1, jobs.end()});
    for (size_t i = 0; i < jobs.size(); ++i) {
        Outcome r = drain(*jobs[i]);
        EXPECT_EQ(r.terminals, 1u);
        EXPECT_EQ(r.end.kind, JobEvent::Kind::End);
        EXPECT_EQ(r.text, expected(prompts[i], 20 + 3 * uint32_t(i))) << "job " << i;
    }
    EXPECT_GT(h.engine->chained.load(), 20u) << "no step was chained";
    EXPECT_EQ(h.sched->stats().chained_steps.load() > 0, true);
    EXPECT_EQ(h.engine->calls_in_flight.load(), 0u);
}

TEST(SchedulerChained, ARequestEndingInTheStepAheadHasItsExtraTokenCutBack) {
    const std::string p = "a prompt";
    const std::string full = expected(p, 60);
    const char eog = full[10];
    const size_t n_out = full.find(eog);  // tokens before the end token
    Harness h(4, 256, 8, 64, {}, eog, true);
    auto stops = make_job("eos", p, 60);
    h.sched->enqueue(stops);
    Outcome a = drain(*stops);
    EXPECT_EQ(a.end.stop_reason, "eos");
    EXPECT_EQ(a.text, full.substr(0, n_out));
    EXPECT_EQ(a.terminals, 1u);
    // The step after the end token was begun before it was read: its token
    // is gone again, so the cached sequence holds the prompt and the output.
    while (h.sched->stats().running.load() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(h.engine->truncates.load(), 1u);
    EXPECT_EQ(h.engine->live_lengths(), std::vector<size_t>{p.size() + n_out});
    EXPECT_EQ(h.engine->calls_in_flight.load(), 0u);
    // A continuation of that text reuses it and computes what a fresh run does.
    const std::string next = p + full.substr(0, n_out) + "zz";
    auto cont = make_job("cont", next, 8);
    cont->request.ignore_eos = true;
    h.sched->enqueue(cont);
    Outcome b = drain(*cont);
    std::string want = expected(next, 8);
    std::erase(want, eog);  // an end token generated anyway adds no text
    EXPECT_EQ(b.text, want);
    EXPECT_GE(h.sched->stats().prefix_hits.load(), 1u);
}

TEST(SchedulerChained, MaxTokensAndCancelEndTheChainCleanly) {
    Harness h(16, 256, 8, 64, {}, -1, true);
    h.engine->step_delay = std::chrono::milliseconds(2);
    auto a = make_job("a", "first prompt", 400), b = make_job("b", "second prompt", 30);
    h.sched->enqueue(a);
    h.sched->enqueue(b);
    for (int i = 0; i < 5000 && h.sched->stats().running.load() < 2; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(h.sched->cancel("a", CancelReason::Client), "cancelling");
    Outcome ra = drain(*a), rb = drain(*b);
    EXPECT_EQ(ra.end.code, Code::Cancelled) << "message: " << ra.end.message;
    EXPECT_EQ(rb.end.kind, JobEvent::Kind::End) << rb.end.message;
    EXPECT_EQ(ra.terminals, 1u);
    EXPECT_EQ(rb.end.stop_reason, "length");
    EXPECT_EQ(rb.text, expected("second prompt", 30));
    EXPECT_EQ(h.engine->truncates.load(), 0u) << "max_tokens is known ahead: no step runs past it";
    EXPECT_EQ(h.engine->calls_in_flight.load(), 0u);
}

TEST(SchedulerChained, TheOptionOffReadsEveryStepFirst) {
    SchedulerOptions o;
    o.chained_steps = false;  // serve --no-chained-steps
    Harness h(16, 256, 8, 64, o, -1, true);
    auto j = make_job("j", "some prompt", 25);
    h.sched->enqueue(j);
    Outcome r = drain(*j);
    EXPECT_EQ(r.text, expected("some prompt", 25));
    EXPECT_EQ(h.engine->chained.load(), 0u);
    EXPECT_EQ(h.sched->stats().chained_steps.load(), 0u);
}

TEST(SchedulerChained, ARequestThatEndsIsAnsweredWhileTheStepAheadStillRuns) {
    const std::string p = "a prompt";
    const std::string full = expected(p, 60);
    const char eog = full[10];
    Harness h(16, 256, 8, 64, {}, eog, true);
    // The step begun after the one that samples the end token "runs" until
    // the test releases it: the answer must come while it is in flight.
    h.engine->hold_after = eog;
    auto j = make_job("eos", p, 60);
    h.sched->enqueue(j);
    JobEvent end;
    size_t flying = 99;
    for (int i = 0; i < 500 && end.kind != JobEvent::Kind::End; ++i) {
        auto ev = j->pop(std::chrono::milliseconds(10));
        if (ev && ev->kind == JobEvent::Kind::End) {
            flying = h.engine->in_flight();
            end = *ev;
        }
    }
    h.engine->release();
    EXPECT_EQ(end.stop_reason, "eos") << "no answer while the step ahead was held";
    EXPECT_EQ(flying, 1u) << "the answer waited for the step it does not need";
    while (h.sched->stats().running.load() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(h.engine->live_lengths(), std::vector<size_t>{p.size() + full.find(eog)});
    EXPECT_FALSE(j->pop(std::chrono::milliseconds(30))) << "a second terminal event";
}

TEST(SchedulerChained, AFailedBeginEndsTheStepInFlightAndOnlyThatBatchsRequests) {
    Harness h(16, 256, 8, 64, {}, -1, true);
    h.engine->fail_begin_at = 5;  // a chained step, with the step before it in flight
    auto a = make_job("a", "first prompt", 40);
    h.sched->enqueue(a);
    Outcome ra = drain(*a);
    EXPECT_EQ(ra.end.kind, JobEvent::Kind::Error);
    EXPECT_NE(ra.end.message.find("step_begin failed"), std::string::npos) << ra.end.message;
    EXPECT_EQ(ra.terminals, 1u);
    EXPECT_EQ(h.engine->in_flight(), 0u) << "the step in flight was not ended";
    // The engine serves the next request.
    auto b = make_job("b", "second prompt", 20);
    h.sched->enqueue(b);
    Outcome rb = drain(*b);
    EXPECT_EQ(rb.end.kind, JobEvent::Kind::End) << rb.end.message;
    EXPECT_EQ(rb.text, expected("second prompt", 20));
}

// A job id belongs to its submitter: the same id from another submitter is
// another job (it runs, and neither a collision's 400 nor a cancel answer
// tells anyone of the other's), while a submitter's own repeat is refused.
TEST(Scheduler, JobIdsAreEachSubmittersOwn) {
    Harness h(16, 256, 8, 64);
    h.engine->step_delay = std::chrono::milliseconds(2);
    auto a = make_job("same", "from a", 40), b = make_job("same", "from b", 40);
    a->request.owner = "key A";
    b->request.owner = "key B";
    h.sched->enqueue(a);
    EXPECT_NO_THROW(h.sched->enqueue(b)) << "another submitter's id collided";
    auto again = make_job("same", "from a again", 5);
    again->request.owner = "key A";
    EXPECT_THROW(h.sched->enqueue(again), RequestError);
    const std::string stranger = "key C";
    EXPECT_EQ(h.sched->cancel("same", CancelReason::Client, &stranger), "unknown");
    const std::string owner_b = "key B";
    const std::string answer = h.sched->cancel("same", CancelReason::Client, &owner_b);
    EXPECT_TRUE(answer == "cancelling" || answer == "cancelled") << answer;  // running, or not yet admitted
    Outcome ra = drain(*a), rb = drain(*b);
    EXPECT_EQ(ra.end.kind, JobEvent::Kind::End);
    EXPECT_EQ(ra.text, expected("from a", 40));
    EXPECT_EQ(rb.end.code, Code::Cancelled);
    EXPECT_EQ(h.sched->cancel("same", CancelReason::Client, &stranger), "unknown");
    EXPECT_EQ(h.sched->cancel("same", CancelReason::Client, &owner_b), "finished");
}

// Requests arriving together behind one system prompt: the first computes
// it, the others wait for it to be in and fork it (the cache holds only
// ended requests, so it could not share it), in their own scope only; the
// answers are what each alone would say.
TEST(Scheduler, RequestsArrivingTogetherShareARunningOnesPrompt) {
    for (const bool same_scope : {true, false}) {
        Harness h(16, 256, 16, 64);
        const std::string system(96, 's');
        std::vector<std::shared_ptr<Job>> jobs;
        std::vector<std::string> prompts;
        for (int i = 0; i < 4; ++i) {
            prompts.push_back(system + " question " + std::to_string(i));
            jobs.push_back(make_job("c" + std::to_string(i), prompts.back(), 6));
            if (!same_scope) jobs.back()->request.cache_scope = "tenant " + std::to_string(i);
        }
        h.sched->enqueue_all(jobs);
        for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(drain(*jobs[i]).text, expected(prompts[i], 6)) << i;
        size_t prompt_total = 0;
        for (const auto& p : prompts) prompt_total += p.size();
        if (same_scope) {
            EXPECT_EQ(h.sched->stats().prefix_hits.load(), 3u);
            EXPECT_GE(h.sched->stats().prefix_hit_tokens.load(), 3u * 96u);
            EXPECT_EQ(h.engine->forks.load(), 3u);
            // the system prompt once, each request's own tail and its decodes
            EXPECT_LE(h.engine->computed_tokens.load(), prompt_total - 3 * 96 + 4 * 6);
        } else {
            EXPECT_EQ(h.sched->stats().prefix_hits.load(), 0u) << "a running request was shared across scopes";
            EXPECT_EQ(h.engine->forks.load(), 0u);
        }
    }
}

// The request it waits for is cancelled before its prompt is in: the
// waiting one (held back while the other's 160-token prompt goes in 32
// tokens a step) is admitted anyway and computes everything itself.
TEST(Scheduler, ARequestWaitingOnACancelledOnesPromptStillRuns) {
    Harness h(16, 256, 16, 32);
    h.engine->step_delay = std::chrono::milliseconds(5);
    const std::string system(160, 's');
    auto first = make_job("w0", system + " one", 6);
    auto second = make_job("w1", system + " two", 6);
    h.sched->enqueue(first);
    for (int i = 0; i < 400 && h.sched->stats().running.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    h.sched->enqueue(second);
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    EXPECT_EQ(h.sched->stats().waiting.load(), 1u) << "the second request did not wait for the first one's prompt";
    h.sched->cancel("w0", CancelReason::Client);
    drain(*first);
    EXPECT_EQ(drain(*second).text, expected(system + " two", 6));
}

// A shared prompt longer than 8 steps' tokens (kMaxPrefixWaitSteps): the
// request behind it does not hold the queue for all of it; it takes what is
// in when it is admitted (here nothing: both arrive together) and computes
// the rest.
TEST(Scheduler, AWaitForARunningPromptIsBoundedInSteps) {
    Harness h(16, 256, 16, 16);
    const std::string system(200, 's');
    auto first = make_job("l0", system + " one", 4);
    auto second = make_job("l1", system + " two", 4);
    h.sched->enqueue_all({first, second});
    EXPECT_EQ(drain(*first).text, expected(system + " one", 4));
    EXPECT_EQ(drain(*second).text, expected(system + " two", 4));
    EXPECT_LT(h.sched->stats().prefix_hit_tokens.load(), 200u) << "it waited for the whole 200-token prompt";
}

// Prefix reuse is per cache scope (per API key): a request never reuses,
// and so never learns of, another scope's cached prompt; with
// prefix_cache_shared (single tenant) every request may.
TEST(Scheduler, PrefixReuseStaysWithinItsCacheScope) {
    for (bool shared : {false, true}) {
        SchedulerOptions o;
        o.prefix_cache_shared = shared;
        Harness h(16, 256, 16, 64, o);
        const std::string secret = std::string(48, 's') + " the first tenant's prompt";
        auto a = make_job("a", secret, 4);
        a->request.cache_scope = "tenant A";
        h.sched->enqueue(a);
        EXPECT_EQ(drain(*a).text, expected(secret, 4));
        auto guess = make_job("b", secret + " guessed", 4);
        guess->request.cache_scope = "tenant B";
        h.sched->enqueue(guess);
        EXPECT_EQ(drain(*guess).text, expected(secret + " guessed", 4));
        EXPECT_EQ(h.sched->stats().prefix_hits.load(), shared ? 1u : 0u) << "shared " << shared;
        auto own = make_job("a2", secret + " again", 4);
        own->request.cache_scope = "tenant A";
        h.sched->enqueue(own);
        EXPECT_EQ(drain(*own).text, expected(secret + " again", 4));
        EXPECT_EQ(h.sched->stats().prefix_hits.load(), shared ? 2u : 1u) << "its own scope's prefix was not reused";
    }
}

// ---- speculative decoding ---------------------------------------------------

namespace {

// A target that verifies up to 8 drafts, and its scheduler speculating from
// `o.spec` (a draft model: a second fake, `perturb_every` making it wrong
// at every that many-th length).
struct SpecHarness {
    FakeEngine* engine;
    std::shared_ptr<FakeEngine> draft;
    std::unique_ptr<Scheduler> sched;
    SpecHarness(SpecSource source, uint32_t draft_max, uint32_t max_batch, size_t perturb_every = 0,
                uint32_t verify_max = 8, int32_t eog = -1, uint32_t blocks = 256, uint32_t step_tokens = 256,
                uint32_t draft_blocks = 1024, uint32_t draft_step_tokens = 256) {
        auto e = std::make_unique<FakeEngine>(4, blocks, 16, step_tokens);
        e->verifies_up_to(verify_max);
        engine = e.get();
        SchedulerOptions o;
        o.spec.source = source;
        o.spec.draft_max = draft_max;
        o.spec.max_batch = max_batch;
        if (source == SpecSource::DraftModel) {
            draft = std::make_shared<FakeEngine>(4, draft_blocks, 32, draft_step_tokens);
            draft->perturb_every = perturb_every;
            o.spec.draft = draft;
        }
        sched = std::make_unique<Scheduler>(std::move(e), std::make_shared<ByteCodec>(256, eog), std::make_shared<Metrics>(), o);
    }
};

}  // namespace

// A draft model that is always right: every draft is accepted, the output is
// plain decoding's, and a step gives a request several tokens.
TEST(SchedulerSpec, AnExactDraftModelIsAcceptedWholeAndChangesNothing) {
    SpecHarness h(SpecSource::DraftModel, 4, 8);
    EXPECT_STREQ(h.sched->speculation(), "draft_model");
    auto job = make_job("one", "a prompt of some length", 41);
    h.sched->enqueue(job);
    Outcome r = drain(*job);
    ASSERT_EQ(r.end.kind, JobEvent::Kind::End) << r.end.message;
    EXPECT_EQ(r.text, expected("a prompt of some length", 41));
    const SchedulerStats& s = h.sched->stats();
    EXPECT_GT(s.spec_draft_tokens.load(), 20u);
    EXPECT_EQ(s.spec_accepted_tokens.load(), s.spec_draft_tokens.load());
    // 41 tokens: the prompt's step gives one, then 1 + up to 4 a step (the
    // draft length climbs to 4 and is capped near max_tokens).
    EXPECT_LE(h.engine->steps.load(), 12u);
    EXPECT_EQ(h.engine->live_lengths().size(), 1u) << "the finished request's sequence is kept for prefix reuse only";
    EXPECT_EQ(h.draft->live_lengths().size(), 0u) << "its draft sequence was released";
}

// A draft model that is often wrong: still plain decoding's output for
// several requests at once, with some drafts accepted and some not.
TEST(SchedulerSpec, AWrongDraftModelNeverChangesTheOutput) {
    SpecHarness h(SpecSource::DraftModel, 6, 8, 3);
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::string> prompts;
    for (int i = 0; i < 5; ++i) {
        prompts.push_back("prompt " + std::to_string(i) + std::string(size_t(3 * i), 'y'));
        jobs.push_back(make_job("j" + std::to_string(i), prompts.back(), 30 + uint32_t(i)));
    }
    h.sched->enqueue_all(jobs);
    for (size_t i = 0; i < jobs.size(); ++i) {
        Outcome r = drain(*jobs[i]);
        ASSERT_EQ(r.end.kind, JobEvent::Kind::End) << r.end.message;
        EXPECT_EQ(r.text, expected(prompts[i], 30 + uint32_t(i))) << "job " << i;
    }
    const SchedulerStats& s = h.sched->stats();
    EXPECT_GT(s.spec_accepted_tokens.load(), 0u);
    EXPECT_LT(s.spec_accepted_tokens.load(), s.spec_draft_tokens.load());
    EXPECT_GE(h.engine->max_entries.load(), 3u) << "the requests were not batched";
}

// Generation that ends at an accepted draft (the end-of-generation token)
// cuts the drafts after it off the sequence: a second request with the
// same prompt reuses it and gets the same answer.
TEST(SchedulerSpec, AnEndInsideTheAcceptedDraftsCutsTheRestOff) {
    const std::string p = "the end comes early";
    const std::string full = expected(p, 60);
    const char eog = full[7];
    SpecHarness h(SpecSource::DraftModel, 8, 8, 0, 8, eog);
    auto a = make_job("a", p, 60);
    h.sched->enqueue(a);
    Outcome ra = drain(*a);
    ASSERT_EQ(ra.end.kind, JobEvent::Kind::End) << ra.end.message;
    EXPECT_EQ(ra.text, full.substr(0, full.find(eog)));
    EXPECT_GT(h.engine->truncates.load(), 0u) << "no accepted draft was cut back";
    // Only drafts the request took count as accepted, not those after its end.
    EXPECT_LE(h.sched->stats().spec_accepted_tokens.load(), ra.end.tokens_out);
    // The cached sequence holds the prompt and the output before the end.
    const std::vector<size_t> lengths = h.engine->live_lengths();
    ASSERT_EQ(lengths.size(), 1u);
    EXPECT_EQ(lengths[0], p.size() + full.find(eog));
    auto b = make_job("b", p, 60);
    h.sched->enqueue(b);
    EXPECT_EQ(drain(*b).text, ra.text);
}

// max_tokens is never overshot: the drafts are capped by what is left.
TEST(SchedulerSpec, MaxTokensIsExact) {
    SpecHarness h(SpecSource::DraftModel, 8, 8);
    for (uint32_t n : {1u, 2u, 3u, 9u, 10u}) {
        auto j = make_job("m" + std::to_string(n), "max tokens " + std::to_string(n), n);
        h.sched->enqueue(j);
        Outcome r = drain(*j);
        EXPECT_EQ(r.text, expected("max tokens " + std::to_string(n), n));
        EXPECT_EQ(r.end.tokens_out, n);
    }
}

// Prompt lookup drafts from the request's own tokens; the fake's tokens do
// not repeat, so nearly every draft is rejected, and the output stays.
TEST(SchedulerSpec, NgramDraftsAreVerifiedAndChangeNothing) {
    SpecHarness h(SpecSource::Ngram, 4, 8);
    EXPECT_STREQ(h.sched->speculation(), "ngram");
    const std::string p = "abcabcabcabcabc";
    auto j = make_job("n", p, 30);
    h.sched->enqueue(j);
    Outcome r = drain(*j);
    EXPECT_EQ(r.text, expected(p, 30));
    EXPECT_GT(h.sched->stats().spec_drafts.load(), 0u);
    EXPECT_GT(h.engine->verifies.load(), 0u);
}

// Above --spec-max-batch decoding requests a step carries no drafts.
TEST(SchedulerSpec, ALargeBatchTurnsItOff) {
    SpecHarness h(SpecSource::DraftModel, 4, 1);
    h.engine->step_delay = std::chrono::milliseconds(1);
    std::vector<std::shared_ptr<Job>> jobs;
    // (prompts that differ from their first token: none waits to fork another's)
    for (int i = 0; i < 4; ++i) jobs.push_back(make_job("b" + std::to_string(i), std::to_string(i) + " batch", 20));
    h.sched->enqueue_all(jobs);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(drain(*jobs[size_t(i)]).text, expected(std::to_string(i) + " batch", 20));
    EXPECT_GT(h.sched->stats().spec_off_steps.load(), 0u);
    EXPECT_LE(h.engine->max_deciders_verifying.load(), 1u) << "a step verified while more than --spec-max-batch decoded";
}

// An engine that does not verify: speculation is off, said why, and serving is unchanged.
TEST(SchedulerSpec, AnEngineThatDoesNotVerifyServesWithoutIt) {
    SpecHarness h(SpecSource::DraftModel, 4, 8, 0, 0);
    EXPECT_STREQ(h.sched->speculation(), "off");
    EXPECT_NE(h.sched->speculation_off_reason().find("does not verify"), std::string::npos);
    auto j = make_job("x", "no verify", 12);
    h.sched->enqueue(j);
    EXPECT_EQ(drain(*j).text, expected("no verify", 12));
    EXPECT_EQ(h.engine->verifies.load(), 0u);
}

// A pool too small for every request's drafts: a step that finds it full
// runs again without them (then preempts, as without speculation); the
// outputs are unchanged.
TEST(SchedulerSpec, APoolFullOfDraftsRetriesWithoutThem) {
    // 4-token blocks: each request ends at 20 tokens (5 blocks); 12 blocks hold two of them.
    SpecHarness h(SpecSource::DraftModel, 8, 8, 0, 8, -1, 12);
    std::vector<std::shared_ptr<Job>> jobs;
    // (prompts that differ from their first token: none forks another's)
    for (int i = 0; i < 3; ++i) jobs.push_back(make_job("k" + std::to_string(i), std::to_string(i) + "ten token", 10));
    h.sched->enqueue_all(jobs);
    for (int i = 0; i < 3; ++i) {
        Outcome r = drain(*jobs[size_t(i)]);
        ASSERT_EQ(r.end.kind, JobEvent::Kind::End) << r.end.message;
        EXPECT_EQ(r.text, expected(std::to_string(i) + "ten token", 10));
    }
    EXPECT_GT(h.engine->kv_full.load(), 0u);
    EXPECT_EQ(h.engine->verify_after_full.load(), 0u) << "a step that found the pool full was retried with its drafts";
}

// Drafts never take a prompt's whole step: a request decoding with long,
// always accepted drafts leaves a prompt behind it room for its chunks, so
// that prompt is prefilled while the first request still decodes.
TEST(SchedulerSpec, DraftsLeaveRoomForAPromptsChunks) {
    SpecHarness h(SpecSource::DraftModel, 16, 8, 0, 16, -1, 256, 16);
    h.engine->step_delay = std::chrono::milliseconds(5);
    auto a = make_job("a", "Adecoding", 120);
    h.sched->enqueue(a);
    const std::string pb = "B" + std::string(59, 'p');
    for (int i = 0; i < 400 && h.sched->stats().spec_drafts.load() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    auto b = make_job("b", pb, 5);
    h.sched->enqueue(b);
    EXPECT_EQ(drain(*a).text, expected("Adecoding", 120));
    EXPECT_EQ(drain(*b).text, expected(pb, 5));
    size_t first_b = SIZE_MAX, last_a = 0;
    const auto runs = h.engine->runs();
    for (size_t i = 0; i < runs.size(); ++i)
        for (const auto& piece : runs[i]) {
            if (piece.first == 'B' && first_b == SIZE_MAX) first_b = i;
            if (piece.first == 'A') last_a = i;
        }
    EXPECT_LT(first_b, last_a) << "the prompt waited for the drafting request to finish";
}

// A request whose drafts keep failing pauses drafting, and its paused steps
// chain (ABI 1.3 halves) as without speculation; the output is unchanged.
TEST(SchedulerSpec, PausedDraftingLetsStepsChain) {
    SpecHarness h(SpecSource::Ngram, 4, 8);
    h.engine->halves = true;
    const std::string p = "abcdabcdabcdabcdabcd";
    auto j = make_job("c", p, 300);
    h.sched->enqueue(j);
    EXPECT_EQ(drain(*j).text, expected(p, 300));
    EXPECT_GT(h.sched->stats().spec_drafts.load(), 0u);
    EXPECT_GT(h.sched->stats().chained_steps.load(), 100u) << "paused steps did not chain";
    EXPECT_EQ(h.engine->calls_in_flight.load(), 0u);
}

// A draft model whose cache fills drafts nothing for a while (no error, no
// retry every step), and the output is unchanged.
TEST(SchedulerSpec, AFullDraftCachePausesDrafting) {
    SpecHarness h(SpecSource::DraftModel, 4, 8, 0, 8, -1, 256, 256, 6);  // 6 blocks of 4: 24 tokens
    auto j = make_job("f", "twelve chars", 60);
    h.sched->enqueue(j);
    Outcome r = drain(*j);
    ASSERT_EQ(r.end.kind, JobEvent::Kind::End) << r.end.message;
    EXPECT_EQ(r.text, expected("twelve chars", 60));
    EXPECT_GT(h.sched->stats().spec_drafts.load(), 0u) << "it drafted while the cache held it";
    EXPECT_LE(h.draft->kv_full.load(), 2u) << "the draft model was asked again every step";
}

// A draft model that keeps failing turns speculation off after three
// failures in a row, and /health's reason says so; the output is unchanged.
TEST(SchedulerSpec, ADraftModelThatKeepsFailingTurnsItOff) {
    SpecHarness h(SpecSource::DraftModel, 4, 8, 0, 8, -1, 256, 256, 0);  // a draft cache of no blocks
    EXPECT_STREQ(h.sched->speculation(), "draft_model");
    auto j = make_job("x", "always failing", 300);
    h.sched->enqueue(j);
    EXPECT_EQ(drain(*j).text, expected("always failing", 300));
    EXPECT_STREQ(h.sched->speculation(), "off");
    EXPECT_NE(h.sched->speculation_off_reason().find("the draft model failed 3 times in a row"), std::string::npos)
        << h.sched->speculation_off_reason();
    EXPECT_EQ(h.draft->kv_full.load(), 3u);
}

// A long prompt reaches the draft model a bounded chunk a step (drafting
// waits until it is caught up), not in one go inside the served model's step.
TEST(SchedulerSpec, TheDraftModelCatchesUpInBoundedChunks) {
    SpecHarness h(SpecSource::DraftModel, 4, 8, 0, 8, -1, 512, 256, 1024, 2048);
    const std::string p(700, 'q');
    auto j = make_job("long", p, 20);
    h.sched->enqueue(j);
    EXPECT_EQ(drain(*j).text, expected(p, 20));
    size_t largest = 0;
    for (const auto& run : h.draft->runs())
        for (const auto& piece : run) largest = std::max(largest, piece.n);
    EXPECT_LE(largest, size_t(kSpecCatchUpTokens)) << "a draft step fed the whole prompt";
    EXPECT_GT(h.sched->stats().spec_accepted_tokens.load(), 0u);
}
