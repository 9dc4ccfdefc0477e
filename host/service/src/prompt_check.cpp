#include <fmt/format.h>

#include "eh/service/request.hpp"
#include "eh/service/utf8.hpp"

namespace eh::service {

void check_prompt(const std::string& text, std::string_view key, const RequestLimits& limits, bool allow_empty) {
    if (text.empty() && !allow_empty) throw RequestError(std::string(key), fmt::format("'{}' must not be empty", key));
    if (text.find('\0') != std::string::npos)
        throw RequestError(std::string(key), fmt::format("'{}' contains a NUL character", key));
    size_t n = utf8_length(text);
    if (limits.max_prompt_chars && n > limits.max_prompt_chars)
        throw RequestError(std::string(key), fmt::format("'{}' is {} characters; the limit is {}", key, n,
                                                         limits.max_prompt_chars));
}

}  // namespace eh::service
