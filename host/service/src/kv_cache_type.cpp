#include "eh/service/kv_cache_type.hpp"

#include <engine_host/tensor_types.h>

namespace eh::service {

std::optional<uint32_t> parse_kv_cache_type(std::string_view name) {
    if (name == "f16") return EH_TYPE_F16;
    if (name == "q8_0") return EH_TYPE_Q8_0;
    if (name == "fp8") return EH_TYPE_FP8_E4M3;
    return std::nullopt;
}

const char* kv_cache_type_choices() { return "f16, q8_0, fp8"; }

std::string kv_cache_type_name(uint32_t type) {
    switch (type) {
    case kKvTypeUnknown: return "unknown";
    case EH_TYPE_F32: return "f32";
    case EH_TYPE_F16: return "f16";
    case EH_TYPE_Q8_0: return "q8_0";
    case EH_TYPE_FP8_E4M3: return "fp8";
    default: break;
    }
    const eh_type_traits t = eh_tensor_type_traits(type);
    return t.name ? std::string(t.name) : "type " + std::to_string(type);
}

}  // namespace eh::service
