// libFuzzer target: arbitrary bytes through the Anthropic Messages API
// request parser (/v1/messages, and /v1/messages/count_tokens when the first
// byte is odd; the rest is the body). The parser may only answer with
// eh::Error (the 400 the server sends); any other exception, a crash or a
// sanitizer report is a bug. Built only with EH_ENABLE_FUZZERS=ON (clang).
//   build-fuzz/bin/fuzz_anthropic tests/http/fuzz_anthropic_seeds -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "eh/service/anthropic_request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
    eh::service::RequestLimits limits;
    limits.max_prompt_chars = 4096;  // keeps each input cheap; the rules are the same
    try {
        (void)eh::service::parse_anthropic_request(body, limits, (data[0] & 1) != 0);
    } catch (const eh::Error&) {
        // The clear, stable rejection: expected for most inputs.
    }
    return 0;
}
