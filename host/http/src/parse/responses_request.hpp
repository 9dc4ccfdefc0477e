// The OpenAI Responses API request (POST /v1/responses), parsed with the
// same field rules as the other endpoints (json_fields.hpp): every broken
// rule is a RequestError naming the field. `input` (a string, or input
// items) becomes chat messages the model's template renders, as the chat
// route's `messages` do: message items with text parts become messages,
// `function_call` items an assistant's tool_calls, `function_call_output`
// items `tool` messages, and `reasoning` items the reasoning of the
// assistant turn that follows them. Function `tools`, `tool_choice`,
// `parallel_tool_calls` and `reasoning.effort` become the chat request's
// tool fields (eh/service/tool_request.hpp); `text.format` becomes the output
// constraint response_format would. What this server cannot honour
// (built-in tools, images and files, background runs, conversations,
// truncation "auto", ...) is refused naming the field, never ignored.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/request.hpp"

namespace eh::http {

// previous_response_id: at most this many bytes, of [A-Za-z0-9_-].
constexpr size_t kMaxResponseIdBytes = 128;

struct ResponsesRequest : service::ChatRequest {
    // `messages` is left empty: the route composes it from the instructions,
    // the stored conversation of previous_response_id and `input`.
    std::string instructions;                 // "" when absent
    std::vector<service::ChatMessage> input;  // this request's turn(s), never empty
    std::string previous_response_id;         // "" when absent
    bool store = true;
    // The request's settings as the response object echoes them:
    // instructions, max_output_tokens, metadata, parallel_tool_calls,
    // previous_response_id, reasoning, store, temperature, text,
    // tool_choice, tools, top_p, truncation (defaults filled in).
    nlohmann::json echo;
};

// A new response id: "resp_" and 32 hex digits (128 random bits).
std::string new_response_id();

ResponsesRequest parse_responses_request(std::string_view body, const service::RequestLimits& limits);

}  // namespace eh::http
