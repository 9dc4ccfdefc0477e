// The Anthropic Messages API request (POST /v1/messages and
// /v1/messages/count_tokens). Parsed with the same field rules as the other
// endpoints (json_fields.hpp): every broken rule is a RequestError naming the
// field. Tool use maps onto the chat request's tool fields
// (eh/service/tool_request.hpp): `tools` become function tools,
// `tool_choice` auto/any/tool/none becomes auto/required/named/none,
// assistant `tool_use` blocks become tool_calls and user `tool_result`
// blocks `tool` messages, so templates and output parsers serve both APIs
// alike. Fields this server cannot honour (images,
// documents, server tools, extended thinking, a final assistant message to
// continue) are refused, never ignored; `metadata` and other unknown fields
// are ignored.
#pragma once

#include <string_view>

#include "eh/service/request.hpp"

namespace eh::http {

// messages: the system prompt first, when there is one.
struct AnthropicRequest : service::ChatRequest {};

// `count_only` (count_tokens): max_tokens, the sampling fields and stream
// are not required and not read.
AnthropicRequest parse_anthropic_request(std::string_view body, const service::RequestLimits& limits,
                                         bool count_only = false);

}  // namespace eh::http
