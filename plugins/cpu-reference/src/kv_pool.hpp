// The KV cache as fixed-size blocks shared by every sequence of a model.
// A block holds `block_tokens` consecutive positions of one sequence for
// every layer; blocks are reference counted so forked sequences share the
// blocks of their common prefix. The pool never grows after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cpuref {

class KvPool {
public:
    // Throws ehp::Error(EH_INVALID_ARGUMENT) when the pool would be empty.
    KvPool(uint32_t n_layer, size_t kv_dim, uint32_t block_tokens, uint32_t n_blocks);

    uint32_t block_tokens() const { return block_tokens_; }
    uint32_t total_blocks() const { return static_cast<uint32_t>(refs_.size()); }
    uint32_t free_blocks() const { return static_cast<uint32_t>(free_.size()); }
    size_t kv_dim() const { return kv_dim_; }
    // Bytes of one block, K and V of every layer.
    uint64_t block_bytes() const { return 2ull * n_layer_ * block_tokens_ * kv_dim_ * sizeof(float); }

    // A free block with one reference; the caller checked free_blocks().
    uint32_t take();
    void retain(uint32_t block) { ++refs_[block]; }
    void release(uint32_t block);
    uint32_t refs(uint32_t block) const { return refs_[block]; }
    // Copies the first `n_pos` positions of every layer from `from` to `to`.
    void copy(uint32_t from, uint32_t to, uint32_t n_pos);

    // K or V row (kv_dim floats) of position `slot` within `block`, layer `layer`.
    float* k(uint32_t layer, uint32_t block, uint32_t slot) { return &k_[layer][row(block, slot)]; }
    float* v(uint32_t layer, uint32_t block, uint32_t slot) { return &v_[layer][row(block, slot)]; }
    const float* k(uint32_t layer, uint32_t block, uint32_t slot) const { return &k_[layer][row(block, slot)]; }
    const float* v(uint32_t layer, uint32_t block, uint32_t slot) const { return &v_[layer][row(block, slot)]; }

private:
    size_t row(uint32_t block, uint32_t slot) const {
        return (static_cast<size_t>(block) * block_tokens_ + slot) * kv_dim_;
    }
    uint32_t n_layer_;
    size_t kv_dim_;
    uint32_t block_tokens_;
    std::vector<std::vector<float>> k_, v_;  // per layer: n_blocks x block_tokens x kv_dim
    std::vector<uint32_t> refs_;
    std::vector<uint32_t> free_;             // a stack: the last freed block is reused first
};

}  // namespace cpuref
