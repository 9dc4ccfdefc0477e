#include "kv_pool.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include <engine_host/plugin_abi.hpp>

namespace cpuref {

KvPool::KvPool(uint32_t n_layer, size_t kv_dim, uint32_t block_tokens, uint32_t n_blocks)
    : n_layer_(n_layer), kv_dim_(kv_dim), block_tokens_(block_tokens) {
    if (block_tokens == 0 || n_blocks == 0 || kv_dim == 0)
        throw ehp::Error(EH_INVALID_ARGUMENT, "KV pool needs at least one block of at least one token");
    const size_t floats = static_cast<size_t>(n_blocks) * block_tokens * kv_dim;
    k_.assign(n_layer, std::vector<float>(floats));
    v_.assign(n_layer, std::vector<float>(floats));
    refs_.assign(n_blocks, 0);
    free_.resize(n_blocks);
    // Lowest block ids on top of the stack.
    for (uint32_t i = 0; i < n_blocks; ++i) free_[i] = n_blocks - 1 - i;
}

uint32_t KvPool::take() {
    if (free_.empty()) throw ehp::Error(EH_KV_FULL, "no free KV block");
    const uint32_t b = free_.back();
    free_.pop_back();
    refs_[b] = 1;
    return b;
}

void KvPool::release(uint32_t block) {
    if (refs_[block] == 0) throw ehp::Error(EH_INTERNAL, "KV block " + std::to_string(block) + " released twice");
    if (--refs_[block] == 0) free_.push_back(block);
}

void KvPool::copy(uint32_t from, uint32_t to, uint32_t n_pos) {
    const size_t n = static_cast<size_t>(n_pos) * kv_dim_ * sizeof(float);
    for (uint32_t l = 0; l < n_layer_; ++l) {
        std::memcpy(k(l, to, 0), k(l, from, 0), n);
        std::memcpy(v(l, to, 0), v(l, from, 0), n);
    }
}

}  // namespace cpuref
