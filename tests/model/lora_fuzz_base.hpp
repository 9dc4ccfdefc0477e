// The base model the LoRA adapter fuzzer checks adapters against, and seed
// adapters that fit it (make_fuzz_seeds.cpp writes them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "eh/model/gguf_writer.hpp"

namespace eh::model::testing {

inline std::vector<uint8_t> lora_fuzz_base_bytes() {
    static const std::vector<float> zeros(32 * 64, 0.0f);
    GgufWriter w;
    w.set("general.architecture", GgufValue::string("llama"));
    w.add_tensor("blk.0.attn_q.weight", EH_TYPE_F32, {32, 16}, zeros.data());
    w.add_tensor("output.weight", EH_TYPE_F32, {32, 8}, zeros.data());
    w.add_tensor("blk.0.ffn_up_exps.weight", EH_TYPE_F32, {32, 8, 2}, zeros.data());
    return w.to_bytes();
}

// An adapter of rank r for blk.0.attn_q.weight and output.weight, in `type`
// (F32 or F16; r a multiple of 32 for Q8_0).
inline std::vector<uint8_t> lora_fuzz_seed_bytes(uint32_t type, uint64_t r, bool alpha) {
    static const std::vector<uint8_t> zeros(64 * 64 * 4, 0);
    GgufWriter w;
    w.set("general.architecture", GgufValue::string("llama"));
    w.set("general.type", GgufValue::string("adapter"));
    w.set("adapter.type", GgufValue::string("lora"));
    if (alpha) w.set("adapter.lora.alpha", GgufValue::f32(16.0f));
    for (auto [name, n_out] : {std::pair<const char*, uint64_t>{"blk.0.attn_q.weight", 16}, {"output.weight", 8}}) {
        w.add_tensor(std::string(name) + ".lora_a", type, {32, r}, zeros.data());
        w.add_tensor(std::string(name) + ".lora_b", type, {r, n_out}, zeros.data());
    }
    w.add_tensor("blk.0.attn_norm.weight", EH_TYPE_F32, {32}, zeros.data());
    return w.to_bytes();
}

}  // namespace eh::model::testing
