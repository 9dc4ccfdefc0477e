// Called by openai_request.cpp for chat requests.
#pragma once

#include "../json_fields.hpp"
#include "eh/service/text_codec.hpp"
#include "eh/service/tool_request.hpp"

namespace eh::service {

// tools, tool_choice, parallel_tool_calls, reasoning_effort (and 400 for the
// deprecated functions/function_call).
ChatToolRequest parse_chat_tools(const json::object& obj);
// A message's tool_calls / reasoning_content (assistant), tool_call_id
// (tool) and name.
void parse_message_tool_fields(const json::object& message, size_t index, ChatMessage& cm);

}  // namespace eh::service
