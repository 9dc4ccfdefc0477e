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
// `cancelled` is polled while the template runs (TextCodec::render_chat).
void render_chat_prompt(const TextCodec& codec, OpenAIRequest& r, const std::string& model,
                        const std::function<bool()>& cancelled = {});

}  // namespace eh::service
