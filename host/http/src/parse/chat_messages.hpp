// The `messages` array of both chat APIs (OpenAI's and Anthropic's): the
// rules they share — present, an array, 1 to limits.max_messages entries,
// each an object with an allowed role, every message's text within the
// prompt rules — in one walker; how an entry's content is read is the
// API's (a content reader).
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "parse/json_fields.hpp"

namespace eh::http::json {

// Appends what `message` (entry `index`, of role `role`) becomes: one
// ChatMessage, or for Anthropic's tool results several.
using ContentReader =
    std::function<void(const object& message, size_t index, const std::string& role, std::vector<ChatMessage>& out)>;

// `roles`: the allowed roles; `note`: added to the error for any other
// ("(the system prompt goes in 'system')").
std::vector<ChatMessage> read_messages(const object& body, const RequestLimits& limits,
                                       std::initializer_list<std::string_view> roles, std::string_view note,
                                       const ContentReader& read);

// A content value that holds text only: a string, or an array of
// {"type":"text","text":...} blocks joined in order. `where` names it in
// errors ("messages[2].content", "system"); `field` is the error's field.
std::string text_content(const element& c, std::string_view field, const std::string& where);

// One {"type":"text","text":...} block's text (its type already read).
std::string text_block(const object& block, std::string_view field, const std::string& where);

}  // namespace eh::http::json
