#include "parse/anthropic_request.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <random>

#include "parse/anthropic_tools.hpp"
#include "parse/chat_messages.hpp"
#include "parse/json_fields.hpp"
#include "parse/tool_fields.hpp"

namespace eh::http {

using namespace json;
using service::kMaxToolCallsPerMessage;

namespace {

std::string message_id() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    return fmt::format("msg_{:016x}{:08x}", rng(), uint32_t(rng()));
}

ChatMessage text_message(const std::string& role, std::string text) {
    ChatMessage m;
    m.role = role;
    m.content = std::move(text);
    return m;
}

// A tool_use block's id and a tool_result's tool_use_id: what pairs a result
// with its call, so an empty one is refused (Anthropic's ids are never empty).
std::string tool_id(const object& b, const char* key, const std::string& at) {
    std::string id = want_string(b, key, "messages", at, true);
    if (id.empty()) throw RequestError("messages", fmt::format("'{}.{}' must not be empty", at, key));
    return id;
}

// A user tool_result block: the result of one tool_use, as a `tool` message
// (what the chat templates render tool results from).
ChatMessage tool_result(const object& b, const std::string& at) {
    ChatMessage m;
    m.role = "tool";
    m.tool_call_id = tool_id(b, "tool_use_id", at);
    if (auto c = field(b, "content")) m.content = text_content(*c, "messages", at + ".content");
    if (auto e = get_bool(b, "is_error"); e && *e) m.content = "Error: " + m.content;  // the template has no flag for it
    return m;
}

// An assistant tool_use block: a call the model made.
ChatToolCall tool_use(const object& b, const std::string& at) {
    ChatToolCall c;
    c.id = tool_id(b, "id", at);
    c.name = want_string(b, "name", "messages", at, true);
    if (c.name.empty()) throw RequestError("messages", fmt::format("'{}.name' must not be empty", at));
    auto input = field(b, "input");
    if (!input) throw RequestError("messages", fmt::format("'{}.input' is required", at));
    want_object(*input, "messages", at + ".input");
    c.arguments = simdjson::to_string(*input);
    return c;
}

// One message's content: a string, or blocks — text, and tool_use
// (assistant) or tool_result (user). A user message's tool results become
// `tool` messages and its text a user message, in the order given.
void read_content(const object& mo, size_t i, const std::string& role, std::vector<ChatMessage>& out,
                  const RequestLimits& limits, RequestImages& images) {
    const std::string where = fmt::format("messages[{}].content", i);
    auto c = field(mo, "content");
    if (!c) throw RequestError("messages", fmt::format("'{}' is required", where));
    if (c->type() != element_type::ARRAY) {
        out.push_back(text_message(role, text_content(*c, "messages", where)));
        return;
    }
    size_t text = SIZE_MAX;  // the message text (and tool_use) blocks go to
    size_t k = 0;
    simdjson::dom::array arr = c->get_array().value_unsafe();
    for (element block : arr) {
        const std::string at = fmt::format("{}[{}]", where, k++);
        object b = want_object(block, "messages", at);
        const std::string type = want_string(b, "type", "messages", at, true);
        if (type == "text") {
            if (text == SIZE_MAX) text = out.size(), out.push_back(text_message(role, ""));
            out[text].content += text_block(b, "messages", at);
        } else if (type == "image" && role == "user") {
            // {"type":"image","source":{"type":"base64","media_type":"image/png","data":"..."}}
            if (text == SIZE_MAX) text = out.size(), out.push_back(text_message(role, ""));
            auto src = field(b, "source");
            if (!src || src->type() != element_type::OBJECT)
                throw RequestError("messages", fmt::format("'{}.source' is required (an object)", at));
            object s = src->get_object().value_unsafe();
            const std::string kind = want_string(s, "type", "messages", at + ".source", true);
            if (kind == "url")
                throw RequestError("messages", fmt::format("'{}.source': remote image URLs are not fetched (the server "
                                                           "never downloads): send the image as base64",
                                                           at));
            if (kind != "base64")
                throw RequestError("messages", fmt::format("'{}.source.type' \"{}\" is not supported (base64)", at,
                                                           kind.substr(0, 32)));
            const std::string media = want_string(s, "media_type", "messages", at + ".source", true);
            const std::string data = want_string(s, "data", "messages", at + ".source", true);
            add_image(out[text], images, limits, "messages", at, "data:" + media + ";base64," + data);
        } else if (type == "tool_use" && role == "assistant") {
            if (text == SIZE_MAX) text = out.size(), out.push_back(text_message(role, ""));
            if (out[text].tool_calls.size() >= kMaxToolCallsPerMessage)
                throw RequestError("messages", fmt::format("'{}' has more than {} tool_use blocks", where,
                                                           kMaxToolCallsPerMessage));
            out[text].tool_calls.push_back(tool_use(b, at));
        } else if (type == "tool_result" && role == "user") {
            out.push_back(tool_result(b, at));
            text = SIZE_MAX;  // text after a result is a new user turn
        } else if (type == "thinking" && role == "assistant") {
            // The model's earlier reasoning: the template's `thinking` (what
            // reasoning_content is on the OpenAI route). Its signature is not
            // checked (this server signs nothing).
            if (text == SIZE_MAX) text = out.size(), out.push_back(text_message(role, ""));
            out[text].reasoning += want_string(b, "thinking", "messages", at, true);
        } else if (type == "redacted_thinking" && role == "assistant") {
            // opaque to every model but the one that wrote it: left out
        } else if (type == "thinking" || type == "redacted_thinking") {
            throw RequestError("messages", fmt::format("'{}.type' \"{}\" belongs in assistant messages", at, type));
        } else if (type == "tool_use" || type == "tool_result") {
            throw RequestError("messages", fmt::format("'{}.type' \"{}\" belongs in {} messages", at, type,
                                                       type == "tool_use" ? "assistant" : "user"));
        } else {
            throw RequestError("messages", fmt::format("'{}.type' \"{}\" is not supported (text, tool_use, "
                                                       "tool_result and thinking blocks only)", at, type.substr(0, 32)));
        }
    }
    if (k == 0) out.push_back(text_message(role, ""));
}

std::vector<ChatMessage> parse_messages(const object& obj, const RequestLimits& limits, RequestImages& images) {
    auto out = read_messages(obj, limits, {"user", "assistant"}, "(the system prompt goes in 'system')",
                             [&](const object& mo, size_t i, const std::string& role, std::vector<ChatMessage>& o) {
                                 read_content(mo, i, role, o, limits, images);
                             });
    // Anthropic continues a final assistant message in place; a chat
    // template can only start a new turn after it, which would answer a
    // different question. Refused rather than answered wrongly.
    if (out.back().role == "assistant")
        throw RequestError("messages", "a final assistant message (a prefill to continue) is not supported: "
                                       "the last message must be from the user");
    return out;
}

}  // namespace

std::string reasoning_effort_for_budget(int64_t budget_tokens) {
    return budget_tokens < 4096 ? "low" : budget_tokens < 16384 ? "medium" : "high";
}

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
        service::check_prompt(system, "system", limits, true);
        if (!system.empty()) r.messages.push_back(text_message("system", std::move(system)));
    }
    for (auto& m : parse_messages(obj, limits, r.gen.images)) r.messages.push_back(std::move(m));
    r.tools = parse_anthropic_tools(obj);
    std::optional<int64_t> budget;  // extended thinking's budget_tokens, when enabled
    if (auto t = field(obj, "thinking")) {
        object to = want_object(*t, "thinking", "thinking");
        const std::string type = want_string(to, "type", "thinking", "thinking", true);
        if (type == "enabled") {
            budget = get_int(to, "budget_tokens", kMinThinkingBudget, INT32_MAX);
            if (!budget)
                throw RequestError("thinking", fmt::format("'thinking.budget_tokens' is required (at least {})",
                                                           kMinThinkingBudget));
            r.thinking = true;
            r.tools.reasoning_effort = reasoning_effort_for_budget(*budget);
        } else if (type != "disabled") {
            throw RequestError("thinking", "'thinking.type' must be \"enabled\" or \"disabled\"");
        }
    }
    if (count_only) return r;

    auto max_tokens = get_int(obj, "max_tokens", 1, limits.max_tokens);
    if (!max_tokens) throw RequestError("max_tokens", "'max_tokens' is required");
    r.gen.max_tokens = uint32_t(*max_tokens);
    if (budget && *budget >= *max_tokens)
        throw RequestError("thinking", fmt::format("'thinking.budget_tokens' ({}) must be less than 'max_tokens' ({})",
                                                   *budget, *max_tokens));
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

}  // namespace eh::http
