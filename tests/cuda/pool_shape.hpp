// The KV pools the batched GPU tests ask kv_init for (step_seq.hpp's
// KvShape): `seqs` sequences of up to seq_tokens, as many entries a step.
#pragma once

#include <cstdint>

#include "step_seq.hpp"

namespace ehtest {

inline KvShape pool_shape(uint32_t seqs, uint32_t seq_tokens, uint32_t step_tokens = 512,
                          uint64_t budget = 64ull << 20, uint32_t kv_type = 0) {
    KvShape k;
    k.max_seqs = k.max_step_entries = seqs;
    k.max_seq_tokens = seq_tokens;
    k.max_step_tokens = step_tokens;
    k.budget_bytes = budget;
    k.kv_type = kv_type;
    return k;
}

}  // namespace ehtest
