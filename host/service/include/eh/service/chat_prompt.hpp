// Chat templating, in one place: a chat request's messages, tools and
// reasoning effort become its prompt here. render_chat_prompt checks the
// model can express them, has the codec render them (TextCodec::render_chat;
// a tokenizer-backed codec does that with compose_chat_prompt, giving only
// the evaluation of the model's template), checks the result against the
// prompt rules, and for a forced tool call constrains the output. host/http
// only parses requests and supplies the cancel hook.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/request.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::service {

// Sets r.gen.prompt and r.gen.literal (and r.gen.control_text for harmony
// models), then checks the prompt's rules (check_prompt, field "messages").
// Throws ChatTemplateUnusable when the model's template was rejected at
// load, RequestError when tools or tool history are sent to a model whose
// template has no tool format (`model` names it in the message), and
// whatever the template raises (InvalidRequest). With tool_choice
// "required" or a named function it also calls constrain_tool_call.
// `cancelled` is polled while the template runs (TextCodec::render_chat).
void render_chat_prompt(const TextCodec& codec, ChatRequest& r, const std::string& model,
                        const RequestLimits& limits, const std::function<bool()>& cancelled = {});

// For tool_choice "required" / a named function: sets r.gen.constraint so
// the output is the call(s) in `format` (on harmony models it also appends
// the call's header, or with several tools its start, to r.gen.prompt and
// records it in r.tools.prefill; `codec` tells whether the rest of the
// header is control tokens). Throws RequestError for a tool schema the
// constraint compiler refuses (naming `tools`).
void constrain_tool_call(ChatRequest& r, ToolFormat format, const TextCodec& codec);

// The messages as the JSON array transformers' apply_chat_template gets
// them: tool_calls as [{id, type:"function", function:{name, arguments}}]
// with arguments parsed into a JSON value (templates write it with
// |tojson), `thinking` for reasoning, tool_call_id on tool messages. Keys a
// message does not use are left out (templates test `"tool_calls" in m`).
std::string template_messages_json(const std::vector<ChatMessage>& messages);

// A plain role-prefixed transcript; the fallback for models without a chat
// template.
std::string render_plain_chat(const std::vector<ChatMessage>& messages);

// ChatLiterals keeps a chat's message text literal through its template
// (issue 26 item 12): "</s>" in a user's message must reach the model as
// four characters, as it does on /execute, while the template's own
// "<|im_start|>" becomes the control token. The template is a program over
// the messages (it may trim, slice or repeat them), so the spans of its
// output that came from a message cannot be known from outside; instead, before rendering, every
// control-token text in a message is replaced by a marker (U+E000, the
// text's index, U+E001: private-use characters, untouched by case changes
// and trimming), and after rendering each marker is put back and its span
// recorded. Message text without control-token text is not changed at all.
// A message's own U+E000 is marked the same way, so it cannot forge one.
class ChatLiterals {
public:
    // `specials`: the texts the tokenizer turns into control tokens.
    explicit ChatLiterals(std::vector<std::string> specials);

    // A message's text with every control-token text replaced by its marker.
    std::string mark(std::string_view content) const;
    // The rendered prompt with the markers put back, and their spans.
    ChatPrompt unmark(std::string_view rendered) const;
    // Every message marked.
    std::vector<ChatMessage> mark(const std::vector<ChatMessage>& messages) const;

private:
    std::vector<std::string> texts_;  // [0] is U+E000 itself; longest first after it
    std::array<std::vector<size_t>, 256> by_first_;  // indexes into texts_, by first byte
};

// Where a message's image sits in a rendered chat: U+E000, 'i', U+E001.
// ChatLiterals::mark writes it at each of a message's image_at offsets;
// a message's own U+E000 is marked (a literal span), so only one whose
// U+E000 lies outside the prompt's literal spans is an image.
inline constexpr std::string_view kImageMarker = "\xEE\x80\x80i\xEE\x80\x81";

// The template's evaluation: the messages as JSON (template_messages_json)
// in, the rendered text out.
using ApplyTemplate = std::function<std::string(const std::string& messages_json)>;

// A chat prompt from its messages: their control-token text marked
// (`literals`), rendered by `apply` (or, when it is empty, as the plain
// transcript), the marks put back as literal spans, and `bos` written first
// unless the template already wrote it ("" for models without BOS).
ChatPrompt compose_chat_prompt(const std::vector<ChatMessage>& messages, const ChatLiterals& literals,
                               const ApplyTemplate& apply, const std::string& bos);

}  // namespace eh::service
