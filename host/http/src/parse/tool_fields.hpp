// The tool-calling and reasoning fields of a chat request (their types:
// eh/service/tool_request.hpp). Called by openai_request.cpp for chat
// requests, and (the shared checks) by anthropic_tools.cpp.
#pragma once

#include "eh/service/text_codec.hpp"
#include "eh/service/tool_request.hpp"
#include "parse/json_fields.hpp"

namespace eh::http {

// tools, tool_choice, parallel_tool_calls, reasoning_effort (and 400 for the
// deprecated functions/function_call).
service::ChatToolRequest parse_chat_tools(const json::object& obj);
// A message's tool_calls / reasoning_content (assistant), tool_call_id
// (tool) and name.
void parse_message_tool_fields(const json::object& message, size_t index, service::ChatMessage& cm);

// Shared field rules; each throws RequestError naming `field` and `path`.
json::object want_object(const json::element& e, std::string_view field, const std::string& path);
// o[key] as a string ("" when absent and not `required`).
std::string want_string(const json::object& o, std::string_view key, std::string_view field, const std::string& path,
                        bool required);
// A new tool's name after `tools`: 1-64 of [a-zA-Z0-9_-], not defined
// before, and at most kMaxTools tools.
void check_new_tool(const std::vector<service::ToolDef>& tools, const std::string& name, std::string_view field,
                    const std::string& path);

}  // namespace eh::http
