// One Anthropic message's content from the model's output: the chat output
// parser's pieces (chat_output.hpp) as content blocks — `text`, and
// `tool_use` for each call — streamed as content_block_start / _delta /
// _stop events (text_delta, input_json_delta) or returned whole. Reasoning
// (a harmony model's analysis channel) becomes `thinking` blocks (streamed
// as thinking_delta) when the request enabled extended thinking, and is
// left out otherwise. Their `signature` is empty: this server signs nothing.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/chat_output.hpp"

namespace eh::http {

// A tool_use id for a call the model made: "toolu_" + 24 letters and digits
// (the output parser's "call_..." id with Anthropic's prefix).
std::string anthropic_tool_use_id(const std::string& call_id);

class AnthropicOutput {
public:
    // `prefill`: the start of the answer already in the prompt (a forced
    // call's header on harmony models), parsed before the output.
    AnthropicOutput(service::ToolFormat format, const service::ChatParseOptions& options, const std::string& prefill = "",
                    bool thinking = false);

    // Streaming: the SSE events this text completes. The first block's
    // content_block_start is followed by a `ping`, as Anthropic's streams are.
    std::string events(std::string_view text);
    // The output ended: the rest, and the open block's content_block_stop
    // (an empty text block first when the output had none).
    std::string finish_events();

    // Not streaming: collect, then content().
    void add(std::string_view text) { events(text); }
    void finish() { finish_events(); }
    // The content blocks: thinking {type, thinking, signature}; text {type,
    // text}; tool_use {type, id, name, input} with input the arguments as a
    // JSON object ({} when the model's arguments are not one). At least one
    // text or tool_use block (an empty text block when there is nothing).
    nlohmann::json content() const;

    // "tool_use" once a call was returned (unless max_tokens cut it), else
    // the service's reason in Anthropic's words (end_turn, max_tokens,
    // stop_sequence).
    nlohmann::json stop_reason(const std::string& service_reason) const;

private:
    std::string apply(const service::ChatPieces& pieces);
    std::string open(nlohmann::json block);
    std::string close();
    std::string input_delta(const std::string& json_piece) const;  // of the open tool_use block

    std::unique_ptr<service::ChatOutputParser> parser_;
    struct Block {
        bool tool = false;
        bool thinking = false;
        std::string text;                 // text, thinking, or a tool_use's arguments (JSON text)
        std::string id, name;
    };
    bool thinking_ = false;  // reasoning becomes thinking blocks
    std::vector<Block> blocks_;
    bool open_ = false;                   // blocks_.back() is open (streaming)
    std::vector<size_t> call_block_;      // call index -> its block
};

}  // namespace eh::http
