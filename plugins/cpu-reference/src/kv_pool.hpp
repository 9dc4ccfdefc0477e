// The KV cache as fixed-size blocks shared by every sequence of a model, in
// host memory. A block holds `block_tokens` consecutive positions of one
// sequence for every layer; the reference counts and the free list are
// ehp::BlockPool's. The pool never grows after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <engine_host/kv_blocks.hpp>

namespace cpuref {

class KvPool {
public:
    // Throws ehp::Error(EH_INVALID_ARGUMENT) when the pool would be empty.
    KvPool(uint32_t n_layer, size_t kv_dim, uint32_t block_tokens, uint32_t n_blocks);

    ehp::BlockPool& blocks() { return blocks_; }
    const ehp::BlockPool& blocks() const { return blocks_; }
    size_t kv_dim() const { return kv_dim_; }
    // Bytes of one block, K and V of every layer.
    uint64_t block_bytes() const { return 2ull * n_layer_ * blocks_.block_tokens() * kv_dim_ * sizeof(float); }

    // Copies the first `n_pos` positions of every layer from `from` to `to`.
    void copy(uint32_t from, uint32_t to, uint32_t n_pos);

    // K or V row (kv_dim floats) of pool row `row` (ehp::SeqBlocks::row), layer `layer`.
    float* k(uint32_t layer, uint64_t row) { return &k_[layer][row * kv_dim_]; }
    float* v(uint32_t layer, uint64_t row) { return &v_[layer][row * kv_dim_]; }
    const float* k(uint32_t layer, uint64_t row) const { return &k_[layer][row * kv_dim_]; }
    const float* v(uint32_t layer, uint64_t row) const { return &v_[layer][row * kv_dim_]; }

private:
    uint32_t n_layer_;
    size_t kv_dim_;
    ehp::BlockPool blocks_;
    std::vector<std::vector<float>> k_, v_;  // per layer: n_blocks x block_tokens x kv_dim
};

}  // namespace cpuref
