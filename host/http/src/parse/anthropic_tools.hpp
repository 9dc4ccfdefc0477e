// Anthropic's `tools` and `tool_choice` as the chat request's tool fields
// (called by anthropic_request.cpp).
#pragma once

#include "eh/service/tool_request.hpp"
#include "parse/json_fields.hpp"

namespace eh::http {

// tools: [{name, description, input_schema, type "custom" or absent}] →
// function tools (tools_json in OpenAI's shape, which the chat templates
// are written for); tool_choice {type auto|any|tool|none, name,
// disable_parallel_tool_use}.
service::ChatToolRequest parse_anthropic_tools(const json::object& body);

}  // namespace eh::http
