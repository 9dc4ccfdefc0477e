// The KV cache as fixed-size blocks shared by every sequence of a model, in
// host memory. A block holds `block_tokens` consecutive positions of one
// sequence for every layer; the reference counts and the free list are
// ehp::BlockPool's. The pool never grows after construction.
//
// Rows are stored as F32 (the default, and the session cache's only type),
// F16, Q8_0 or FP8_E4M3 (ABI 1.4's kv_type): a row of kv_dim values is
// written once, quantized as a whole (per-32 scales run along the row, as in
// ggml), and read back as floats by whoever attends to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <engine_host/kv_blocks.hpp>

namespace cpuref {

class KvPool {
public:
    // Throws ehp::Error(EH_INVALID_ARGUMENT) when the pool would be empty,
    // EH_UNSUPPORTED for a type it cannot store (kv_dim not a multiple of
    // the type's 32-value block, or a type other than the four above).
    KvPool(uint32_t n_layer, size_t kv_dim, uint32_t block_tokens, uint32_t n_blocks, uint32_t type = EH_TYPE_F32);

    // Bytes of one row of kv_dim values stored as `type`; throws as the
    // constructor does.
    static uint64_t row_bytes(uint32_t type, size_t kv_dim);

    ehp::BlockPool& blocks() { return blocks_; }
    const ehp::BlockPool& blocks() const { return blocks_; }
    size_t kv_dim() const { return kv_dim_; }
    uint32_t n_layer() const { return n_layer_; }
    uint32_t type() const { return type_; }
    // Bytes of one block, K and V of every layer.
    uint64_t block_bytes() const { return 2ull * n_layer_ * blocks_.block_tokens() * row_bytes_; }

    // Copies the first `n_pos` positions of every layer from `from` to `to`.
    void copy(uint32_t from, uint32_t to, uint32_t n_pos);

    // Pool row `row` (ehp::SeqBlocks::row) of layer `layer`: store kv_dim
    // floats, or read them back (dequantized).
    void store_k(uint32_t layer, uint64_t row, const float* x) { store(k_[layer], row, x); }
    void store_v(uint32_t layer, uint64_t row, const float* x) { store(v_[layer], row, x); }
    void load_k(uint32_t layer, uint64_t row, float* out) const { load(k_[layer], row, out); }
    void load_v(uint32_t layer, uint64_t row, float* out) const { load(v_[layer], row, out); }
    // Bytes of one stored row (kv_dim values as type()).
    uint64_t stored_row_bytes() const { return row_bytes_; }
    // The stored bytes of n consecutive pool rows from `row` of layer
    // `layer`'s K (v = false) or V plane, copied out or in as they are (the
    // host-memory tier, ABI 1.7: bit for bit, whatever the type).
    void read_rows(uint32_t layer, bool v, uint64_t row, uint32_t n, uint8_t* out) const;
    void write_rows(uint32_t layer, bool v, uint64_t row, uint32_t n, const uint8_t* in);
    // The stored floats themselves; only for an F32 pool.
    const float* k_f32(uint32_t layer, uint64_t row) const { return f32(k_[layer], row); }
    const float* v_f32(uint32_t layer, uint64_t row) const { return f32(v_[layer], row); }

private:
    void store(std::vector<uint8_t>& plane, uint64_t row, const float* x);
    void load(const std::vector<uint8_t>& plane, uint64_t row, float* out) const;
    const float* f32(const std::vector<uint8_t>& plane, uint64_t row) const {
        return reinterpret_cast<const float*>(&plane[row * row_bytes_]);
    }

    uint32_t n_layer_;
    size_t kv_dim_;
    uint32_t type_;
    uint64_t row_bytes_;
    ehp::BlockPool blocks_;
    std::vector<std::vector<uint8_t>> k_, v_;  // per layer: n_blocks x block_tokens rows
};

}  // namespace cpuref
