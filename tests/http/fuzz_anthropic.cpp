// libFuzzer target: arbitrary bytes through the Anthropic Messages API
// request parser (/v1/messages, and /v1/messages/count_tokens when the first
// byte is odd; the rest is the body). The parser may only answer with
// eh::Error (the 400 the server sends); any other exception, a crash or a
// sanitizer report is a bug. Built only with EH_ENABLE_FUZZERS=ON (clang).
//   build-fuzz/bin/fuzz_anthropic tests/http/fuzz_anthropic_seeds -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string_view>

// An accepted request must also hold together: its messages become the
// template's message JSON, its tools_json is a JSON array of one function
// per tool, and every tool result answers a string id.
#include <nlohmann/json.hpp>

#include <cstdlib>

#include "eh/service/chat_prompt.hpp"
#include "parse/anthropic_request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
    eh::service::RequestLimits limits;
    limits.max_prompt_chars = 4096;  // keeps each input cheap; the rules are the same
    // Images are decoded (host/image) under small limits, so no input costs much.
    limits.images.max_bytes = 1 << 16;
    limits.images.max_side = 256;
    limits.images.max_pixels = 1 << 14;
    eh::http::AnthropicRequest r;
    try {
        r = eh::http::parse_anthropic_request(body, limits, (data[0] & 1) != 0);
    } catch (const eh::Error&) {
        return 0;  // the clear, stable rejection: expected for most inputs
    }
    const auto messages = nlohmann::json::parse(eh::service::template_messages_json(r.messages), nullptr, false);
    if (!messages.is_array() || messages.size() != r.messages.size()) std::abort();
    if (!r.tools.tools.empty()) {
        const auto tools = nlohmann::json::parse(r.tools.tools_json, nullptr, false);
        if (!tools.is_array() || tools.size() != r.tools.tools.size()) std::abort();
        for (size_t i = 0; i < tools.size(); ++i)
            if (tools[i]["function"]["name"] != r.tools.tools[i].name) std::abort();
    }
    for (const auto& m : r.messages)
        if (m.role == "tool" && m.tool_call_id.empty()) std::abort();
    return 0;
}
