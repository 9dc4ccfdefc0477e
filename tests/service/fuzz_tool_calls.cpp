// libFuzzer target: arbitrary bytes as a model's output through the chat
// output parsers (Hermes <tool_call> blocks, gpt-oss harmony). The first
// byte picks the format, the options (tools, parallel calls, a list of
// offered names) and a chunk size; the rest is fed
// whole and then in chunks. A parser must never throw or crash, and must
// give the same pieces (folded) however the text is split, since a stream
// and a whole answer have to agree. Built only with EH_ENABLE_FUZZERS=ON.
//   build-fuzz/tests/http/fuzz_tool_calls tests/http/fuzz_tool_calls_seeds -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "eh/service/chat_output.hpp"

namespace {

using namespace eh::service;

// Content, reasoning and calls folded into one string per kind.
struct Folded {
    std::string content, reasoning, calls;
    void add(const ChatPieces& ps) {
        for (const auto& p : ps) {
            switch (p.kind) {
            case ChatPiece::Kind::Content: content += p.text; break;
            case ChatPiece::Kind::Reasoning: reasoning += p.text; break;
            case ChatPiece::Kind::CallOpen: calls += "|" + std::to_string(p.index) + ":" + p.name + ":"; break;
            case ChatPiece::Kind::CallArgs: calls += p.text; break;
            }
        }
    }
    bool operator==(const Folded& o) const { return content == o.content && reasoning == o.reasoning && calls == o.calls; }
};

Folded run(ToolFormat f, const ChatParseOptions& o, std::string_view text, size_t chunk) {
    auto p = make_chat_output_parser(f, o);
    Folded r;
    for (size_t i = 0; i < text.size(); i += chunk) r.add(p->feed(text.substr(i, chunk)));
    r.add(p->finish());
    return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const uint8_t k = data[0];
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    const ToolFormat f = (k & 1) ? ToolFormat::Harmony : ToolFormat::Hermes;
    ChatParseOptions o{(k & 2) == 0, (k & 4) == 0, {}};
    if (k & 8) o.names = {"get_weather", "f"};  // calls of other functions are content
    const size_t chunk = 1 + (k >> 4);
    const Folded whole = run(f, o, text, text.size() + 1);
    if (!(run(f, o, text, chunk) == whole)) std::abort();
    return 0;
}
