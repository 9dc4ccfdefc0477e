// vLLM's KV-event wire format (vllm/distributed/kv_events.py, as llm-d's
// indexer decodes it): a batch is the msgpack array
//   [ts (float64 seconds since the epoch), [event...], data_parallel_rank]
// and each event an array led by its tag:
//   ["BlockStored", [hash...], parent hash or nil, [token id...], block_size, lora_id, medium, lora_name]
//   ["BlockRemoved", [hash...], medium]
//   ["AllBlocksCleared"]
// Hashes and token ids are unsigned integers; lora_id and lora_name are nil
// (no LoRA adapters here).
#pragma once

#include <string>
#include <vector>

#include "eh/service/kv_events.hpp"

namespace eh::service::kv_wire {

std::string encode_batch(double ts, const std::vector<KvEvent>& events, const std::string& medium, int dp_rank);

}  // namespace eh::service::kv_wire
