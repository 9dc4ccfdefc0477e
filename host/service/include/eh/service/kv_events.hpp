// KV-cache events: what the prefix cache holds, told to a router that
// routes by cached prefixes (llm-d's KV-cache indexer, NVIDIA Dynamo), in
// vLLM's event model. A block here is `block_tokens` consecutive tokens of a
// cached sequence, named by a hash chained over every token before it: the
// hash llm-d's indexer computes from the token ids (block_hash()), so the
// hashes mean the same to it as a vLLM server's with that scheme.
//
// Only full blocks of sequences in the prefix cache are announced: those
// are what a later request can reuse here. A block is stored when the
// first cached sequence holding it arrives and removed when the last one
// leaves (refcounted by hash), so blocks shared by several cached sequences
// are told once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace eh::service {

struct KvEvent {
    enum class Kind { BlockStored, BlockRemoved, AllBlocksCleared };
    Kind kind = Kind::BlockStored;
    std::vector<uint64_t> hashes;      // BlockStored: in chain order; BlockRemoved: any order
    std::optional<uint64_t> parent;    // BlockStored: the block before hashes[0]; none for a sequence's first
    std::vector<int32_t> tokens;       // BlockStored: every block's tokens, concatenated
    uint32_t block_tokens = 0;         // BlockStored
};

// Where the events go (the ZeroMQ publisher, a test's recorder). Called on
// the scheduler's thread; one call is one batch.
class KvEventSink {
public:
    virtual ~KvEventSink() = default;
    virtual void publish(std::vector<KvEvent> batch) = 0;
};

// The chain's root: the low 64 bits (bytes 24-31, big-endian) of
// SHA-256(CBOR(seed as a text string)). llm-d's `hashSeed`; vLLM's
// PYTHONHASHSEED.
uint64_t kv_root_hash(std::string_view seed);
// A block's hash: the low 64 bits of SHA-256(canonical CBOR of
// [parent, [token ids...], null]), parent the previous block's hash or the root.
uint64_t kv_block_hash(uint64_t parent, std::span<const int32_t> tokens);

// The blocks the prefix cache holds, counted per hash; turns its inserts and
// removals into events for `sink`.
class KvBlockIndex {
public:
    KvBlockIndex(std::shared_ptr<KvEventSink> sink, uint32_t block_tokens, std::string_view seed);
    // A cached sequence holding `tokens` arrived / left.
    void add(std::span<const int32_t> tokens);
    void remove(std::span<const int32_t> tokens);
    // Every cached sequence is gone (the engine lost them, or the cache was
    // emptied): BlockRemoved for every block still held, then AllBlocksCleared.
    void clear();
    uint32_t block_tokens() const { return block_tokens_; }
    size_t blocks() const { return refs_.size(); }

private:
    std::vector<uint64_t> chain(std::span<const int32_t> tokens) const;
    std::shared_ptr<KvEventSink> sink_;
    uint32_t block_tokens_;
    uint64_t root_;
    std::unordered_map<uint64_t, uint32_t> refs_;  // hash -> cached sequences holding the block
};

}  // namespace eh::service
