// An architecture's integer hyperparameters as the CUDA engines read them
// from a model's metadata (key view.arch_key(suffix): "<arch>.<suffix>"):
// 1 .. 2^30, else MODEL_LOAD_FAILED naming the key and its value. Host
// code only (each engine's read_config).
#pragma once

#include <cstdint>
#include <string>

#include <engine_host/plugin_abi.hpp>

namespace ehcuda {

inline int metadata_int(uint64_t v, const std::string& key) {
    if (v == 0 || v > (1u << 30))
        throw ehp::Error(EH_MODEL_LOAD_FAILED, "metadata '" + key + "' out of range: " + std::to_string(v));
    return int(v);
}

// Required (require_uint's error when absent).
inline int arch_int(const ehp::ModelView& view, const char* suffix) {
    const std::string key = view.arch_key(suffix);
    return metadata_int(view.require_uint(key), key);
}

// dflt when absent.
inline int arch_int_or(const ehp::ModelView& view, const char* suffix, int dflt) {
    const std::string key = view.arch_key(suffix);
    const auto v = view.get_uint(key);
    return v ? metadata_int(*v, key) : dflt;
}

}  // namespace ehcuda
