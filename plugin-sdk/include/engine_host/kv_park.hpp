// Header-only C++17 helper for plugins that implement ABI 1.7's host-memory
// tier (seq_park, seq_unpark, parked_release). Optional, like kv_blocks.hpp.
// What it gives, with no opinion on how the KV rows are copied:
//   - ehp::ParkedMeta: what a parked copy holds besides its rows (its model,
//     its tokens, where its own output starts);
//   - ehp::check_park / ehp::check_unpark: every check the two calls make
//     before they change anything, with the ABI's statuses and messages;
//   - ehp::adopt_parked: gives a new, empty sequence the parked tokens and
//     the fresh blocks their rows are copied into.
// A plugin defines `struct eh_parked` itself (ParkedMeta plus its rows), so
// that the handle the host holds is that object.
#ifndef ENGINE_HOST_KV_PARK_HPP
#define ENGINE_HOST_KV_PARK_HPP

#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/kv_blocks.hpp>
#include <engine_host/plugin_abi.hpp>

namespace ehp {

struct ParkedMeta {
    const void* model = nullptr;            // the model whose pool it came from
    std::vector<int32_t> tokens;            // the positions it holds
    uint32_t gen_start = SeqBlocks::kNoOutput;  // SeqBlocks::gen_start, as a fork keeps it
};

// Blocks of `block_tokens` positions that n tokens fill.
inline uint32_t park_blocks(uint32_t n_tokens, uint32_t block_tokens) {
    return static_cast<uint32_t>((uint64_t(n_tokens) + block_tokens - 1) / block_tokens);
}

// seq_park's checks: a sequence of this model, 1..length tokens, the out
// pointers set. INVALID_ARGUMENT otherwise.
inline void check_park(const SeqBlocks* seq, uint32_t n_tokens, const void* out_parked, const void* out_bytes) {
    if (!seq) throw Error(EH_INVALID_ARGUMENT, "seq_park: not a live sequence of this model");
    if (!out_parked || !out_bytes) throw Error(EH_INVALID_ARGUMENT, "seq_park: NULL out pointer");
    if (n_tokens == 0 || n_tokens > seq->length())
        throw Error(EH_INVALID_ARGUMENT, "seq_park: n_tokens " + std::to_string(n_tokens) + " is outside 1.." +
                                             std::to_string(seq->length()) + " (the sequence's length)");
}

// seq_park's budget: NO_CAPACITY when the copy would hold more than max_bytes.
inline void check_park_bytes(uint64_t bytes, uint64_t max_bytes) {
    if (bytes > max_bytes)
        throw Error(EH_NO_CAPACITY, "seq_park: the parked copy needs " + std::to_string(bytes) +
                                        " bytes of host memory, more than max_bytes " + std::to_string(max_bytes));
}

inline ParkedMeta park_meta(const void* model, const SeqBlocks& seq, uint32_t n_tokens) {
    ParkedMeta m;
    m.model = model;
    m.tokens.assign(seq.tokens().begin(), seq.tokens().begin() + n_tokens);
    if (seq.gen_start < n_tokens) m.gen_start = seq.gen_start;
    return m;
}

// seq_unpark's checks, in the ABI's order: INVALID_ARGUMENT for another
// model's copy or tokens that are not the parked ones (naming the first
// position that differs), KV_FULL when the pool lacks the blocks.
// NO_CAPACITY (max_seqs) is the plugin's, as for seq_create.
inline void check_unpark(const ParkedMeta* p, const void* model, const int32_t* tokens, uint32_t n_tokens,
                         const BlockPool& pool) {
    if (!p) throw Error(EH_INVALID_ARGUMENT, "seq_unpark: parked is NULL");
    if (p->model != model) throw Error(EH_INVALID_ARGUMENT, "seq_unpark: the parked copy belongs to another model");
    if (n_tokens != p->tokens.size())
        throw Error(EH_INVALID_ARGUMENT, "seq_unpark: the parked copy holds " + std::to_string(p->tokens.size()) +
                                             " tokens, not the " + std::to_string(n_tokens) + " expected");
    if (n_tokens && !tokens) throw Error(EH_INVALID_ARGUMENT, "seq_unpark: tokens is NULL");
    for (uint32_t i = 0; i < n_tokens; ++i)
        if (tokens[i] != p->tokens[i])
            throw Error(EH_INVALID_ARGUMENT, "seq_unpark: token " + std::to_string(tokens[i]) + " at position " +
                                                 std::to_string(i) + " differs from the parked copy's " +
                                                 std::to_string(p->tokens[i]));
    const uint32_t need = park_blocks(n_tokens, pool.block_tokens());
    if (need > pool.free_blocks())
        throw Error(EH_KV_FULL, "seq_unpark: needs " + std::to_string(need) + " free KV blocks, " +
                                    std::to_string(pool.free_blocks()) + " of " + std::to_string(pool.total_blocks()) +
                                    " are free");
}

// A new, empty sequence takes the parked tokens and fresh blocks for them
// (the caller checked free blocks); the rows are the caller's to copy in,
// into blocks() in order.
inline void adopt_parked(SeqBlocks& fresh, const ParkedMeta& p) {
    const uint32_t n = static_cast<uint32_t>(p.tokens.size());
    fresh.reserve(n);
    fresh.commit(p.tokens.data(), n);
    fresh.gen_start = p.gen_start;
}

}  // namespace ehp

#endif  // ENGINE_HOST_KV_PARK_HPP
