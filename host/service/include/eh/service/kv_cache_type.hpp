// The KV cache element types a user can ask for (--kv-cache-type) and their
// names in /health: the CLI's words for ABI 1.4's eh_kv_params.kv_type ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace eh::service {

// eh_kv_info.kv_type when the plugin predates it (or runs sessions only):
// the host cannot say what the cache holds.
inline constexpr uint32_t kKvTypeUnknown = UINT32_MAX;

// "f16" -> EH_TYPE_F16, "q8_0" -> EH_TYPE_Q8_0, "fp8" -> EH_TYPE_FP8_E4M3;
// nullopt for anything else (case matters).
std::optional<uint32_t> parse_kv_cache_type(std::string_view name);
// The accepted words for messages: "f16, q8_0, fp8".
const char* kv_cache_type_choices();
// What /health and messages call a granted type: "f16", "q8_0", "fp8",
// "f32", else the eh_tensor_type name ("type N" for an undefined id);
// "unknown" for kKvTypeUnknown.
std::string kv_cache_type_name(uint32_t type);

}  // namespace eh::service
