// The Anthropic Messages API request (POST /v1/messages and
// /v1/messages/count_tokens). Parsed with the same field rules as the other
// endpoints (json_fields.hpp): every broken rule is a RequestError naming the
// field. Tool use maps onto the chat request's tool fields (tool_request.hpp):
// `tools` become function tools, `tool_choice` auto/any/tool/none becomes
// auto/required/named/none, assistant `tool_use` blocks become tool_calls
// and user `tool_result` blocks `tool` messages, so templates and output
// parsers serve both APIs alike. Fields this server cannot honour (images,
// documents, server tools, extended thinking, a final assistant message to
// continue) are refused, never ignored; `metadata` and other unknown fields
// are ignored.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "eh/service/request.hpp"

namespace eh::service {

// messages: the system prompt first, when there is one.
struct AnthropicRequest : ChatRequest {};

// `count_only` (count_tokens): max_tokens, the sampling fields and stream
// are not required and not read.
AnthropicRequest parse_anthropic_request(std::string_view body, const RequestLimits& limits, bool count_only = false);

// A tool_use id for a call the model made: "toolu_" + 24 letters and digits
// (the parser's "call_..." id with Anthropic's prefix).
std::string anthropic_tool_use_id(const std::string& call_id);

}  // namespace eh::service
