#include "kv_pool.hpp"

#include <cstring>
#include <string>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>

namespace cpuref {

uint64_t KvPool::row_bytes(uint32_t type, size_t kv_dim) {
    switch (type) {
    case EH_TYPE_F32:
    case EH_TYPE_F16:
    case EH_TYPE_Q8_0:
    case EH_TYPE_FP8_E4M3: break;
    default:
        ehp::refuse_kv_type(type, "the CPU reference stores F32 (its default), F16, Q8_0 or FP8_E4M3");
    }
    const uint64_t n = ehp::quant::row_bytes(type, kv_dim);
    if (n == 0)
        ehp::refuse_kv_type(type, "a K/V row of " + std::to_string(kv_dim) + " values is not a whole number of " +
                                      std::to_string(eh_tensor_type_traits(type).block_elems) + "-value blocks");
    return n;
}

KvPool::KvPool(uint32_t n_layer, size_t kv_dim, uint32_t block_tokens, uint32_t n_blocks, uint32_t type)
    : n_layer_(n_layer), kv_dim_(kv_dim), type_(type), blocks_(block_tokens, n_blocks) {
    if (kv_dim == 0) throw ehp::Error(EH_INVALID_ARGUMENT, "KV pool needs a row of at least one element");
    row_bytes_ = row_bytes(type, kv_dim);
    const size_t bytes = static_cast<size_t>(n_blocks) * block_tokens * row_bytes_;
    k_.assign(n_layer, std::vector<uint8_t>(bytes));
    v_.assign(n_layer, std::vector<uint8_t>(bytes));
}

void KvPool::copy(uint32_t from, uint32_t to, uint32_t n_pos) {
    const uint64_t B = blocks_.block_tokens();
    const size_t n = static_cast<size_t>(n_pos) * row_bytes_;
    for (uint32_t l = 0; l < n_layer_; ++l) {
        std::memcpy(&k_[l][to * B * row_bytes_], &k_[l][from * B * row_bytes_], n);
        std::memcpy(&v_[l][to * B * row_bytes_], &v_[l][from * B * row_bytes_], n);
    }
}

void KvPool::read_rows(uint32_t layer, bool v, uint64_t row, uint32_t n, uint8_t* out) const {
    const std::vector<uint8_t>& plane = v ? v_[layer] : k_[layer];
    std::memcpy(out, &plane[row * row_bytes_], n * row_bytes_);
}

void KvPool::write_rows(uint32_t layer, bool v, uint64_t row, uint32_t n, const uint8_t* in) {
    std::vector<uint8_t>& plane = v ? v_[layer] : k_[layer];
    std::memcpy(&plane[row * row_bytes_], in, n * row_bytes_);
}

void KvPool::store(std::vector<uint8_t>& plane, uint64_t row, const float* x) {
    ehp::quant::quantize_row(type_, x, &plane[row * row_bytes_], kv_dim_);
}

void KvPool::load(const std::vector<uint8_t>& plane, uint64_t row, float* out) const {
    ehp::quant::dequantize_row(type_, &plane[row * row_bytes_], out, kv_dim_);
}

}  // namespace cpuref
