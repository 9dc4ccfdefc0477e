// libFuzzer target: arbitrary bytes through the Responses API request parser
// (POST /v1/responses). The parser may only answer with eh::Error (the 400
// the server sends); any other exception, a crash or a sanitizer report is a
// bug. An accepted request must also hold together: its input items become
// the template's message JSON, its tools_json is a JSON array of one
// function per tool, every tool result and call names its call id, and the
// echoed settings form a JSON object. Built only with EH_ENABLE_FUZZERS=ON
// (clang).
//   build-fuzz/bin/fuzz_responses tests/http/fuzz_responses_seeds -max_total_time=60
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "eh/service/chat_prompt.hpp"
#include "parse/responses_request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view body(reinterpret_cast<const char*>(data), size);
    eh::service::RequestLimits limits;
    limits.max_prompt_chars = 4096;  // keeps each input cheap; the rules are the same
    eh::http::ResponsesRequest r;
    try {
        r = eh::http::parse_responses_request(body, limits);
    } catch (const eh::Error&) {
        return 0;  // the clear, stable rejection: expected for most inputs
    }
    if (r.input.empty() || r.input.size() > limits.max_messages * eh::service::kMaxToolCallsPerMessage) std::abort();
    const auto messages = nlohmann::json::parse(eh::service::template_messages_json(r.input), nullptr, false);
    if (!messages.is_array() || messages.size() != r.input.size()) std::abort();
    if (!r.tools.tools.empty()) {
        const auto tools = nlohmann::json::parse(r.tools.tools_json, nullptr, false);
        if (!tools.is_array() || tools.size() != r.tools.tools.size()) std::abort();
        for (size_t i = 0; i < tools.size(); ++i)
            if (tools[i]["function"]["name"] != r.tools.tools[i].name) std::abort();
    }
    for (const auto& m : r.input) {
        if (m.role == "tool" && m.tool_call_id.empty()) std::abort();
        for (const auto& c : m.tool_calls)
            if (c.id.empty() || c.name.empty() || m.role != "assistant") std::abort();
    }
    if (!r.echo.is_object() || r.echo.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).empty()) std::abort();
    if (r.gen.job_id.rfind("resp_", 0) != 0) std::abort();
    return 0;
}
