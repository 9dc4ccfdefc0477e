#include "parse/chat_messages.hpp"

#include <fmt/format.h>

namespace eh::http::json {

namespace {

std::string role_list(std::initializer_list<std::string_view> roles) {
    std::string out = roles.size() > 2 ? "one of " : "";
    size_t k = 0;
    for (std::string_view r : roles) {
        if (k) out += k + 1 == roles.size() ? (roles.size() > 2 ? ", " : " or ") : ", ";
        out += r;
        ++k;
    }
    return out;
}

}  // namespace

std::vector<ChatMessage> read_messages(const object& body, const RequestLimits& limits,
                                       std::initializer_list<std::string_view> roles, std::string_view note,
                                       const ContentReader& read) {
    auto e = field(body, "messages");
    if (!e) throw RequestError("messages", "'messages' is required");
    if (e->type() != element_type::ARRAY)
        throw RequestError("messages", fmt::format("'messages' must be an array, not {}", type_name(e->type())));
    std::vector<ChatMessage> out;
    size_t i = 0;
    simdjson::dom::array arr = e->get_array().value_unsafe();  // named: the range must outlive the loop
    for (element m : arr) {
        if (i >= limits.max_messages)
            throw RequestError("messages", fmt::format("'messages' has more than {} entries", limits.max_messages));
        if (m.type() != element_type::OBJECT)
            throw RequestError("messages", fmt::format("'messages[{}]' must be an object, not {}", i, type_name(m.type())));
        object mo = m.get_object().value_unsafe();
        auto role = get_string(mo, "role");
        if (!role) throw RequestError("messages", fmt::format("'messages[{}].role' is required", i));
        bool allowed = false;
        for (std::string_view r : roles) allowed = allowed || *role == r;
        if (!allowed)
            throw RequestError("messages", fmt::format("'messages[{}].role' must be {}; got '{}'{}{}", i, role_list(roles),
                                                       role->substr(0, 32), note.empty() ? "" : " ", note));
        const size_t first = out.size();
        read(mo, i, *role, out);
        for (size_t k = first; k < out.size(); ++k) service::check_prompt(out[k].content, "messages", limits, true);
        ++i;
    }
    if (out.empty()) throw RequestError("messages", "'messages' must not be empty");
    return out;
}

std::string text_block(const object& block, std::string_view field, const std::string& where) {
    auto text = get_string(block, "text");
    if (!text) throw RequestError(std::string(field), fmt::format("'{}.text' is required", where));
    return *text;
}

void add_image(ChatMessage& m, RequestImages& images, const RequestLimits& limits, std::string_view field,
               const std::string& where, std::string_view url) {
    if (images.size() >= limits.images.max_images)
        throw RequestError(std::string(field), fmt::format("'{}': a request may hold at most {} images", where,
                                                           limits.images.max_images));
    try {
        const std::string bytes = image::data_url_bytes(url, limits.images);
        images.push_back(std::make_shared<const image::Rgb8>(image::decode(bytes, limits.images)));
    } catch (const image::ImageError& e) {
        throw RequestError(std::string(field), fmt::format("'{}': {}", where, e.what()));
    }
    m.image_at.push_back(m.content.size());
}

void user_content(const element& c, std::string_view field, const std::string& where, const RequestLimits& limits,
                  ChatMessage& m, RequestImages& images) {
    if (c.type() != element_type::ARRAY) {
        m.content = text_content(c, field, where);
        return;
    }
    size_t k = 0;
    simdjson::dom::array arr = c.get_array().value_unsafe();
    for (element block : arr) {
        const std::string at = fmt::format("{}[{}]", where, k++);
        if (block.type() != element_type::OBJECT)
            throw RequestError(std::string(field), fmt::format("'{}' must be an object", at));
        object b = block.get_object().value_unsafe();
        auto type = get_string(b, "type");
        if (!type) throw RequestError(std::string(field), fmt::format("'{}.type' is required", at));
        if (*type == "text") {
            m.content += text_block(b, field, at);
        } else if (*type == "image_url") {
            auto u = json::field(b, "image_url");
            std::optional<std::string> url;
            if (u && u->type() == element_type::STRING) url = std::string(u->get_string().value_unsafe());
            else if (u && u->type() == element_type::OBJECT) url = get_string(u->get_object().value_unsafe(), "url");
            if (!url)
                throw RequestError(std::string(field), fmt::format("'{}.image_url.url' is required (a data URL)", at));
            add_image(m, images, limits, field, at, *url);
        } else {
            throw RequestError(std::string(field), fmt::format("'{}.type' \"{}\" is not supported (text and image_url "
                                                               "parts)", at, type->substr(0, 32)));
        }
    }
}

std::string text_content(const element& c, std::string_view field, const std::string& where) {
    if (c.type() == element_type::STRING) return std::string(c.get_string().value_unsafe());
    if (c.type() != element_type::ARRAY)
        throw RequestError(std::string(field), fmt::format("'{}' must be a string or an array of text blocks, not {}",
                                                           where, type_name(c.type())));
    std::string out;
    size_t k = 0;
    simdjson::dom::array arr = c.get_array().value_unsafe();
    for (element block : arr) {
        const std::string at = fmt::format("{}[{}]", where, k);
        if (block.type() != element_type::OBJECT)
            throw RequestError(std::string(field), fmt::format("'{}' must be an object", at));
        object b = block.get_object().value_unsafe();
        auto type = get_string(b, "type");
        if (!type) throw RequestError(std::string(field), fmt::format("'{}.type' is required", at));
        if (*type != "text")
            throw RequestError(std::string(field),
                               fmt::format("'{}.type' \"{}\" is not supported here (text only)", at, type->substr(0, 32)));
        out += text_block(b, field, at);
        ++k;
    }
    return out;
}

}  // namespace eh::http::json
