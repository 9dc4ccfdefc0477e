// The batched calls of ABI 1.2 for one model: the block pool sized at
// kv_init, the live sequences, and step(): validate every entry, take the
// blocks all of them need (or change nothing), one forward pass, commit,
// sample.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_set>

#include <engine_host/plugin_abi.h>

#include "kv_pool.hpp"
#include "model.hpp"
#include "sequence.hpp"

namespace cpuref {

class Batch {
public:
    static constexpr uint32_t kBlockTokens = 16;

    // Throws ehp::Error: INVALID_ARGUMENT for zero limits,
    // INSUFFICIENT_VRAM when the budget holds no block. A budget below one
    // sequence of max_seq_tokens grants the shorter context it holds.
    Batch(const Model& model, const eh_kv_params& params);

    eh_kv_info info() const;

    std::unique_ptr<Sequence> create();
    std::unique_ptr<Sequence> fork(const Sequence& src, uint32_t n_tokens);
    // A sequence made by create() or fork() is going away.
    void forget(const Sequence* seq) { live_.erase(seq); }
    bool owns(const Sequence* seq) const { return live_.count(seq) != 0; }

    // entries: stride entries[0].struct_size. Throws ehp::Error; on
    // INVALID_ARGUMENT and KV_FULL nothing has changed.
    void step(eh_step_entry* entries, uint32_t n_entries);

private:
    const Model& model_;
    eh_kv_info granted_{};
    std::unique_ptr<KvPool> pool_;
    std::unordered_set<const Sequence*> live_;
};

}  // namespace cpuref
