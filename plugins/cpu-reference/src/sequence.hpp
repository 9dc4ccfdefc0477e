// One sequence of the batched ABI: its tokens, the KV blocks holding them,
// its sampler and the logits a step kept for it.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "kv_pool.hpp"
#include "sampler.hpp"

// The ABI's opaque sequence handle is the sequence itself; `owner` is the
// model whose last-error slot its calls report to.
struct eh_seq {
    eh_model* owner = nullptr;
};

namespace cpuref {

class Sequence : public eh_seq {
public:
    explicit Sequence(KvPool& pool) : pool_(pool) {}
    ~Sequence();
    Sequence(const Sequence&) = delete;
    Sequence& operator=(const Sequence&) = delete;

    uint32_t length() const { return static_cast<uint32_t>(tokens_.size()); }
    const std::vector<int32_t>& tokens() const { return tokens_; }
    const std::vector<uint32_t>& blocks() const { return blocks_; }

    // Free blocks that appending `n` tokens takes: new blocks past the ones
    // held, plus a copy of a shared, partly filled last block.
    uint32_t blocks_needed(uint32_t n) const;
    // Takes those blocks so positions length() .. length()+n-1 are writable
    // by this sequence alone. The caller checked blocks_needed() against the
    // pool's free blocks.
    void reserve(uint32_t n);
    // Appends tokens whose K/V the forward pass wrote into reserved rows.
    void commit(const int32_t* tokens, uint32_t n);
    // Keeps the first n tokens and returns the blocks past them.
    void truncate(uint32_t n);
    // A new sequence sharing the blocks of the first n tokens.
    std::unique_ptr<Sequence> fork(uint32_t n) const;

    // K/V rows of position `pos` in layer `layer`.
    float* k(uint32_t layer, uint32_t pos) { return pool_.k(layer, block_of(pos), slot_of(pos)); }
    float* v(uint32_t layer, uint32_t pos) { return pool_.v(layer, block_of(pos), slot_of(pos)); }
    const float* k(uint32_t layer, uint32_t pos) const { return pool_.k(layer, block_of(pos), slot_of(pos)); }
    const float* v(uint32_t layer, uint32_t pos) const { return pool_.v(layer, block_of(pos), slot_of(pos)); }

    Sampler sampler;
    std::vector<float> logits;  // raw logits kept by the last step that asked
    bool has_logits = false;
    // Tokens at positions >= gen_start were appended after the first step
    // that sampled for this sequence: its own output, which presence and
    // frequency penalties look at.
    uint32_t gen_start = std::numeric_limits<uint32_t>::max();

private:
    uint32_t block_of(uint32_t pos) const { return blocks_[pos / pool_.block_tokens()]; }
    uint32_t slot_of(uint32_t pos) const { return pos % pool_.block_tokens(); }
    uint32_t blocks_for(uint64_t n_tokens) const {
        return static_cast<uint32_t>((n_tokens + pool_.block_tokens() - 1) / pool_.block_tokens());
    }
    bool shared_tail() const;

    KvPool& pool_;
    std::vector<int32_t> tokens_;
    std::vector<uint32_t> blocks_;  // may run past length() after a reserve whose step failed
};

}  // namespace cpuref
