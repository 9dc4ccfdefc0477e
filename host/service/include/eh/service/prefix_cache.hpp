// Sequences kept after their request ended, so a later request whose prompt
// starts with the same tokens (a system prompt, the earlier turns of a chat)
// forks their KV cache instead of computing it again. Entries are found by
// the longest common prefix, evicted least recently used first, and an entry
// whose tokens are a prefix of a newer one's is dropped as redundant.
// Each entry belongs to a scope (the API key that computed it, by default):
// a lookup finds only its own scope's entries, so one tenant cannot learn
// from cached_tokens (or timing) whether another's prompt starts as it
// guesses. An entry also belongs to the LoRA adapter it was computed with
// (0: the base model): its KV is that adapter's, so no other may reuse it.
//
// The host tier (--kv-host-bytes, an engine that can_park()): an entry
// evicted for lack of KV blocks is parked in host memory instead of
// dropped, while the budget holds it (the least recently used parked
// entries leave to make room; one larger than the whole budget is
// dropped). A lookup searches both tiers: a parked entry that shares more
// than the best entry on the device (by at least min_match tokens) is
// copied back into fresh blocks and becomes a device entry again, then
// forked as any. The tier is inclusive: the parked copy stays after a
// restore (LRU-touched), so evicting the restored entry again, unchanged,
// costs no copy.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eh/service/kv_events.hpp"
#include "eh/service/seq_engine.hpp"

namespace eh::service {

// The host tier's numbers, read by /health and /metrics from other threads.
struct HostTierStats {
    std::atomic<uint64_t> budget_bytes{0};   // 0: the tier is off
    std::atomic<uint64_t> used_bytes{0};
    std::atomic<uint64_t> entries{0};
    std::atomic<uint64_t> parks{0}, park_bytes{0};        // entries parked, and their bytes
    std::atomic<uint64_t> restores{0}, restore_bytes{0};  // entries copied back
    std::atomic<uint64_t> dropped{0};        // parked entries dropped for room (LRU) or as redundant
    std::atomic<uint64_t> too_large{0};      // evicted entries larger than the whole budget
};

class PrefixCache {
public:
    // `min_match`: the shortest reuse worth a fork (one KV block).
    // `index`, when given, hears of every entry that arrives and leaves (KV
    // events, kv_events.hpp). `host_bytes` > 0 turns the host tier on when
    // the engine can_park(); `host_stats`, when given, is kept current.
    PrefixCache(SeqEngine& engine, uint32_t min_match, size_t max_entries, std::unique_ptr<KvBlockIndex> index = nullptr,
                uint64_t host_bytes = 0, HostTierStats* host_stats = nullptr);
    ~PrefixCache() { clear(); }

    struct Match {
        SeqId seq;       // the cached sequence to fork
        uint32_t n;      // tokens of it to reuse
    };
    // The entry sharing the longest prefix with `tokens`, reusing at most
    // `limit` tokens; marks it used. nullopt when none reaches min_match.
    // A parked entry is restored only while `reserve_blocks` (what running
    // requests are owed) stay free after it.
    std::optional<Match> lookup(const std::string& scope, uint32_t adapter, std::span<const int32_t> tokens,
                                uint32_t limit, uint32_t reserve_blocks = 0);

    // Takes ownership of `seq`, which holds exactly `tokens` computed with `adapter`.
    void insert(const std::string& scope, uint32_t adapter, SeqId seq, std::vector<int32_t> tokens);
    // Evicts the least recently used device entry (parking it when the host
    // tier takes it); false when there is none.
    bool evict_one();
    void clear();
    // The engine lost every sequence: drop the entries without releasing.
    void forget_all();
    size_t size() const { return entries_.size(); }
    bool host_tier() const { return host_budget_ > 0; }
    size_t host_size() const { return parked_.size(); }
    uint64_t host_used() const { return host_used_; }

private:
    struct Entry {
        std::string scope;
        uint32_t adapter;
        SeqId seq;
        std::vector<int32_t> tokens;
    };
    struct ParkedEntry {
        std::string scope;
        uint32_t adapter;
        uint64_t id;
        uint64_t bytes;
        std::vector<int32_t> tokens;
    };
    // Parks `e` (its sequence is released by the caller); false when it
    // cannot be (too large, the host memory refused, a parked entry
    // already holds it all). `keep` (a restore's entry) never leaves for it.
    bool park(const Entry& e, const ParkedEntry* keep);
    // Parks (when it can) and releases the least recently used device entry.
    void evict_back(const ParkedEntry* keep);
    // Drops the least recently used parked entry other than `keep`; false
    // when there is none.
    bool drop_parked_lru(const ParkedEntry* keep);
    void drop_parked(std::list<ParkedEntry>::iterator it);
    // Brings parked entry `it` back as the front device entry; false when
    // the blocks are not there (nothing changed) or the engine refused it.
    bool restore(std::list<ParkedEntry>::iterator it, uint32_t reserve_blocks);
    void publish();

    SeqEngine& engine_;
    uint32_t min_match_;
    size_t max_entries_;
    std::list<Entry> entries_;  // front = most recently used
    std::unique_ptr<KvBlockIndex> index_;
    uint64_t host_budget_ = 0;  // 0: no host tier
    uint64_t host_used_ = 0;
    std::list<ParkedEntry> parked_;  // front = most recently used
    HostTierStats* stats_ = nullptr;
};

}  // namespace eh::service
