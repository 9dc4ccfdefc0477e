// The batched calls of ABI 1.2 and 1.3 for one model: the block pool sized
// at kv_init, the live sequences, and step(): validate every entry, take the
// blocks all of them need (or change nothing), one forward pass, commit,
// sample; step_begin / step_end as the same step whose tokens are handed out
// later.
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
    // Draft tokens one EH_STEP_VERIFY entry may carry (ABI 1.6).
    static constexpr uint32_t kMaxDraftTokens = 16;

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
    // ABI 1.3's halves, with the ABI's rules (plugin_abi.h). The CPU engine
    // computes the step in begin(); end() hands out its tokens.
    void begin(eh_step_entry* entries, uint32_t n_entries);
    void end(int32_t* out_tokens, uint32_t n_entries);
    // Throws BUSY (ABI 1.4) naming `call` while a step is in flight.
    void expect_idle(const char* call) const;

private:
    // One forward pass and the sampling; EH_STEP_CHAINED entries append
    // their sequence's last sample. Returns each entry's token.
    std::vector<int32_t> run(eh_step_entry* entries, uint32_t n_entries, bool chain_ok);
    // An EH_STEP_VERIFY entry's acceptance over the logits of its every
    // position (its tokens already committed): sets e.token, cuts the
    // rejected drafts off the sequence, returns the drafts accepted.
    uint32_t verify(Sequence& seq, eh_step_entry& e, const std::vector<float>& logits);

    struct Flight {
        uint64_t id;
        std::vector<int32_t> tokens;
    };
    std::vector<Flight> flight_;  // begun, not ended; oldest first
    uint64_t next_step_ = 0;
    const Model& model_;
    eh_kv_info granted_{};
    std::unique_ptr<KvPool> pool_;
    std::unordered_set<const Sequence*> live_;
};

}  // namespace cpuref
