// One response's output items from the model's output: the chat output
// parser's pieces (chat_output.hpp) as Responses API items — `reasoning`
// (a harmony model's analysis channel, as reasoning_text content),
// `message` (output_text content) and `function_call` — streamed as the
// API's events (output_item.added, content_part.added, output_text.delta,
// ..., output_item.done; function_call_arguments.delta/.done;
// reasoning_text.delta/.done) or returned whole. Every event carries
// `type` and a `sequence_number` counted from 0 by this object, so the
// route's lifecycle events (response.created, ...) go through event() too.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/chat_output.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::http {

class ResponsesOutput {
public:
    // `prefill`: the start of the answer already in the prompt (a forced
    // call's header on harmony models), parsed before the output.
    ResponsesOutput(service::ToolFormat format, const service::ChatParseOptions& options,
                    const std::string& prefill = "");

    // One SSE event: `event: TYPE` with `data` plus type and sequence_number.
    std::string event(const std::string& type, nlohmann::json data);

    // Streaming: the events this text completes.
    std::string events(std::string_view text);
    // The output ended: the rest, and the open item's closing events. An
    // output with no item gets an empty message. `incomplete` (cut by
    // max_output_tokens): the last item's status is "incomplete".
    std::string finish_events(bool incomplete);

    // Not streaming: collect, then output().
    void add(std::string_view text) { events(text); }
    void finish(bool incomplete) { finish_events(incomplete); }

    // The output items in the order the model wrote them.
    nlohmann::json output() const;
    // The output as one assistant turn (reasoning, text and tool calls), to
    // continue the conversation from (previous_response_id).
    service::ChatMessage message() const;
    // The reasoning text, all of it.
    std::string reasoning() const;
    // Function calls returned.
    size_t calls() const { return parser_->calls(); }

private:
    enum class Kind { Reasoning, Message, Call };
    struct Item {
        Kind kind = Kind::Message;
        std::string id;
        std::string text;  // reasoning or message text, or a call's arguments (JSON text)
        std::string call_id, name;
        std::string status = "in_progress";
    };
    // `added`: as response.output_item.added shows it, before any content.
    nlohmann::json item_json(const Item& item, bool added = false) const;
    nlohmann::json part_json(const Item& item) const;  // reasoning_text / output_text part
    std::string apply(const service::ChatPieces& pieces);
    std::string open(Item item);
    std::string close(const std::string& status = "completed");
    std::string text_delta(const std::string& piece);

    std::unique_ptr<service::ChatOutputParser> parser_;
    std::vector<Item> items_;
    bool open_ = false;  // items_.back() is open
    size_t seq_ = 0;
};

}  // namespace eh::http
