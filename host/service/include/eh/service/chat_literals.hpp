// Keeps a chat's message text literal through its template (issue 26 item
// 12): "</s>" in a user's message must reach the model as four characters,
// as it does on /execute, while the template's own "<|im_start|>" becomes
// the control token. The template is a program over the messages (it may
// trim, slice or repeat them), so the spans of its output that came from a
// message cannot be known from outside; instead, before rendering, every
// control-token text in a message is replaced by a marker (U+E000, the
// text's index, U+E001: private-use characters, untouched by case changes
// and trimming), and after rendering each marker is put back and its span
// recorded. Message text without control-token text is not changed at all.
// A message's own U+E000 is marked the same way, so it cannot forge one.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/text_codec.hpp"

namespace eh::service {

class ChatLiterals {
public:
    // `specials`: the texts the tokenizer turns into control tokens.
    explicit ChatLiterals(std::vector<std::string> specials);

    // A message's text with every control-token text replaced by its marker.
    std::string mark(std::string_view content) const;
    // The rendered prompt with the markers put back, and their spans.
    ChatPrompt unmark(std::string_view rendered) const;
    // Every message marked.
    std::vector<ChatMessage> mark(const std::vector<ChatMessage>& messages) const;

private:
    std::vector<std::string> texts_;  // [0] is U+E000 itself; longest first after it
    std::array<std::vector<size_t>, 256> by_first_;  // indexes into texts_, by first byte
};

}  // namespace eh::service
