// The parser factory, the pass-through parser, call ids and the template
// sniffing that picks a format.
#include "eh/service/chat_output.hpp"

#include <random>

#include "text_scan.hpp"

namespace eh::service {

namespace tool_calls {
std::unique_ptr<ChatOutputParser> make_hermes_parser(const ChatParseOptions& options);
std::unique_ptr<ChatOutputParser> make_harmony_parser(const ChatParseOptions& options);
}  // namespace tool_calls

namespace {

// Text is content, as it comes.
class PlainParser : public ChatOutputParser {
public:
    ChatPieces feed(std::string_view text) override {
        ChatPieces out;
        tool_calls::add_text(out, ChatPiece::Kind::Content, text);
        return out;
    }
    ChatPieces finish() override { return {}; }
};

// A parser that has read the answer's prefilled start: its pieces go out
// with the first output.
class PrefilledParser : public ChatOutputParser {
public:
    PrefilledParser(std::unique_ptr<ChatOutputParser> inner, std::string_view prefill)
        : inner_(std::move(inner)), held_(inner_->feed(prefill)) {
        calls_ = inner_->calls();
    }
    ChatPieces feed(std::string_view text) override { return with_held(inner_->feed(text)); }
    ChatPieces finish() override { return with_held(inner_->finish()); }

private:
    ChatPieces with_held(ChatPieces pieces) {
        calls_ = inner_->calls();
        if (held_.empty()) return pieces;
        ChatPieces out = std::move(held_);
        held_.clear();
        for (auto& p : pieces) out.push_back(std::move(p));
        return out;
    }
    std::unique_ptr<ChatOutputParser> inner_;
    ChatPieces held_;
};

std::unique_ptr<ChatOutputParser> make_parser(ToolFormat format, const ChatParseOptions& options) {
    switch (format) {
    case ToolFormat::Hermes:
        if (options.tools) return tool_calls::make_hermes_parser(options);
        break;
    case ToolFormat::Harmony:
        // Always: the channels separate reasoning from content even without tools.
        return tool_calls::make_harmony_parser(options);
    case ToolFormat::None:
        break;
    }
    return std::make_unique<PlainParser>();
}

}  // namespace

std::unique_ptr<ChatOutputParser> make_chat_output_parser(ToolFormat format, const ChatParseOptions& options,
                                                          const std::string& prefill) {
    auto parser = make_parser(format, options);
    if (prefill.empty()) return parser;
    return std::make_unique<PrefilledParser>(std::move(parser), prefill);
}

std::string new_tool_call_id() {
    static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[rng() % (sizeof kAlphabet - 1)]);
    return id;
}

ToolFormat tool_format_of_template(std::string_view src) {
    // What the template itself writes for a call in the history is what the
    // model was trained to produce.
    if (src.find("<|channel|>") != std::string_view::npos && src.find("to=") != std::string_view::npos &&
        src.find("<|call|>") != std::string_view::npos)
        return ToolFormat::Harmony;
    if (src.find("<tool_call>") != std::string_view::npos && src.find("</tool_call>") != std::string_view::npos)
        return ToolFormat::Hermes;
    return ToolFormat::None;
}

const char* tool_format_name(ToolFormat f) {
    switch (f) {
    case ToolFormat::Hermes: return "hermes";
    case ToolFormat::Harmony: return "harmony";
    case ToolFormat::None: break;
    }
    return "none";
}

}  // namespace eh::service
