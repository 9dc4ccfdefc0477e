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
#pragma once

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

class PrefixCache {
public:
    // `min_match`: the shortest reuse worth a fork (one KV block).
    // `index`, when given, hears of every entry that arrives and leaves (KV
    // events, kv_events.hpp).
    PrefixCache(SeqEngine& engine, uint32_t min_match, size_t max_entries, std::unique_ptr<KvBlockIndex> index = nullptr)
        : engine_(engine), min_match_(min_match ? min_match : 1), max_entries_(max_entries), index_(std::move(index)) {}
    ~PrefixCache() { clear(); }

    struct Match {
        SeqId seq;       // the cached sequence to fork
        uint32_t n;      // tokens of it to reuse
    };
    // The entry sharing the longest prefix with `tokens`, reusing at most
    // `limit` tokens; marks it used. nullopt when none reaches min_match.
    std::optional<Match> lookup(const std::string& scope, uint32_t adapter, std::span<const int32_t> tokens,
                                uint32_t limit);

    // Takes ownership of `seq`, which holds exactly `tokens` computed with `adapter`.
    void insert(const std::string& scope, uint32_t adapter, SeqId seq, std::vector<int32_t> tokens);
    // Releases the least recently used entry; false when empty.
    bool evict_one();
    void clear();
    // The engine lost every sequence: drop the entries without releasing.
    void forget_all();
    size_t size() const { return entries_.size(); }

private:
    struct Entry {
        std::string scope;
        uint32_t adapter;
        SeqId seq;
        std::vector<int32_t> tokens;
    };
    SeqEngine& engine_;
    uint32_t min_match_;
    size_t max_entries_;
    std::list<Entry> entries_;  // front = most recently used
    std::unique_ptr<KvBlockIndex> index_;
};

}  // namespace eh::service
