// A chat model's output text split into what an API returns: reasoning
// (gpt-oss's analysis channel), content, and tool calls, incrementally so a
// stream can send each piece as it completes. One parser per choice; the
// OpenAI handler (and an Anthropic one) turn the pieces into their wire
// shapes. Parsers never throw on model output: whatever does not form a
// call is returned as content.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/text_codec.hpp"

namespace eh::service {

struct ChatPiece {
    enum class Kind {
        Reasoning,  // text of the model's reasoning
        Content,    // text for the user
        CallOpen,   // a tool call starts: index, id, name (arguments follow)
        CallArgs,   // a fragment of the arguments (JSON text) of call `index`
    };
    Kind kind = Kind::Content;
    std::string text;    // Reasoning/Content text, CallArgs fragment
    size_t index = 0;    // CallOpen/CallArgs: 0-based call number in this choice
    std::string id;      // CallOpen: "call_" + 24 letters and digits
    std::string name;    // CallOpen: the function's name
};
using ChatPieces = std::vector<ChatPiece>;

struct ChatParseOptions {
    bool tools = false;     // tools were offered (and tool_choice is not "none"): parse calls
    bool parallel = true;   // parallel_tool_calls; false keeps only the first call
    // The offered functions: a call naming another is not a call (returned
    // as content). Empty: any name.
    std::vector<std::string> names;
    bool offered(std::string_view name) const {
        if (names.empty()) return true;
        for (const auto& n : names)
            if (n == name) return true;
        return false;
    }
};

class ChatOutputParser {
public:
    virtual ~ChatOutputParser() = default;
    // More output text; returns the pieces it completes (text that might
    // still open a call or a channel is held back until it is known).
    virtual ChatPieces feed(std::string_view text) = 0;
    // The output ended: everything still held back.
    virtual ChatPieces finish() = 0;
    // Tool calls returned so far.
    size_t calls() const { return calls_; }

protected:
    size_t calls_ = 0;
};

// Harmony: control tokens must reach the parser as text
// (TextCodec::decode_with_control). `prefill`: the start of the answer that
// is already in the prompt (a forced call's header on harmony models,
// ChatToolRequest::prefill), parsed before the output; its pieces come
// with the first feed() or finish().
std::unique_ptr<ChatOutputParser> make_chat_output_parser(ToolFormat format, const ChatParseOptions& options,
                                                          const std::string& prefill = "");

// "call_" followed by 24 random letters and digits, as OpenAI's ids look.
std::string new_tool_call_id();

// The format a chat template writes tool calls in, from its source text.
ToolFormat tool_format_of_template(std::string_view template_source);
const char* tool_format_name(ToolFormat f);

}  // namespace eh::service
