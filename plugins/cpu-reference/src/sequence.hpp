// One sequence of the batched ABI: its tokens and KV blocks (ehp::SeqBlocks
// over the model's pool), its sampler and the logits a step kept for it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <engine_host/kv_blocks.hpp>
#include <engine_host/plugin_abi.h>

#include "kv_pool.hpp"
#include "sampler.hpp"

// The ABI's opaque sequence handle is the sequence itself; `owner` is the
// model whose last-error slot its calls report to.
struct eh_seq {
    eh_model* owner = nullptr;
};

namespace cpuref {

class Adapter;

class Sequence : public eh_seq {
public:
    explicit Sequence(KvPool& pool)
        : pool_(pool), blocks(pool.blocks(), [&pool](uint32_t from, uint32_t to, uint32_t n) { pool.copy(from, to, n); }) {}

    uint32_t length() const { return blocks.length(); }
    const std::vector<int32_t>& tokens() const { return blocks.tokens(); }
    // A new sequence sharing the blocks of the first n tokens.
    std::unique_ptr<Sequence> fork(uint32_t n) const {
        auto s = std::make_unique<Sequence>(pool_);
        s->blocks.share_prefix(blocks, n);
        s->adapter = adapter;
        s->next_pos.assign(next_pos.begin(), next_pos.begin() + std::min<size_t>(n, next_pos.size()));
        return s;
    }
    // The text position its next token takes: its length, unless an image
    // laid out on a grid (M-RoPE) moved it (next_pos).
    int32_t next_position() const {
        const uint32_t n = length();
        return n == 0 ? 0 : next_pos.size() >= n ? next_pos[n - 1] : int32_t(n);
    }
    void truncate(uint32_t n) {
        blocks.truncate(n);
        has_logits = false;
        has_hidden = false;
    }

    // The pool holding its K/V, and the pool row of position `pos`.
    KvPool& pool() const { return pool_; }
    uint64_t row(uint32_t pos) const { return blocks.row(pos); }

private:
    KvPool& pool_;

public:
    ehp::SeqBlocks blocks;
    Sampler sampler;
    std::vector<float> logits;  // raw logits kept by the last step that asked
    bool has_logits = false;
    std::vector<float> hidden;  // final hidden state kept by the last step that asked (EH_STEP_HIDDEN)
    bool has_hidden = false;
    // The last step begun that sampled for it, and that token (which a
    // chained step appends).
    uint64_t sampled_in = 0;
    int32_t last_sample = -1;
    // Rows for its next step's tokens (ABI 1.6 seq_embd_spans): the
    // host's, valid until that step returns, which drops them.
    std::vector<eh_embd_span> spans;
    // M-RoPE models only: per position, the text position that follows it
    // (ehp::mrope::place's `after`); entries past length() are stale.
    std::vector<int32_t> next_pos;
    // The LoRA adapter its steps compute with (ABI 1.6); NULL: none.
    const Adapter* adapter = nullptr;
};

}  // namespace cpuref
