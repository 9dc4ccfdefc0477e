// gpt-oss's harmony format. The prompt ends with "<|start|>assistant"; the
// model then writes messages
//   [header]<|message|>[body]<|end|><|start|>assistant[header]<|message|>...
// ending with <|return|> (after a final answer) or <|call|> (after a tool
// call); both end generation, so they rarely reach the text. The header names
// the channel ("<|channel|>analysis") and, for a call, the recipient
// (" to=functions.get_weather", before or after the channel) and content
// type (" json" or " <|constrain|>json").
// Routing: analysis -> reasoning; a commentary message to functions.NAME
// (an offered function) -> a tool call (the body streams as its arguments);
// everything else (final, commentary preambles, calls of functions not
// offered) -> content. Markup never reaches content or
// reasoning. A header that never ends (output that does not follow harmony)
// is returned as content as the model wrote it.
#include "text_scan.hpp"

namespace eh::service::tool_calls {
namespace {

constexpr std::string_view kStart = "<|start|>", kChannel = "<|channel|>", kMessage = "<|message|>",
                           kEnd = "<|end|>", kCall = "<|call|>", kReturn = "<|return|>";
// A header longer than this is not one.
constexpr size_t kMaxHeader = 1024;

class HarmonyParser : public SteppedParser {
public:
    explicit HarmonyParser(const ChatParseOptions& o) : opt_(o) {}

    ChatPieces finish() override {
        ChatPieces out;
        if (state_ == State::Body) {
            body_text(out, pending_);
        } else if (state_ == State::Header && messages_ == 0 && pending_.find("<|") == std::string::npos &&
                   !trim(pending_).empty()) {
            add_text(out, ChatPiece::Kind::Content, pending_);  // not a header: text the model wrote
        }  // else a header cut off by max_tokens: markup, dropped
        pending_.clear();
        state_ = State::Between;
        return out;
    }

private:
    enum class State { Header, Body, Between };
    enum class Target { Reasoning, Content, Call, Drop };

    bool step(ChatPieces& out) override {
        switch (state_) {
        case State::Between: {
            // Whitespace between messages is dropped; anything but
            // <|start|> starts a header without it (tolerated).
            size_t ws = 0;
            while (ws < pending_.size() && is_space(pending_[ws])) ++ws;
            pending_.erase(0, ws);
            const std::string_view rest = pending_;
            if (rest.size() < kStart.size() && kStart.substr(0, rest.size()) == rest) return false;
            if (rest.substr(0, kStart.size()) == kStart) pending_.erase(0, kStart.size());
            state_ = State::Header;
            return true;
        }
        case State::Header: {
            // A header ends with a <|message|> inside its first kMaxHeader + 1
            // bytes. The rule looks only at those bytes, so a stream fed in
            // any pieces decides as the whole text does (a marker further on,
            // seen at once in the whole text, made the two disagree).
            const size_t m = pending_.find(kMessage);
            if (m == std::string::npos || m + kMessage.size() > kMaxHeader + 1) {
                if (pending_.size() > kMaxHeader) {  // not harmony: plain content from here on
                    state_ = State::Body;
                    target_ = Target::Content;
                    return true;
                }
                return false;
            }
            open_message(out, std::string_view(pending_).substr(0, m));
            ++messages_;
            pending_.erase(0, m + kMessage.size());
            state_ = State::Body;
            return true;
        }
        case State::Body: {
            size_t at = std::string::npos, len = 0;
            for (std::string_view mk : {kEnd, kCall, kReturn, kStart}) {
                const size_t p = pending_.find(mk);
                if (p < at) at = p, len = mk.size();
            }
            if (at == std::string::npos) {
                const size_t keep = partial_marker_suffix(pending_, {kEnd, kCall, kReturn, kStart});
                body_text(out, std::string_view(pending_).substr(0, pending_.size() - keep));
                pending_.erase(0, pending_.size() - keep);
                return false;
            }
            body_text(out, std::string_view(pending_).substr(0, at));
            const bool start = std::string_view(pending_).substr(at, len) == kStart;
            pending_.erase(0, at + len);
            state_ = start ? State::Header : State::Between;
            return true;
        }
        }
        return false;
    }

    static std::string_view word_after(std::string_view s, std::string_view key) {
        const size_t p = s.find(key);
        if (p == std::string_view::npos) return {};
        s.remove_prefix(p + key.size());
        while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
        size_t n = 0;
        while (n < s.size() && !is_space(s[n]) && s[n] != '<') ++n;
        return s.substr(0, n);
    }

    void open_message(ChatPieces& out, std::string_view header) {
        const std::string_view channel = word_after(header, kChannel);
        const std::string_view recipient = word_after(header, "to=");
        if (channel == "analysis") {
            target_ = Target::Reasoning;
        } else if (recipient.substr(0, 10) == "functions." && recipient.size() > 10 && opt_.tools &&
                   opt_.offered(recipient.substr(10))) {
            if (!opt_.parallel && calls_ > 0) {
                target_ = Target::Drop;  // parallel_tool_calls: false keeps the first
                return;
            }
            target_ = Target::Call;
            call_index_ = calls_++;
            open_call(out, call_index_, std::string(recipient.substr(10)));
        } else {
            target_ = Target::Content;
        }
    }

    void body_text(ChatPieces& out, std::string_view s) {
        switch (target_) {
        case Target::Reasoning: add_text(out, ChatPiece::Kind::Reasoning, s); break;
        case Target::Content: add_text(out, ChatPiece::Kind::Content, s); break;
        case Target::Call: add_text(out, ChatPiece::Kind::CallArgs, s, call_index_); break;
        case Target::Drop: break;
        }
    }

    ChatParseOptions opt_;
    State state_ = State::Header;
    Target target_ = Target::Content;
    size_t call_index_ = 0;
    size_t messages_ = 0;  // headers read
};

}  // namespace

std::unique_ptr<ChatOutputParser> make_harmony_parser(const ChatParseOptions& options) {
    return std::make_unique<HarmonyParser>(options);
}

}  // namespace eh::service::tool_calls
