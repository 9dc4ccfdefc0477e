#include "eh/service/anthropic_request.hpp"

#include <fmt/format.h>

#include <random>

#include "json_fields.hpp"

namespace eh::service {

using namespace json;

namespace {

std::string message_id() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    return fmt::format("msg_{:016x}{:08x}", rng(), uint32_t(rng()));
}

// A string, or an array of text blocks joined in order. `where` names the
// field in messages ("messages[2].content", "system").
std::string text_content(const element& c, const std::string& where, std::string_view field_name) {
    if (c.type() == element_type::STRING) return std::string(c.get_string().value_unsafe());
    if (c.type() != element_type::ARRAY)
        throw RequestError(std::string(field_name), fmt::format("'{}' must be a string or an array of content blocks, not {}",
                                                                where, type_name(c.type())));
    std::string out;
    size_t k = 0;
    simdjson::dom::array arr = c.get_array().value_unsafe();
    for (element block : arr) {
        if (block.type() != element_type::OBJECT)
            throw RequestError(std::string(field_name), fmt::format("'{}[{}]' must be an object", where, k));
        object b = block.get_object().value_unsafe();
        auto type = get_string(b, "type");
        if (!type) throw RequestError(std::string(field_name), fmt::format("'{}[{}].type' is required", where, k));
        if (*type != "text")
            throw RequestError(std::string(field_name),
                               fmt::format("'{}[{}].type' \"{}\" is not supported (text blocks only)", where, k,
                                           type->substr(0, 32)));
        auto text = get_string(b, "text");
        if (!text) throw RequestError(std::string(field_name), fmt::format("'{}[{}].text' is required", where, k));
        out += *text;
        ++k;
    }
    return out;
}

std::vector<ChatMessage> parse_messages(const object& obj, const RequestLimits& limits) {
    auto e = field(obj, "messages");
    if (!e) throw RequestError("messages", "'messages' is required");
    if (e->type() != element_type::ARRAY)
        throw RequestError("messages", fmt::format("'messages' must be an array, not {}", type_name(e->type())));
    std::vector<ChatMessage> out;
    size_t i = 0;
    simdjson::dom::array arr = e->get_array().value_unsafe();
    for (element m : arr) {
        if (i >= limits.max_messages)
            throw RequestError("messages", fmt::format("'messages' has more than {} entries", limits.max_messages));
        if (m.type() != element_type::OBJECT)
            throw RequestError("messages", fmt::format("'messages[{}]' must be an object, not {}", i, type_name(m.type())));
        object mo = m.get_object().value_unsafe();
        auto role = get_string(mo, "role");
        if (!role) throw RequestError("messages", fmt::format("'messages[{}].role' is required", i));
        if (*role != "user" && *role != "assistant")
            throw RequestError("messages", fmt::format("'messages[{}].role' must be user or assistant; got '{}' "
                                                       "(the system prompt goes in 'system')",
                                                       i, role->substr(0, 32)));
        auto c = field(mo, "content");
        if (!c) throw RequestError("messages", fmt::format("'messages[{}].content' is required", i));
        ChatMessage cm{*role, text_content(*c, fmt::format("messages[{}].content", i), "messages")};
        check_prompt_text(cm.content, "messages", limits, true);
        out.push_back(std::move(cm));
        ++i;
    }
    if (out.empty()) throw RequestError("messages", "'messages' must not be empty");
    // Anthropic continues a final assistant message in place; a chat
    // template can only start a new turn after it, which would answer a
    // different question. Refused rather than answered wrongly.
    if (out.back().role == "assistant")
        throw RequestError("messages", "a final assistant message (a prefill to continue) is not supported: "
                                       "the last message must be from the user");
    return out;
}

}  // namespace

AnthropicRequest parse_anthropic_request(std::string_view body, const RequestLimits& limits, bool count_only) {
    simdjson::dom::parser parser;
    simdjson::padded_string storage;
    object obj = parse_object(parser, storage, body, limits);
    AnthropicRequest r;
    r.gen.origin = "messages";
    r.gen.job_id = message_id();
    r.gen.add_special = false;  // the template writes BOS when the model wants one
    r.gen.parse_special = true;
    auto model = get_string(obj, "model");
    if (!model) throw RequestError("model", "'model' is required");
    r.model = *model;
    if (auto s = field(obj, "system")) {
        std::string system = text_content(*s, "system", "system");
        check_prompt_text(system, "system", limits, true);
        if (!system.empty()) r.messages.push_back({"system", std::move(system)});
    }
    for (auto& m : parse_messages(obj, limits)) r.messages.push_back(std::move(m));
    for (const char* k : {"tools", "tool_choice"})
        if (field(obj, k)) throw RequestError(k, fmt::format("'{}' is not supported", k));
    if (auto t = field(obj, "thinking")) {
        std::optional<std::string> type;
        if (t->type() == element_type::OBJECT) type = get_string(t->get_object().value_unsafe(), "type");
        if (!type || *type != "disabled") throw RequestError("thinking", "'thinking' is not supported (only {\"type\":\"disabled\"})");
    }
    if (count_only) return r;

    auto max_tokens = get_int(obj, "max_tokens", 1, limits.max_tokens);
    if (!max_tokens) throw RequestError("max_tokens", "'max_tokens' is required");
    r.gen.max_tokens = uint32_t(*max_tokens);
    if (auto v = get_number(obj, "temperature", 0, 1)) r.gen.sampling.temperature = *v;
    if (auto v = get_number(obj, "top_p", 0, 1)) r.gen.sampling.top_p = *v;
    if (auto v = get_int(obj, "top_k", 0, INT32_MAX)) r.gen.sampling.top_k = int32_t(*v);
    if (auto st = field(obj, "stop_sequences")) {
        if (st->type() != element_type::ARRAY)
            throw RequestError("stop_sequences", fmt::format("'stop_sequences' must be an array of strings, not {}",
                                                             type_name(st->type())));
        r.gen.stop = get_stop(obj, "stop_sequences", limits);
    }
    if (auto s = get_bool(obj, "stream")) r.stream = *s;
    if (auto md = field(obj, "metadata"); md && md->type() != element_type::OBJECT)
        throw RequestError("metadata", fmt::format("'metadata' must be an object, not {}", type_name(md->type())));
    return r;
}

}  // namespace eh::service
