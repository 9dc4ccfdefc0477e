// --kv-cache-type, shared by serve, chat and bench: the word on the command
// line to ABI 1.4's eh_kv_params.kv_type.
#pragma once

#include <cstdint>
#include <string>

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include "eh/error.hpp"
#include "eh/service/kv_cache_type.hpp"

namespace eh::cli {

inline constexpr const char* kKvCacheTypeHelp =
    "element type of the KV cache: f16, q8_0 (8-bit with a scale per 32 values: about half of f16's memory, so "
    "--kv-cache-size-mb holds about twice the tokens) or fp8 (E4M3 with a scale per 32 values, the same size); "
    "default: the plugin's own (f16 on the CUDA plugins, f32 on the CPU reference). A plugin that cannot store the "
    "type fails the start, naming it";

// 0 (the plugin's default) when the option is absent. Throws
// Error(InvalidRequest) for a word not in the list (exit 2).
inline uint32_t kv_cache_type_arg(const boost::program_options::variables_map& vm) {
    if (!vm.count("kv-cache-type")) return 0;
    const std::string& word = vm["kv-cache-type"].as<std::string>();
    if (auto t = service::parse_kv_cache_type(word)) return *t;
    throw Error(Code::InvalidRequest, fmt::format("--kv-cache-type must be one of {}, not '{}'",
                                                  service::kv_cache_type_choices(), word));
}

}  // namespace eh::cli
