// The Anthropic Messages API request (POST /v1/messages and
// /v1/messages/count_tokens). Parsed with the same field rules as the other
// endpoints (json_fields.hpp): every broken rule is a RequestError naming the
// field. Tool use maps onto the chat request's tool fields
// (eh/service/tool_request.hpp): `tools` become function tools,
// `tool_choice` auto/any/tool/none becomes auto/required/named/none,
// assistant `tool_use` blocks become tool_calls and user `tool_result`
// blocks `tool` messages, so templates and output parsers serve both APIs
// alike. Extended thinking (`thinking: {type: "enabled", budget_tokens}`)
// returns a reasoning model's reasoning as `thinking` blocks, the budget
// picking its reasoning effort (reasoning_effort_for_budget; the budget is
// not a hard cap); assistant `thinking` blocks in the history are its
// earlier reasoning, `redacted_thinking` blocks are left out. Fields this
// server cannot honour (images, documents, server tools, a final assistant
// message to continue) are refused, never ignored; `metadata` and other
// unknown fields are ignored.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "eh/service/request.hpp"

namespace eh::http {

// messages: the system prompt first, when there is one.
struct AnthropicRequest : service::ChatRequest {
    bool thinking = false;  // return the reasoning as thinking blocks
};

// Anthropic's smallest thinking budget.
constexpr int64_t kMinThinkingBudget = 1024;
// The reasoning effort a thinking budget asks for: under 4,096 tokens low,
// under 16,384 medium, else high (gpt-oss's template's three levels).
std::string reasoning_effort_for_budget(int64_t budget_tokens);

// `count_only` (count_tokens): max_tokens, the sampling fields and stream
// are not required and not read.
AnthropicRequest parse_anthropic_request(std::string_view body, const service::RequestLimits& limits,
                                         bool count_only = false);

}  // namespace eh::http
