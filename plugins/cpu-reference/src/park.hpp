// ABI 1.7's host-memory tier on the CPU reference: a sequence's stored K/V
// rows copied as they are (so bit for bit, whatever the KV type) into a
// parked copy, plane after plane (K of layer 0, V of layer 0, K of layer 1,
// ...), each plane the parked positions' rows in order; and back into the
// fresh blocks of a new sequence. The pool is already host memory, so the
// tier here is a correctness reference for the GPU plugins' copies.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <engine_host/kv_park.hpp>

#include "batch.hpp"
#include "sequence.hpp"

// The ABI's opaque parked handle (plugin_abi.h, 1.7).
struct eh_parked {
    eh_model* owner = nullptr;
};

namespace cpuref {

class Parked : public eh_parked {
public:
    ehp::ParkedMeta meta;
    const Adapter* adapter = nullptr;  // as seq_fork would give it
    std::vector<int32_t> next_pos;     // M-RoPE text positions, as seq_fork would give them
    std::vector<uint8_t> rows;
};

// Throws ehp::Error with the ABI's statuses (ehp::check_park and friends).
// *out_bytes is set before the budget is checked.
std::unique_ptr<Parked> park(eh_model* model, const Sequence& seq, uint32_t n_tokens, uint64_t max_bytes,
                             uint64_t* out_bytes);
std::unique_ptr<Sequence> unpark(Batch& batch, eh_model* model, const Parked* parked, const int32_t* tokens,
                                 uint32_t n_tokens);

}  // namespace cpuref
