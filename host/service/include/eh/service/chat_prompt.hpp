// A chat request's prompt: its messages, tools and reasoning effort rendered
// through the model's chat template, after checking the model can express
// them.
#pragma once

#include <functional>
#include <string>

#include "eh/service/request.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::service {

// Sets r.gen.prompt and r.gen.literal (and r.gen.control_text for harmony
// models). Throws
// RequestError when tools or tool history are sent to a model whose template
// has no tool format (`model` names it in the message), and whatever the
// template raises (InvalidRequest).
// With tool_choice "required" or a named function it also calls
// constrain_tool_call. `cancelled` is polled while the template runs
// (TextCodec::render_chat).
void render_chat_prompt(const TextCodec& codec, ChatRequest& r, const std::string& model,
                        const std::function<bool()>& cancelled = {});

// For tool_choice "required" / a named function: sets r.gen.constraint so
// the output is the call(s) in `format` (on harmony models it also appends
// the call's header, or with several tools its start, to r.gen.prompt and
// records it in r.tools.prefill; `codec` tells whether the rest of the
// header is control tokens). Throws RequestError for a tool schema the
// constraint compiler refuses (naming `tools`).
void constrain_tool_call(ChatRequest& r, ToolFormat format, const TextCodec& codec);

}  // namespace eh::service
