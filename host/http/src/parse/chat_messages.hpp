// The `messages` array of both chat APIs (OpenAI's and Anthropic's): the
// rules they share — present, an array, 1 to limits.max_messages entries,
// each an object with an allowed role, every message's text within the
// prompt rules — in one walker; how an entry's content is read is the
// API's (a content reader).
#pragma once

#include <functional>
#include <memory>
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

// The images a request's messages carry, decoded, in order.
using RequestImages = std::vector<std::shared_ptr<const image::Rgb8>>;

// Decodes one image (a data URL, or with `media_type` raw base64 data) and
// places it at the end of m's content so far (m.image_at). RequestError
// naming `field` and `where` for anything image::data_url_bytes or
// image::decode refuse, or past limits.images.max_images.
void add_image(ChatMessage& m, RequestImages& images, const RequestLimits& limits, std::string_view field,
               const std::string& where, std::string_view url);

// A user message's content on OpenAI's chat route: a string, or an array of
// {"type":"text"} and {"type":"image_url","image_url":{"url":...}} parts
// (`image_url` may also be the URL itself).
void user_content(const element& c, std::string_view field, const std::string& where, const RequestLimits& limits,
                  ChatMessage& m, RequestImages& images);

// One {"type":"text","text":...} block's text (its type already read).
std::string text_block(const object& block, std::string_view field, const std::string& where);

}  // namespace eh::http::json
