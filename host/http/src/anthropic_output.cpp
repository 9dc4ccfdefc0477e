#include "anthropic_output.hpp"

#include <algorithm>

#include "impl.hpp"

namespace eh::http {

using service::ChatPiece;

std::string anthropic_tool_use_id(const std::string& call_id) {
    const std::string_view body = std::string_view(call_id).substr(call_id.rfind('_') + 1);
    return "toolu_" + std::string(body);
}

AnthropicOutput::AnthropicOutput(service::ToolFormat format, const service::ChatParseOptions& options,
                                 const std::string& prefill, bool thinking)
    : parser_(service::make_chat_output_parser(format, options, prefill)), thinking_(thinking) {}

std::string AnthropicOutput::open(nlohmann::json block) {
    std::string out = close();
    const size_t index = blocks_.size() - 1;
    out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    if (index == 0) out += sse_event("ping", {{"type", "ping"}});
    open_ = true;
    return out;
}

std::string AnthropicOutput::close() {
    if (!open_) return {};
    open_ = false;
    return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", blocks_.size() - 1}});
}

std::string AnthropicOutput::input_delta(const std::string& json_piece) const {
    return sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", blocks_.size() - 1},
                                             {"delta", {{"type", "input_json_delta"}, {"partial_json", json_piece}}}});
}

std::string AnthropicOutput::apply(const service::ChatPieces& pieces) {
    std::string out;
    for (const auto& p : pieces) {
        switch (p.kind) {
        case ChatPiece::Kind::Reasoning:
            if (!thinking_) break;  // not asked for (see the header)
            if (blocks_.empty() || !blocks_.back().thinking || !open_) {
                out += close();
                blocks_.push_back({false, true, "", "", ""});
                out += open({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
            }
            blocks_.back().text += p.text;
            out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", blocks_.size() - 1},
                                                     {"delta", {{"type", "thinking_delta"}, {"thinking", p.text}}}});
            break;
        case ChatPiece::Kind::Content:
            if (p.text.empty()) break;  // (finish_events opens an empty text block if none came)
            if (blocks_.empty() || blocks_.back().tool || blocks_.back().thinking || !open_) {
                out += close();
                blocks_.push_back({});
                out += open({{"type", "text"}, {"text", ""}});
            }
            blocks_.back().text += p.text;
            out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", blocks_.size() - 1},
                                                     {"delta", {{"type", "text_delta"}, {"text", p.text}}}});
            break;
        case ChatPiece::Kind::CallOpen: {
            out += close();
            Block b{true, false, "", anthropic_tool_use_id(p.id), p.name};
            blocks_.push_back(b);
            if (call_block_.size() <= p.index) call_block_.resize(p.index + 1);
            call_block_[p.index] = blocks_.size() - 1;
            out += open({{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", nlohmann::json::object()}});
            // Anthropic's streams open a tool_use block's input with an
            // empty piece.
            out += input_delta("");
            break;
        }
        case ChatPiece::Kind::CallArgs: {
            // Fragments of a call other than the open block's cannot come
            // (parsers finish one call before the next), but stay safe.
            if (p.index >= call_block_.size() || call_block_[p.index] + 1 != blocks_.size() || !open_) break;
            blocks_.back().text += p.text;
            out += input_delta(p.text);
            break;
        }
        }
    }
    return out;
}

std::string AnthropicOutput::events(std::string_view text) { return apply(parser_->feed(text)); }

std::string AnthropicOutput::finish_events() {
    std::string out = apply(parser_->finish());
    if (std::none_of(blocks_.begin(), blocks_.end(), [](const Block& b) { return !b.thinking; })) {
        blocks_.push_back({});
        out += open({{"type", "text"}, {"text", ""}});
    }
    return out + close();
}

nlohmann::json AnthropicOutput::content() const {
    nlohmann::json out = nlohmann::json::array();
    bool answer = false;  // a text or tool_use block
    for (const auto& b : blocks_) {
        if (b.thinking) {
            out.push_back({{"type", "thinking"}, {"thinking", b.text}, {"signature", ""}});
            continue;
        }
        answer = true;
        if (!b.tool) {
            out.push_back({{"type", "text"}, {"text", b.text}});
            continue;
        }
        nlohmann::json input = nlohmann::json::parse(b.text, nullptr, false);
        if (!input.is_object()) input = nlohmann::json::object();
        out.push_back({{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", input}});
    }
    if (!answer) out.push_back({{"type", "text"}, {"text", ""}});
    return out;
}

nlohmann::json AnthropicOutput::stop_reason(const std::string& r) const {
    if (r == "length") return "max_tokens";
    if (parser_->calls() > 0) return "tool_use";
    if (r == "eos") return "end_turn";
    if (r == "stop") return "stop_sequence";
    return nullptr;
}

}  // namespace eh::http
