// The prefix cache's host tier (prefix_cache.hpp) against a fake engine
// whose blocks, sequences and parked copies are counted exactly: an evicted
// entry is parked and comes back by copy, the budget keeps the least
// recently used parked entries out, a restore never takes blocks that are
// not there, and an engine without the calls keeps the tier off.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "eh/service/prefix_cache.hpp"

using namespace eh;
using namespace eh::service;

namespace {

class ParkingEngine : public SeqEngine {
public:
    static constexpr uint32_t kBlock = 4;
    static constexpr uint64_t kTokenBytes = 100;  // host bytes a parked token takes

    ParkingEngine(uint32_t total_blocks, bool parks = true) : parks_(parks) {
        l_.block_tokens = kBlock;
        l_.total_blocks = total_blocks;
        l_.max_seqs = 64;
        l_.max_step_tokens = 256;
        l_.max_step_entries = 64;
        l_.max_seq_tokens = 1024;
        l_.can_fork = true;
        l_.batched = true;
        free_ = total_blocks;
    }
    const SeqLimits& limits() const override { return l_; }
    uint32_t free_blocks() const override { return free_; }
    SeqId create() override { return hold({}); }
    SeqId fork(SeqId src, uint32_t n) override {
        const auto& t = seqs.at(src);
        return hold({t.begin(), t.begin() + n});  // (blocks counted as copies: simpler, and conservative)
    }
    void truncate(SeqId, uint32_t) override {}
    void release(SeqId seq) override {
        auto it = seqs.find(seq);
        ASSERT_NE(it, seqs.end());
        free_ += blocks(it->second.size());
        seqs.erase(it);
    }
    void set_sampling(SeqId, const eh_sampling_params&) override {}
    bool step(std::span<StepItem>) override { return true; }
    std::span<const float> logits(SeqId) override { return {}; }
    bool has_logits() const override { return false; }

    bool can_park() const override { return parks_; }
    Parked park(SeqId seq, uint32_t n, uint64_t max_bytes) override {
        const auto& t = seqs.at(seq);
        EXPECT_LE(n, t.size());
        const uint64_t bytes = n * kTokenBytes;
        if (bytes > max_bytes) return {0, bytes};
        parked[++next_parked_] = {t.begin(), t.begin() + n};
        ++parks;
        return {next_parked_, bytes};
    }
    SeqId unpark(uint64_t id, std::span<const int32_t> tokens) override {
        const auto& p = parked.at(id);
        if (!std::equal(p.begin(), p.end(), tokens.begin(), tokens.end()))
            throw Error(Code::Internal, "seq_unpark: the tokens are not the parked copy's");
        if (blocks(p.size()) > free_) return 0;
        ++unparks;
        return hold(p);
    }
    void drop_parked(uint64_t id) override { parked.erase(id); }

    // A sequence holding `t` as if computed (blocks taken).
    SeqId hold(std::vector<int32_t> t) {
        EXPECT_GE(free_, blocks(t.size()));
        free_ -= blocks(t.size());
        seqs[++next_] = std::move(t);
        return next_;
    }
    static uint32_t blocks(size_t n) { return uint32_t((n + kBlock - 1) / kBlock); }

    std::map<SeqId, std::vector<int32_t>> seqs;
    std::map<uint64_t, std::vector<int32_t>> parked;
    int parks = 0, unparks = 0;

private:
    SeqLimits l_;
    bool parks_;
    uint32_t free_ = 0;
    SeqId next_ = 0;
    uint64_t next_parked_ = 0;
};

std::vector<int32_t> tokens(int32_t first, size_t n) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), first);
    return t;
}

std::vector<int32_t> plus(std::vector<int32_t> t, std::vector<int32_t> more) {
    t.insert(t.end(), more.begin(), more.end());
    return t;
}

// A 40-token prompt (10 blocks) cached under (scope, adapter), then
// evicted: parked where the tier takes it. Its tokens.
std::vector<int32_t> evicted_prompt(ParkingEngine& e, PrefixCache& cache, const std::string& scope = "",
                                    uint32_t adapter = 0) {
    const auto a = tokens(1000, 40);
    cache.insert(scope, adapter, e.hold(a), a);
    cache.evict_one();
    return a;
}

}  // namespace

TEST(HostTier, AnEvictedPrefixIsParkedAndComesBackByCopy) {
    ParkingEngine e(64);
    HostTierStats st;
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 1 << 20, &st);
    const auto a = tokens(1000, 40);
    cache.insert("", 0, e.hold(a), a);
    ASSERT_TRUE(cache.evict_one());
    EXPECT_EQ(cache.size(), 0u);
    EXPECT_TRUE(e.seqs.empty());          // its blocks went back
    EXPECT_EQ(e.free_blocks(), 64u);
    EXPECT_EQ(cache.host_size(), 1u);
    EXPECT_EQ(st.parks.load(), 1u);
    EXPECT_EQ(st.used_bytes.load(), 40 * ParkingEngine::kTokenBytes);
    EXPECT_EQ(st.entries.load(), 1u);

    // The next turn: the prefix and more.
    auto m = cache.lookup("", 0, plus(a, tokens(7, 9)), 48);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->n, 40u);
    EXPECT_EQ(e.seqs.at(m->seq), a);      // restored: the parked tokens, in fresh blocks
    EXPECT_EQ(e.unparks, 1);
    EXPECT_EQ(st.restores.load(), 1u);
    EXPECT_EQ(st.restore_bytes.load(), 40 * ParkingEngine::kTokenBytes);
    EXPECT_EQ(cache.size(), 1u);
    // Inclusive: the parked copy stays, so evicting it again unchanged copies nothing.
    EXPECT_EQ(cache.host_size(), 1u);
    ASSERT_TRUE(cache.evict_one());
    EXPECT_EQ(e.parks, 1);
}

TEST(HostTier, WithoutTheTierAnEvictedPrefixIsGone) {
    ParkingEngine e(64);
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 0);
    const auto a = evicted_prompt(e, cache);
    EXPECT_EQ(cache.host_size(), 0u);
    EXPECT_EQ(e.parks, 0);
    EXPECT_FALSE(cache.lookup("", 0, plus(a, {1, 2}), 41).has_value());
}

TEST(HostTier, AnEngineThatCannotParkKeepsTheTierOff) {
    ParkingEngine e(64, /*parks*/ false);
    HostTierStats st;
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 1 << 20, &st);
    EXPECT_FALSE(cache.host_tier());
    EXPECT_EQ(st.budget_bytes.load(), 0u);
    const auto a = evicted_prompt(e, cache);
    EXPECT_EQ(cache.host_size(), 0u);
    EXPECT_EQ(e.parks, 0);
}

TEST(HostTier, TheBudgetKeepsTheMostRecentlyUsedParkedEntries) {
    ParkingEngine e(256);
    HostTierStats st;
    // Room for two entries of 40 tokens.
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 80 * ParkingEngine::kTokenBytes + 50, &st);
    const auto a = tokens(1000, 40), b = tokens(2000, 40), c = tokens(3000, 40), d = tokens(4000, 40);
    for (const auto* t : {&a, &b, &c}) {
        cache.insert("", 0, e.hold(*t), *t);
        cache.evict_one();
    }
    EXPECT_EQ(cache.host_size(), 2u);       // a, the least recently used, made room for c
    EXPECT_EQ(st.dropped.load(), 1u);
    EXPECT_LE(cache.host_used(), 80 * ParkingEngine::kTokenBytes + 50);
    EXPECT_FALSE(cache.lookup("", 0, plus(a, {1}), 41).has_value());
    // b used (restored) moves ahead of c: d's park drops c, not b.
    auto m = cache.lookup("", 0, plus(b, {1}), 41);
    ASSERT_TRUE(m.has_value());
    cache.insert("", 0, e.hold(d), d);
    // Evict the device entries (b's restored sequence is the oldest: its
    // parked copy holds it, so no copy), then d.
    while (cache.size()) cache.evict_one();
    EXPECT_EQ(cache.host_size(), 2u);
    EXPECT_EQ(e.parked.size(), 2u);
    for (const auto& [id, t] : e.parked) EXPECT_TRUE(t == b || t == d) << t.front();
}

TEST(HostTier, AnEntryLargerThanTheWholeBudgetIsDropped) {
    ParkingEngine e(64);
    HostTierStats st;
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 10 * ParkingEngine::kTokenBytes, &st);
    const auto a = evicted_prompt(e, cache);
    EXPECT_EQ(cache.host_size(), 0u);
    EXPECT_EQ(st.too_large.load(), 1u);
    EXPECT_EQ(e.free_blocks(), 64u);
}

TEST(HostTier, ARestoreNeverTakesBlocksThatAreNotThere) {
    ParkingEngine e(16);
    HostTierStats st;
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 1 << 20, &st);
    const auto a = evicted_prompt(e, cache);
    // A running request holds 10 of the 16 blocks: 6 free, the copy needs 10.
    const SeqId running = e.hold(tokens(0, 40));
    EXPECT_FALSE(cache.lookup("", 0, plus(a, {1}), 41).has_value());
    EXPECT_EQ(e.unparks, 0);
    EXPECT_EQ(e.free_blocks(), 6u);
    EXPECT_EQ(cache.host_size(), 1u);       // still parked, for later
    e.release(running);
    // 16 free: the copy fits, but not with 7 blocks owed to running requests.
    EXPECT_FALSE(cache.lookup("", 0, plus(a, {1}), 41, 7).has_value());
    EXPECT_EQ(e.unparks, 0);
    auto m = cache.lookup("", 0, plus(a, {1}), 41, 6);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(st.restores.load(), 1u);
}

// A restore that evicted device entries for room and still found too few
// blocks falls back to what is left on the device (here nothing: the one
// device entry, a shorter match, was evicted; a's parked copy holds it, so
// nothing more was parked).
TEST(HostTier, ARestoreThatFailsAfterEvictingFallsBackToWhatIsLeft) {
    ParkingEngine e(20);
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 1 << 20);
    const auto a = evicted_prompt(e, cache);
    const std::vector<int32_t> a8(a.begin(), a.begin() + 8);  // 2 blocks, on the device
    cache.insert("", 0, e.hold(a8), a8);
    const SeqId running = e.hold(tokens(0, 60));  // 15 blocks: 3 free, 5 with a8's
    EXPECT_FALSE(cache.lookup("", 0, plus(a, {1}), 41).has_value());
    EXPECT_EQ(e.unparks, 0);
    EXPECT_EQ(cache.size(), 0u);
    EXPECT_EQ(cache.host_size(), 1u);
    EXPECT_EQ(e.parks, 1);
    EXPECT_EQ(e.free_blocks(), 5u);
    e.release(running);
}

TEST(HostTier, DeviceEntriesMakeRoomForARestoreAndAreParkedInTurn) {
    ParkingEngine e(20);
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 1 << 20);
    const auto a = tokens(1000, 40), b = tokens(2000, 40);  // 10 blocks each
    cache.insert("", 0, e.hold(a), a);
    cache.evict_one();
    cache.insert("", 0, e.hold(b), b);
    const SeqId other = e.hold(tokens(0, 40));  // 0 blocks free now
    auto m = cache.lookup("", 0, plus(a, {1}), 41);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(e.seqs.at(m->seq), a);
    EXPECT_EQ(cache.size(), 1u);            // b left the device...
    EXPECT_EQ(cache.host_size(), 2u);       // ...for the host
    e.release(other);
}

TEST(HostTier, ACopyTheEngineRefusesIsDroppedAndRecomputed) {
    ParkingEngine e(64);
    HostTierStats st;
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 1 << 20, &st);
    const auto a = evicted_prompt(e, cache);
    e.parked.begin()->second[3] = -7;  // the engine's copy no longer holds those tokens
    EXPECT_FALSE(cache.lookup("", 0, plus(a, {1}), 41).has_value());
    EXPECT_EQ(cache.host_size(), 0u);
    EXPECT_TRUE(e.parked.empty());
    EXPECT_EQ(e.free_blocks(), 64u);
}

TEST(HostTier, ALongerDeviceMatchWinsAndAShorterOneLosesOnlyByABlock) {
    ParkingEngine e(128);
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 1 << 20);
    const auto a = evicted_prompt(e, cache);
    // On the device: the first 38 tokens of a. Parked: all 40 (2 more, less
    // than a block): the device entry is used, no copy.
    const std::vector<int32_t> a38(a.begin(), a.begin() + 38);
    cache.insert("", 0, e.hold(a38), a38);
    auto m = cache.lookup("", 0, plus(a, {1}), 41);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->n, 38u);
    EXPECT_EQ(e.unparks, 0);
    // The device entry of 36 tokens: 4 short (a block): the copy wins.
    cache.clear();
    cache.insert("", 0, e.hold(a), a);
    cache.evict_one();
    const std::vector<int32_t> a36(a.begin(), a.begin() + 36);
    cache.insert("", 0, e.hold(a36), a36);
    m = cache.lookup("", 0, plus(a, {1}), 41);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->n, 40u);
    EXPECT_EQ(e.unparks, 1);
}

TEST(HostTier, ParkedEntriesStayInTheirScopeAndAdapter) {
    ParkingEngine e(64);
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 1 << 20);
    const auto a = evicted_prompt(e, cache, "key-1", 2);
    EXPECT_FALSE(cache.lookup("key-2", 2, plus(a, {1}), 41).has_value());
    EXPECT_FALSE(cache.lookup("key-1", 0, plus(a, {1}), 41).has_value());
    EXPECT_TRUE(cache.lookup("key-1", 2, plus(a, {1}), 41).has_value());
}

TEST(HostTier, ALongerEntryMakesTheParkedPrefixesItHoldsRedundant) {
    ParkingEngine e(64);
    HostTierStats st;
    PrefixCache cache(e, ParkingEngine::kBlock, 8, nullptr, 1 << 20, &st);
    const auto a = evicted_prompt(e, cache);
    const auto longer = plus(a, tokens(5, 8));
    cache.insert("", 0, e.hold(longer), longer);
    EXPECT_EQ(cache.host_size(), 0u);
    EXPECT_TRUE(e.parked.empty());
    cache.clear();
    EXPECT_TRUE(e.seqs.empty());
}
