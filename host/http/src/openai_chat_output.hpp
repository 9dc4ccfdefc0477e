// One chat choice's output in OpenAI's shapes: the parser's pieces as
// streamed `delta`s (reasoning_content, content, tool_calls fragments), and
// the whole `message` with its finish_reason when not streaming.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/chat_output.hpp"

namespace eh::http {

class ChatChoiceOutput {
public:
    // `prefill`: the start of the answer that is already in the prompt (a
    // forced call's header on harmony models), parsed before the output.
    ChatChoiceOutput(service::ToolFormat format, const service::ChatParseOptions& options,
                     const std::string& prefill = "");

    // Streaming: the deltas this text completes (one per piece; the first
    // delta of a tool call carries id, type, name and empty arguments, later
    // ones argument fragments, all with the call's index).
    std::vector<nlohmann::json> deltas(std::string_view text);
    std::vector<nlohmann::json> finish_deltas();

    // Not streaming: collect, then message().
    void add(std::string_view text);
    void finish();
    // {"role":"assistant","content":...,"reasoning_content"?,"tool_calls"?};
    // content is null when the answer is only tool calls.
    nlohmann::json message() const;

    // "tool_calls" once a call was returned (unless cut by max_tokens),
    // else "length" or "stop".
    const char* finish_reason(const std::string& stop_reason) const;

private:
    static std::vector<nlohmann::json> to_deltas(const service::ChatPieces& pieces);
    void collect(const service::ChatPieces& pieces);

    std::unique_ptr<service::ChatOutputParser> parser_;
    std::string content_, reasoning_;
    struct Call {
        std::string id, name, arguments;
    };
    std::vector<Call> calls_;
};

}  // namespace eh::http
