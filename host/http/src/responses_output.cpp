#include "responses_output.hpp"

#include <fmt/format.h>

#include <random>

#include "impl.hpp"

namespace eh::http {

using service::ChatPiece;

namespace {

std::string item_id(const char* prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    return fmt::format("{}_{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

}  // namespace

ResponsesOutput::ResponsesOutput(service::ToolFormat format, const service::ChatParseOptions& options,
                                 const std::string& prefill)
    : parser_(service::make_chat_output_parser(format, options, prefill)) {}

std::string ResponsesOutput::event(const std::string& type, nlohmann::json data) {
    data["type"] = type;
    data["sequence_number"] = seq_++;
    return sse_event(type, data);
}

nlohmann::json ResponsesOutput::part_json(const Item& it) const {
    if (it.kind == Kind::Reasoning) return {{"type", "reasoning_text"}, {"text", it.text}};
    return {{"type", "output_text"}, {"text", it.text}, {"annotations", nlohmann::json::array()}};
}

nlohmann::json ResponsesOutput::item_json(const Item& it, bool added) const {
    switch (it.kind) {
    case Kind::Reasoning: {
        nlohmann::json content = nlohmann::json::array();
        if (!added) content.push_back(part_json(it));
        return {{"id", it.id}, {"type", "reasoning"}, {"summary", nlohmann::json::array()}, {"content", content},
                {"status", it.status}};
    }
    case Kind::Message: {
        nlohmann::json content = nlohmann::json::array();
        if (!added) content.push_back(part_json(it));
        return {{"id", it.id}, {"type", "message"}, {"status", it.status}, {"role", "assistant"}, {"content", content}};
    }
    case Kind::Call:
        return {{"id", it.id}, {"type", "function_call"}, {"status", it.status}, {"call_id", it.call_id},
                {"name", it.name}, {"arguments", added ? "" : it.text}};
    }
    return {};
}

std::string ResponsesOutput::open(Item it) {
    std::string out = close();
    items_.push_back(std::move(it));
    open_ = true;
    const size_t index = items_.size() - 1;
    const Item& item = items_.back();
    out += event("response.output_item.added", {{"output_index", index}, {"item", item_json(item, true)}});
    if (item.kind != Kind::Call) {
        Item empty = item;
        empty.text.clear();
        out += event("response.content_part.added", {{"item_id", item.id}, {"output_index", index},
                                                     {"content_index", 0}, {"part", part_json(empty)}});
    }
    return out;
}

std::string ResponsesOutput::close(const std::string& status) {
    if (!open_) return {};
    open_ = false;
    Item& it = items_.back();
    const size_t index = items_.size() - 1;
    std::string out;
    if (it.kind == Kind::Call) {
        out += event("response.function_call_arguments.done",
                     {{"item_id", it.id}, {"output_index", index}, {"name", it.name}, {"arguments", it.text}});
    } else {
        const char* done = it.kind == Kind::Reasoning ? "response.reasoning_text.done" : "response.output_text.done";
        out += event(done, {{"item_id", it.id}, {"output_index", index}, {"content_index", 0}, {"text", it.text}});
        out += event("response.content_part.done", {{"item_id", it.id}, {"output_index", index}, {"content_index", 0},
                                                    {"part", part_json(it)}});
    }
    it.status = status;
    out += event("response.output_item.done", {{"output_index", index}, {"item", item_json(it)}});
    return out;
}

std::string ResponsesOutput::text_delta(const std::string& piece) {
    Item& it = items_.back();
    it.text += piece;
    const char* type = it.kind == Kind::Reasoning ? "response.reasoning_text.delta" : "response.output_text.delta";
    nlohmann::json data = {{"item_id", it.id}, {"output_index", items_.size() - 1}, {"content_index", 0},
                           {"delta", piece}};
    if (it.kind == Kind::Message) data["logprobs"] = nlohmann::json::array();
    return event(type, std::move(data));
}

std::string ResponsesOutput::apply(const service::ChatPieces& pieces) {
    std::string out;
    for (const auto& p : pieces) {
        switch (p.kind) {
        case ChatPiece::Kind::Reasoning:
        case ChatPiece::Kind::Content: {
            if (p.text.empty()) break;
            const Kind kind = p.kind == ChatPiece::Kind::Reasoning ? Kind::Reasoning : Kind::Message;
            if (!open_ || items_.back().kind != kind) {
                Item it;
                it.kind = kind;
                it.id = item_id(kind == Kind::Reasoning ? "rs" : "msg");
                out += open(std::move(it));
            }
            out += text_delta(p.text);
            break;
        }
        case ChatPiece::Kind::CallOpen: {
            Item it;
            it.kind = Kind::Call;
            // The call's id is "call_" + 24 letters and digits; its item's
            // id shares the body.
            it.id = "fc_" + p.id.substr(p.id.rfind('_') + 1);
            it.call_id = p.id;
            it.name = p.name;
            out += open(std::move(it));
            break;
        }
        case ChatPiece::Kind::CallArgs: {
            // Parsers finish one call before the next; a fragment of another
            // cannot come, but stay safe.
            if (!open_ || items_.back().kind != Kind::Call || p.text.empty()) break;
            items_.back().text += p.text;
            out += event("response.function_call_arguments.delta",
                         {{"item_id", items_.back().id}, {"output_index", items_.size() - 1}, {"delta", p.text}});
            break;
        }
        }
    }
    return out;
}

std::string ResponsesOutput::events(std::string_view text) { return apply(parser_->feed(text)); }

std::string ResponsesOutput::finish_events(bool incomplete) {
    std::string out = apply(parser_->finish());
    if (items_.empty()) {
        Item it;
        it.id = item_id("msg");
        out += open(std::move(it));
    }
    return out + close(incomplete ? "incomplete" : "completed");
}

nlohmann::json ResponsesOutput::output() const {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& it : items_) out.push_back(item_json(it));
    return out;
}

service::ChatMessage ResponsesOutput::message() const {
    service::ChatMessage m;
    m.role = "assistant";
    for (const auto& it : items_) {
        if (it.kind == Kind::Reasoning) m.reasoning += it.text;
        else if (it.kind == Kind::Message) m.content += it.text;
        else m.tool_calls.push_back({it.call_id, it.name, it.text});
    }
    return m;
}

std::string ResponsesOutput::reasoning() const {
    std::string out;
    for (const auto& it : items_)
        if (it.kind == Kind::Reasoning) out += it.text;
    return out;
}

}  // namespace eh::http
