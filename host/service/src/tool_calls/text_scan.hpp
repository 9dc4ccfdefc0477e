// Helpers the output parsers share for scanning streamed text.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

#include "eh/service/chat_output.hpp"

namespace eh::service::tool_calls {

// Length of the longest suffix of `s` that is a proper prefix of one of
// `markers`: text that may still turn into a marker and must be held back.
inline size_t partial_marker_suffix(std::string_view s, std::initializer_list<std::string_view> markers) {
    size_t best = 0;
    for (std::string_view m : markers)
        for (size_t n = std::min(s.size(), m.size() - 1); n > best; --n)
            if (s.substr(s.size() - n) == m.substr(0, n)) {
                best = n;
                break;
            }
    return best;
}

// Appends text to the last piece when it is of the same kind, so a stream
// sends one chunk per kind change rather than one per fragment.
inline void add_text(ChatPieces& out, ChatPiece::Kind kind, std::string_view text, size_t index = 0) {
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == kind && out.back().index == index &&
        (kind == ChatPiece::Kind::Content || kind == ChatPiece::Kind::Reasoning || kind == ChatPiece::Kind::CallArgs)) {
        out.back().text.append(text);
        return;
    }
    ChatPiece p;
    p.kind = kind;
    p.text = std::string(text);
    p.index = index;
    out.push_back(std::move(p));
}

inline void open_call(ChatPieces& out, size_t index, std::string name) {
    ChatPiece p;
    p.kind = ChatPiece::Kind::CallOpen;
    p.index = index;
    p.id = new_tool_call_id();
    p.name = std::move(name);
    out.push_back(std::move(p));
}

inline bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

inline std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// A parser that works through the text it holds back one transition at a
// time: feed() appends the text and steps until a step needs more.
class SteppedParser : public ChatOutputParser {
public:
    ChatPieces feed(std::string_view text) final {
        pending_.append(text);
        ChatPieces out;
        while (step(out)) {
        }
        return out;
    }

protected:
    // One transition over pending_; false when more text is needed.
    virtual bool step(ChatPieces& out) = 0;
    std::string pending_;
};

}  // namespace eh::service::tool_calls
