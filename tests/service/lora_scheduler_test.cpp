// LoRA adapters in the scheduler, against a fake engine whose next token
// depends on the sequence's tokens and its adapter (as a real adapted model's
// would), which refuses to change the adapter of a sequence holding tokens
// (as ABI 1.6 does) and whose forks keep their source's adapter: a cached
// prefix computed with one adapter is reused only by requests of the same
// adapter, never by another adapter's or the base model's.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <thread>

#include "eh/service/scheduler.hpp"

using namespace eh;
using namespace eh::service;

namespace {

class AdapterEngine : public SeqEngine {
public:
    AdapterEngine() {
        l_.block_tokens = 16;
        l_.total_blocks = 1024;
        l_.max_seqs = 32;
        l_.max_step_tokens = 512;
        l_.max_step_entries = 32;
        l_.max_seq_tokens = 4096;
        l_.can_fork = true;
        l_.batched = true;
    }
    static int32_t next_token(const std::vector<int32_t>& t, uint32_t adapter) {
        uint32_t h = 2166136261u + adapter * 977u;
        for (int32_t x : t) h = (h ^ uint32_t(x)) * 16777619u;
        return int32_t(97 + h % 26);  // a-z
    }
    const SeqLimits& limits() const override { return l_; }
    uint32_t free_blocks() const override { return 1024 - uint32_t(seqs_.size()) * 8; }
    SeqId create() override {
        std::lock_guard lock(mu_);
        seqs_[++next_] = {};
        return next_;
    }
    SeqId fork(SeqId src, uint32_t n) override {
        std::lock_guard lock(mu_);
        Seq s = seqs_.at(src);
        s.tokens.resize(n);
        seqs_[++next_] = s;
        ++forks;
        return next_;
    }
    void truncate(SeqId id, uint32_t n) override {
        std::lock_guard lock(mu_);
        seqs_.at(id).tokens.resize(n);
    }
    void release(SeqId id) override {
        std::lock_guard lock(mu_);
        seqs_.erase(id);
    }
    void set_sampling(SeqId, const eh_sampling_params&) override {}
    void set_adapter(SeqId id, uint32_t adapter) override {
        std::lock_guard lock(mu_);
        Seq& s = seqs_.at(id);
        if (!s.tokens.empty() && s.adapter != adapter)
            throw Error(Code::Internal, "fake engine: a sequence holding tokens changed adapter");
        s.adapter = adapter;
        ++set_adapter_calls;
    }
    bool step(std::span<StepItem> items) override {
        if (step_delay.count()) std::this_thread::sleep_for(step_delay);
        std::lock_guard lock(mu_);
        for (auto& it : items) {
            Seq& s = seqs_.at(it.seq);
            s.tokens.insert(s.tokens.end(), it.tokens.begin(), it.tokens.end());
            it.token = it.sample ? next_token(s.tokens, s.adapter) : -1;
        }
        return true;
    }
    std::span<const float> logits(SeqId) override { return {}; }
    bool has_logits() const override { return false; }

    int forks = 0, set_adapter_calls = 0;
    std::chrono::milliseconds step_delay{0};

private:
    struct Seq {
        std::vector<int32_t> tokens;
        uint32_t adapter = 0;
    };
    SeqLimits l_;
    std::mutex mu_;
    std::map<SeqId, Seq> seqs_;
    SeqId next_ = 0;
};

std::shared_ptr<Job> job(const std::string& id, const std::string& prompt, uint32_t adapter) {
    auto j = std::make_shared<Job>();
    j->request.job_id = id;
    j->request.prompt = prompt;
    j->prompt_tokens.assign(prompt.begin(), prompt.end());
    j->max_tokens = 6;
    j->seed = 1;
    j->adapter = adapter;
    return j;
}

std::string run(Scheduler& s, const std::string& id, const std::string& prompt, uint32_t adapter,
                uint32_t* cached = nullptr) {
    auto j = job(id, prompt, adapter);
    s.enqueue(j);
    std::string text;
    for (int i = 0; i < 2000; ++i) {
        auto ev = j->pop(std::chrono::milliseconds(10));
        if (!ev) continue;
        if (ev->kind == JobEvent::Kind::Started && cached) *cached = ev->cached_tokens;
        if (ev->kind == JobEvent::Kind::Token) text += ev->text;
        if (ev->kind == JobEvent::Kind::Error) return "error: " + ev->message;
        if (ev->kind == JobEvent::Kind::End) break;
    }
    return text;
}

std::string expected(const std::string& prompt, uint32_t adapter) {
    std::vector<int32_t> t(prompt.begin(), prompt.end());
    std::string out;
    for (int i = 0; i < 6; ++i) {
        const int32_t tok = AdapterEngine::next_token(t, adapter);
        out += char(tok);
        t.push_back(tok);
    }
    return out;
}

}  // namespace

TEST(Scheduler, CachedPrefixesAreReusedOnlyByTheirOwnAdapter) {
    auto e = std::make_unique<AdapterEngine>();
    AdapterEngine* engine = e.get();
    Scheduler s(std::move(e), std::make_shared<ByteCodec>(256, -1), std::make_shared<Metrics>(), SchedulerOptions{});
    const std::string shared = std::string(64, 'p') + " a system prompt";

    uint32_t cached = 99;
    EXPECT_EQ(run(s, "a", shared + " one", 1, &cached), expected(shared + " one", 1));
    EXPECT_EQ(cached, 0u);
    EXPECT_EQ(engine->set_adapter_calls, 1);
    // Another adapter, then the base model: the same words, never adapter 1's KV.
    EXPECT_EQ(run(s, "b", shared + " two", 2, &cached), expected(shared + " two", 2));
    EXPECT_EQ(cached, 0u);
    EXPECT_EQ(run(s, "c", shared + " three", 0, &cached), expected(shared + " three", 0));
    EXPECT_EQ(cached, 0u);
    EXPECT_EQ(engine->forks, 0);
    EXPECT_EQ(s.stats().prefix_hits.load(), 0u);
    // Adapter 1 again: its own prefix is reused (a fork keeps the adapter,
    // so it is not set again on the fork).
    EXPECT_EQ(run(s, "d", shared + " four", 1, &cached), expected(shared + " four", 1));
    EXPECT_GE(cached, 64u);
    EXPECT_EQ(engine->forks, 1);
    EXPECT_EQ(s.stats().prefix_hits.load(), 1u);
    // ... and so is the base model's, by the base model.
    EXPECT_EQ(run(s, "e", shared + " five", 0, &cached), expected(shared + " five", 0));
    EXPECT_GE(cached, 64u);
    EXPECT_EQ(s.stats().prefix_hits.load(), 2u);
}

// The adapters waiting requests ask for (vllm:lora_requests_info's
// waiting_lora_adapters): with one request running at a time, the second's
// adapter shows while it waits, and nothing once it has run.
TEST(Scheduler, WaitingAdaptersAreCounted) {
    auto e = std::make_unique<AdapterEngine>();
    e->step_delay = std::chrono::milliseconds(20);
    SchedulerOptions o;
    o.max_running = 1;
    o.prefix_cache = false;
    Scheduler s(std::move(e), std::make_shared<ByteCodec>(256, -1), std::make_shared<Metrics>(), o);
    auto a = job("a", "first prompt", 3), b = job("b", "second prompt", 5);
    s.enqueue(a);
    s.enqueue(b);
    bool seen = false;
    for (int i = 0; i < 200 && !seen; ++i) {
        seen = s.stats().waiting_adapters.load() == (uint64_t(1) << 4);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_TRUE(seen) << "adapter 5 of the waiting request never showed";
    for (auto& j : {a, b})
        while (!j->terminated()) j->pop(std::chrono::milliseconds(10));
    for (int i = 0; i < 100 && s.stats().waiting_adapters.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(s.stats().waiting_adapters.load(), 0u);
}
