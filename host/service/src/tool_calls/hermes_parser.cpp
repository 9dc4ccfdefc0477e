// Hermes-style calls (Qwen2.5): the model writes
//   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
// one block per call, possibly after some text.
// A block that starts the usual way — {"name": "<an offered function>",
// "arguments": { (whitespace anywhere between; "parameters" is read as
// "arguments") — is a call from there: its arguments stream as the model
// writes them, without the whitespace outside strings, up to the brace that
// closes the object; what follows up to </tool_call> (the outer brace) is
// dropped. Any other block waits for its </tool_call>: if its JSON then
// holds a string "name" of an offered function (and "arguments", an object
// or a JSON string, in any order) it is a call, returned whole; if not, an
// unclosed block included, it is content exactly as the model wrote it.
// </tool_call> ends a block wherever it appears.
#include <nlohmann/json.hpp>

#include "eh/service/tool_request.hpp"
#include "text_scan.hpp"

namespace eh::service::tool_calls {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
// A block's start is read from its first kMaxHead bytes only, so a stream
// fed in any pieces decides as the whole text does, in bounded time.
constexpr size_t kMaxHead = 1024;

// Reads the start of a block's body: {"name": "NAME", "arguments": {
struct Head {
    enum class Result { NeedMore, NoMatch, Match };
    Result result = Result::NeedMore;
    std::string name;
    size_t args_at = 0;  // Match: where the arguments' '{' is
};

Head read_head(std::string_view whole) {
    using R = Head::Result;
    const std::string_view s = whole.substr(0, kMaxHead);
    const R more = whole.size() > kMaxHead ? R::NoMatch : R::NeedMore;  // past the bound: not the usual start
    Head h;
    size_t i = 0;
    auto ws = [&] {
        while (i < s.size() && is_space(s[i])) ++i;
    };
    // Matches one of `words` at i: NeedMore while s ends inside one.
    auto word = [&](std::initializer_list<std::string_view> words) -> R {
        for (std::string_view w : words) {
            const std::string_view rest = s.substr(i, w.size());
            if (rest == w) {
                i += w.size();
                return R::Match;
            }
            if (rest.size() < w.size() && w.substr(0, rest.size()) == rest) return R::NeedMore;
        }
        return R::NoMatch;
    };
    auto step = [&](std::initializer_list<std::string_view> words) -> R {
        ws();
        return i == s.size() ? R::NeedMore : word(words);
    };
    for (auto words : {std::initializer_list<std::string_view>{"{"}, {"\"name\""}, {":"}, {"\""}}) {
        if (R r = step(words); r != R::Match) return {r == R::NeedMore ? more : r, {}, 0};
    }
    const size_t begin = i;
    while (i < s.size() && s[i] != '"') {
        if (s[i] == '\\' || s[i] == '<' || i - begin >= kMaxToolNameBytes) return {R::NoMatch, {}, 0};
        ++i;
    }
    if (i == s.size()) return {more, {}, 0};
    h.name = std::string(s.substr(begin, i - begin));
    ++i;
    for (auto words : {std::initializer_list<std::string_view>{","}, {"\"arguments\"", "\"parameters\""}, {":"}, {"{"}}) {
        if (R r = step(words); r != R::Match) return {r == R::NeedMore ? more : r, {}, 0};
    }
    h.result = h.name.empty() ? R::NoMatch : R::Match;
    h.args_at = i - 1;
    return h;
}

class HermesParser : public SteppedParser {
public:
    explicit HermesParser(const ChatParseOptions& o) : opt_(o) {}

    ChatPieces finish() override {
        ChatPieces out;
        switch (state_) {
        case State::Text:
            if (calls_ == 0 || !trim(pending_).empty()) emit_content(out, pending_);
            break;
        case State::Head:
        case State::Whole:
            emit_raw(out, ws_before_ + std::string(kOpen) + pending_);  // never closed: not a call
            break;
        case State::Args: {
            bool done = false;
            args_bytes(out, pending_, done);  // what was held back as a possible </tool_call>
            break;
        }
        case State::Skip:
            break;
        }
        pending_.clear();
        state_ = State::Text;
        return out;
    }

private:
    enum class State {
        Text,   // outside blocks
        Head,   // in a block, before its start is known
        Args,   // a call's arguments, streaming
        Skip,   // the rest of a block up to </tool_call>, dropped
        Whole,  // a block read whole at its </tool_call>
    };

    bool step(ChatPieces& out) override {
        switch (state_) {
        case State::Text: {
            const size_t open = pending_.find(kOpen);
            if (open == std::string::npos) {
                // Hold back what may still become "<tool_call>", and
                // trailing whitespace (dropped if a call follows).
                size_t keep = partial_marker_suffix(pending_, {kOpen});
                size_t end = pending_.size() - keep;
                while (end > 0 && is_space(pending_[end - 1])) --end;
                emit_content(out, std::string_view(pending_).substr(0, end));
                pending_.erase(0, end);
                return false;
            }
            // Whitespace before a call is dropped with it, kept if the
            // block turns out not to be one.
            const std::string_view before = std::string_view(pending_).substr(0, open);
            const std::string_view text = trim_end(before);
            emit_content(out, text);
            ws_before_ = std::string(before.substr(text.size()));
            pending_.erase(0, open + kOpen.size());
            state_ = State::Head;
            scanned_ = 0;
            return true;
        }
        case State::Head: {
            // The head holds no '<', so a </tool_call> in it is a NoMatch.
            const Head h = read_head(pending_);
            if (h.result == Head::Result::NeedMore) return false;
            if (h.result == Head::Result::NoMatch || !opt_.offered(h.name)) {
                state_ = State::Whole;
                return true;
            }
            if (!opt_.parallel && calls_ > 0) {  // parallel_tool_calls: false keeps the first
                state_ = State::Skip;
                return true;
            }
            open_call(out, calls_, h.name);
            call_ = calls_++;
            started_after_call_ = false;
            pending_.erase(0, h.args_at);
            depth_ = 0;
            in_string_ = escaped_ = false;
            state_ = State::Args;
            return true;
        }
        case State::Args: {
            const size_t close = pending_.find(kClose);
            const size_t limit = close != std::string::npos ? close : pending_.size() - partial_marker_suffix(pending_, {kClose});
            bool done = false;
            const size_t used = args_bytes(out, std::string_view(pending_).substr(0, limit), done);
            if (done) {
                pending_.erase(0, used);
                state_ = State::Skip;
                return true;
            }
            pending_.erase(0, limit);
            if (close == std::string::npos) return false;
            pending_.erase(0, kClose.size());  // closed inside the arguments: they end here
            state_ = State::Text;
            return true;
        }
        case State::Skip: {
            const size_t close = pending_.find(kClose);
            if (close == std::string::npos) {
                pending_.erase(0, pending_.size() - partial_marker_suffix(pending_, {kClose}));
                return false;
            }
            pending_.erase(0, close + kClose.size());
            state_ = State::Text;
            return true;
        }
        case State::Whole: {
            // Search only the new text (and a marker's length before it), so
            // a long block streamed in small pieces costs linear time.
            const size_t close = pending_.find(kClose, scanned_);
            if (close == std::string::npos) {
                scanned_ = pending_.size() >= kClose.size() ? pending_.size() - kClose.size() + 1 : 0;
                return false;
            }
            finish_block(out, std::string_view(pending_).substr(0, close));
            pending_.erase(0, close + kClose.size());
            state_ = State::Text;
            return true;
        }
        }
        return false;
    }

    // Streams argument bytes of the open call, whitespace outside strings
    // dropped, up to the brace that closes the object (then `done`).
    // Returns the bytes read.
    size_t args_bytes(ChatPieces& out, std::string_view s, bool& done) {
        std::string keep;
        size_t i = 0;
        for (; i < s.size(); ++i) {
            const char c = s[i];
            if (in_string_) {
                keep.push_back(c);
                if (escaped_) escaped_ = false;
                else if (c == '\\') escaped_ = true;
                else if (c == '"') in_string_ = false;
                continue;
            }
            if (is_space(c)) continue;
            keep.push_back(c);
            if (c == '"') in_string_ = true;
            else if (c == '{' || c == '[') ++depth_;
            else if ((c == '}' || c == ']') && --depth_ == 0) {
                done = true;
                ++i;
                break;
            }
        }
        add_text(out, ChatPiece::Kind::CallArgs, keep, call_);
        return i;
    }

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

    // A block that did not start the usual way, read whole.
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
    State state_ = State::Text;
    bool started_after_call_ = false;
    std::string ws_before_;  // whitespace between the text and an open block
    size_t scanned_ = 0;     // Whole: where the search for the block's end resumes
    size_t call_ = 0;        // Args: the call being streamed
    uint32_t depth_ = 0;     // Args: nesting of the arguments' objects and arrays
    bool in_string_ = false, escaped_ = false;
};

}  // namespace

std::unique_ptr<ChatOutputParser> make_hermes_parser(const ChatParseOptions& options) {
    return std::make_unique<HermesParser>(options);
}

}  // namespace eh::service::tool_calls
