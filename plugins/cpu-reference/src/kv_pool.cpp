#include "kv_pool.hpp"

#include <cstring>

#include <engine_host/plugin_abi.hpp>

namespace cpuref {

KvPool::KvPool(uint32_t n_layer, size_t kv_dim, uint32_t block_tokens, uint32_t n_blocks)
    : n_layer_(n_layer), kv_dim_(kv_dim), blocks_(block_tokens, n_blocks) {
    if (kv_dim == 0) throw ehp::Error(EH_INVALID_ARGUMENT, "KV pool needs a row of at least one element");
    const size_t floats = static_cast<size_t>(n_blocks) * block_tokens * kv_dim;
    k_.assign(n_layer, std::vector<float>(floats));
    v_.assign(n_layer, std::vector<float>(floats));
}

void KvPool::copy(uint32_t from, uint32_t to, uint32_t n_pos) {
    const uint64_t B = blocks_.block_tokens();
    const size_t n = static_cast<size_t>(n_pos) * kv_dim_ * sizeof(float);
    for (uint32_t l = 0; l < n_layer_; ++l) {
        std::memcpy(k(l, to * B), k(l, from * B), n);
        std::memcpy(v(l, to * B), v(l, from * B), n);
    }
}

}  // namespace cpuref
