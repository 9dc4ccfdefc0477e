// Hermes-style calls (Qwen2.5): the model writes
//   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
// one block per call, possibly after some text. A block is returned as a
// call once its closing tag arrives and its JSON holds a string "name" (and
// "arguments", an object or a JSON string) naming an offered function;
// anything else, an unclosed block included, is returned as content exactly
// as the model wrote it.
#include <nlohmann/json.hpp>

#include "text_scan.hpp"

namespace eh::service::tool_calls {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

class HermesParser : public ChatOutputParser {
public:
    explicit HermesParser(const ChatParseOptions& o) : opt_(o) {}

    ChatPieces feed(std::string_view text) override {
        pending_.append(text);
        ChatPieces out;
        for (;;) {
            if (!in_call_) {
                const size_t open = pending_.find(kOpen);
                if (open == std::string::npos) {
                    // Hold back what may still become "<tool_call>", and
                    // trailing whitespace (dropped if a call follows).
                    size_t keep = partial_marker_suffix(pending_, {kOpen});
                    size_t end = pending_.size() - keep;
                    while (end > 0 && is_space(pending_[end - 1])) --end;
                    emit_content(out, std::string_view(pending_).substr(0, end));
                    pending_.erase(0, end);
                    return out;
                }
                // Whitespace before a call is dropped with it, kept if the
                // block turns out not to be one.
                const std::string_view before = std::string_view(pending_).substr(0, open);
                const std::string_view text = trim_end(before);
                emit_content(out, text);
                ws_before_ = std::string(before.substr(text.size()));
                pending_.erase(0, open + kOpen.size());
                in_call_ = true;
            }
            // Search only the new text (and a marker's length before it), so
            // a long block streamed in small pieces costs linear time.
            const size_t close = pending_.find(kClose, scanned_);
            if (close == std::string::npos) {
                scanned_ = pending_.size() >= kClose.size() ? pending_.size() - kClose.size() + 1 : 0;
                return out;
            }
            scanned_ = 0;
            finish_block(out, std::string_view(pending_).substr(0, close));
            pending_.erase(0, close + kClose.size());
            in_call_ = false;
        }
    }

    ChatPieces finish() override {
        ChatPieces out;
        if (in_call_) {
            emit_raw(out, ws_before_ + std::string(kOpen) + pending_);  // never closed: not a call
        } else if (calls_ == 0 || !trim(pending_).empty()) {
            emit_content(out, pending_);
        }
        pending_.clear();
        in_call_ = false;
        return out;
    }

private:
    static std::string_view trim_end(std::string_view s) {
        while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
        return s;
    }

    // Content after a call starts without the whitespace between blocks.
    void emit_content(ChatPieces& out, std::string_view s) {
        if (calls_ > 0 && !started_after_call_) {
            while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
            if (s.empty()) return;
            started_after_call_ = true;
        }
        add_text(out, ChatPiece::Kind::Content, s);
    }
    void emit_raw(ChatPieces& out, std::string_view s) { add_text(out, ChatPiece::Kind::Content, s); }

    void finish_block(ChatPieces& out, std::string_view body) {
        using json = nlohmann::ordered_json;
        json j = json::parse(trim(body), nullptr, false);
        const json* name = nullptr;
        const json* args = nullptr;
        if (j.is_object()) {
            auto n = j.find("name");
            if (n != j.end() && n->is_string() && !n->get_ref<const std::string&>().empty()) name = &*n;
            auto a = j.find("arguments");
            if (a == j.end()) a = j.find("parameters");  // some fine-tunes write this key
            if (a != j.end()) args = &*a;
        }
        if (!name || (args && !args->is_object() && !args->is_string()) ||
            !opt_.offered(name->get_ref<const std::string&>())) {
            emit_raw(out, ws_before_ + std::string(kOpen) + std::string(body) + std::string(kClose));
            return;
        }
        if (!opt_.parallel && calls_ > 0) return;  // parallel_tool_calls: false keeps the first
        std::string arg_text = !args ? "{}"
                               : args->is_string() ? args->get<std::string>()
                                                   : args->dump(-1, ' ', false, json::error_handler_t::replace);
        open_call(out, calls_, name->get<std::string>());
        add_text(out, ChatPiece::Kind::CallArgs, arg_text, calls_);
        ++calls_;
        started_after_call_ = false;
    }

    ChatParseOptions opt_;
    std::string pending_;
    bool in_call_ = false;
    bool started_after_call_ = false;
    std::string ws_before_;  // whitespace between the text and an open block
    size_t scanned_ = 0;     // in a block: where the search for its end resumes
};

}  // namespace

std::unique_ptr<ChatOutputParser> make_hermes_parser(const ChatParseOptions& options) {
    return std::make_unique<HermesParser>(options);
}

}  // namespace eh::service::tool_calls
