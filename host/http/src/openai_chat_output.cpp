#include "openai_chat_output.hpp"

namespace eh::http {

using service::ChatPiece;

ChatChoiceOutput::ChatChoiceOutput(service::ToolFormat format, const service::ChatParseOptions& options,
                                   const std::string& prefill)
    : parser_(service::make_chat_output_parser(format, options, prefill)) {}

std::vector<nlohmann::json> ChatChoiceOutput::to_deltas(const service::ChatPieces& pieces) {
    std::vector<nlohmann::json> out;
    for (const auto& p : pieces) {
        switch (p.kind) {
        case ChatPiece::Kind::Reasoning: out.push_back({{"reasoning_content", p.text}}); break;
        case ChatPiece::Kind::Content: out.push_back({{"content", p.text}}); break;
        case ChatPiece::Kind::CallOpen:
            out.push_back({{"tool_calls", {{{"index", p.index}, {"id", p.id}, {"type", "function"},
                                            {"function", {{"name", p.name}, {"arguments", ""}}}}}}});
            break;
        case ChatPiece::Kind::CallArgs:
            out.push_back({{"tool_calls", {{{"index", p.index}, {"function", {{"arguments", p.text}}}}}}});
            break;
        }
    }
    return out;
}

void ChatChoiceOutput::collect(const service::ChatPieces& pieces) {
    for (const auto& p : pieces) {
        switch (p.kind) {
        case ChatPiece::Kind::Reasoning: reasoning_ += p.text; break;
        case ChatPiece::Kind::Content: content_ += p.text; break;
        case ChatPiece::Kind::CallOpen: calls_.push_back({p.id, p.name, ""}); break;
        case ChatPiece::Kind::CallArgs:
            if (p.index < calls_.size()) calls_[p.index].arguments += p.text;
            break;
        }
    }
}

std::vector<nlohmann::json> ChatChoiceOutput::deltas(std::string_view text) {
    auto pieces = parser_->feed(text);
    collect(pieces);
    return to_deltas(pieces);
}

std::vector<nlohmann::json> ChatChoiceOutput::finish_deltas() {
    auto pieces = parser_->finish();
    collect(pieces);
    return to_deltas(pieces);
}

void ChatChoiceOutput::add(std::string_view text) { deltas(text); }
void ChatChoiceOutput::finish() { finish_deltas(); }

nlohmann::json ChatChoiceOutput::message() const {
    nlohmann::json m = {{"role", "assistant"}, {"content", content_}};
    if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
        if (content_.empty()) m["content"] = nullptr;
        nlohmann::json arr = nlohmann::json::array();
        for (const auto& c : calls_)
            arr.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        m["tool_calls"] = std::move(arr);
    }
    return m;
}

const char* ChatChoiceOutput::finish_reason(const std::string& stop_reason) const {
    if (stop_reason == "length") return "length";
    return parser_->calls() > 0 ? "tool_calls" : "stop";
}

}  // namespace eh::http
