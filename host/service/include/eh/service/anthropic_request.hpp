// The Anthropic Messages API request (POST /v1/messages and
// /v1/messages/count_tokens). Parsed with the same field rules as the other
// endpoints (json_fields.hpp): every broken rule is a RequestError naming the
// field. Fields this server cannot honour (tools, images, documents,
// extended thinking, a final assistant message to continue) are refused,
// never ignored; `metadata` and other unknown fields are ignored.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "eh/service/request.hpp"

namespace eh::service {

struct AnthropicRequest {
    GenerationRequest gen;           // gen.prompt is rendered later from `messages`
    std::vector<ChatMessage> messages;  // the system prompt first, when there is one
    std::string model;
    bool stream = false;
};

// `count_only` (count_tokens): max_tokens, the sampling fields and stream
// are not required and not read.
AnthropicRequest parse_anthropic_request(std::string_view body, const RequestLimits& limits, bool count_only = false);

}  // namespace eh::service
