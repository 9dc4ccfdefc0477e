// Parsing of the tool-calling and reasoning fields of a chat request (see
// eh/service/tool_request.hpp). Kept apart from openai_request.cpp, which
// calls these.
#include "parse/tool_fields.hpp"

#include <fmt/format.h>

namespace eh::http {

using namespace json;
using service::kMaxToolCallsPerMessage;
using service::kMaxToolNameBytes;
using service::kMaxTools;

namespace {

std::string sv(const element& e) { return std::string(e.get_string().value_unsafe()); }

// Where the message says what is wrong: "'tools[2].function.name' ...".
[[noreturn]] void bad(std::string_view field, const std::string& msg) { throw RequestError(std::string(field), msg); }

}  // namespace

object want_object(const element& e, std::string_view field, const std::string& path) {
    if (e.type() != element_type::OBJECT)
        bad(field, fmt::format("'{}' must be an object, not {}", path, type_name(e.type())));
    return e.get_object().value_unsafe();
}

std::string want_string(const object& o, std::string_view key, std::string_view field, const std::string& path,
                        bool required) {
    auto e = json::field(o, key);
    if (!e) {
        if (required) bad(field, fmt::format("'{}.{}' is required", path, key));
        return {};
    }
    if (e->type() != element_type::STRING)
        bad(field, fmt::format("'{}.{}' must be a string, not {}", path, key, type_name(e->type())));
    return sv(*e);
}

void check_new_tool(const std::vector<ToolDef>& tools, const std::string& name, std::string_view field,
                    const std::string& path) {
    if (tools.size() >= kMaxTools) bad(field, fmt::format("'{}' has more than {} entries", field, kMaxTools));
    bool ok = !name.empty() && name.size() <= kMaxToolNameBytes;
    for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
    if (!ok)
        bad(field, fmt::format("'{}' must be 1 to {} letters, digits, '_' or '-'", path, kMaxToolNameBytes));
    for (const auto& prev : tools)
        if (prev.name == name) bad(field, fmt::format("'{}' '{}' is defined twice", path, name));
}

namespace {

std::vector<ToolDef> parse_tools(const element& e, std::string& tools_json) {
    if (e.type() != element_type::ARRAY) bad("tools", fmt::format("'tools' must be an array, not {}", type_name(e.type())));
    std::vector<ToolDef> out;
    size_t i = 0;
    simdjson::dom::array arr = e.get_array().value_unsafe();  // a named array: the range must outlive the loop
    for (element t : arr) {
        const std::string path = fmt::format("tools[{}]", i);
        object to = want_object(t, "tools", path);
        const std::string type = want_string(to, "type", "tools", path, true);
        if (type != "function")
            bad("tools", fmt::format("'{}.type' must be \"function\" (the only tool type served), got '{}'", path,
                                     type.substr(0, 32)));
        auto f = json::field(to, "function");
        if (!f) bad("tools", fmt::format("'{}.function' is required", path));
        object fo = want_object(*f, "tools", path + ".function");
        ToolDef d;
        d.name = want_string(fo, "name", "tools", path + ".function", true);
        check_new_tool(out, d.name, "tools", path + ".function.name");
        want_string(fo, "description", "tools", path + ".function", false);
        if (auto p = json::field(fo, "parameters")) {
            want_object(*p, "tools", path + ".function.parameters");
            d.parameters_json = simdjson::to_string(*p);
        }
        if (auto s = json::field(fo, "strict"); s && s->type() != element_type::BOOL)
            bad("tools", fmt::format("'{}.function.strict' must be a boolean", path));
        out.push_back(std::move(d));
        ++i;
    }
    if (!out.empty()) tools_json = simdjson::to_string(e);
    return out;
}

}  // namespace

ChatToolRequest parse_chat_tools(const object& obj) {
    ChatToolRequest r;
    if (json::field(obj, "functions") || json::field(obj, "function_call"))
        bad("functions", "'functions' and 'function_call' are deprecated and not served; use 'tools' and 'tool_choice'");
    if (auto t = json::field(obj, "tools")) r.tools = parse_tools(*t, r.tools_json);
    if (auto c = json::field(obj, "tool_choice")) {
        if (c->type() == element_type::STRING) {
            const std::string s = sv(*c);
            if (s == "auto") r.choice = ChatToolRequest::Choice::Auto;
            else if (s == "none") r.choice = ChatToolRequest::Choice::None;
            else if (s == "required") r.choice = ChatToolRequest::Choice::Required;
            else bad("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                                "{{\"type\":\"function\",\"function\":{{\"name\":...}}}}; got '{}'",
                                                s.substr(0, 32)));
        } else {
            object co = want_object(*c, "tool_choice", "tool_choice");
            if (want_string(co, "type", "tool_choice", "tool_choice", true) != "function")
                bad("tool_choice", "'tool_choice.type' must be \"function\"");
            auto f = json::field(co, "function");
            if (!f) bad("tool_choice", "'tool_choice.function' is required");
            r.named = want_string(want_object(*f, "tool_choice", "tool_choice.function"), "name", "tool_choice",
                                  "tool_choice.function", true);
            r.choice = ChatToolRequest::Choice::Named;
        }
        if (r.tools.empty() && r.choice != ChatToolRequest::Choice::None)
            bad("tool_choice", "'tool_choice' needs 'tools'");
        if (r.choice == ChatToolRequest::Choice::Named) {
            bool found = false;
            for (const auto& t : r.tools) found = found || t.name == r.named;
            if (!found)
                bad("tool_choice", fmt::format("'tool_choice.function.name' '{}' is not one of 'tools'", r.named.substr(0, 64)));
        }
    }
    if (auto p = get_bool(obj, "parallel_tool_calls")) r.parallel = *p;
    if (auto e = get_string(obj, "reasoning_effort")) {
        if (*e != "low" && *e != "medium" && *e != "high")
            bad("reasoning_effort",
                fmt::format("'reasoning_effort' must be \"low\", \"medium\" or \"high\"; got '{}'", e->substr(0, 32)));
        r.reasoning_effort = *e;
    }
    return r;
}

void parse_message_tool_fields(const object& mo, size_t i, ChatMessage& cm) {
    const std::string path = fmt::format("messages[{}]", i);
    if (cm.role == "assistant") {
        for (const char* key : {"reasoning_content", "reasoning"})
            if (auto r = json::field(mo, key)) {
                if (r->type() != element_type::STRING) bad("messages", fmt::format("'{}.{}' must be a string", path, key));
                cm.reasoning = sv(*r);
                break;
            }
        if (auto tc = json::field(mo, "tool_calls")) {
            if (tc->type() != element_type::ARRAY)
                bad("messages", fmt::format("'{}.tool_calls' must be an array, not {}", path, type_name(tc->type())));
            size_t k = 0;
            simdjson::dom::array arr = tc->get_array().value_unsafe();
            for (element c : arr) {
                const std::string cp = fmt::format("{}.tool_calls[{}]", path, k);
                if (k >= kMaxToolCallsPerMessage)
                    bad("messages", fmt::format("'{}.tool_calls' has more than {} entries", path, kMaxToolCallsPerMessage));
                object co = want_object(c, "messages", cp);
                ChatToolCall call;
                call.id = want_string(co, "id", "messages", cp, false);
                const std::string type = want_string(co, "type", "messages", cp, false);
                if (!type.empty() && type != "function") bad("messages", fmt::format("'{}.type' must be \"function\"", cp));
                auto f = json::field(co, "function");
                if (!f) bad("messages", fmt::format("'{}.function' is required", cp));
                object fo = want_object(*f, "messages", cp + ".function");
                call.name = want_string(fo, "name", "messages", cp + ".function", true);
                if (call.name.empty()) bad("messages", fmt::format("'{}.function.name' must not be empty", cp));
                auto a = json::field(fo, "arguments");
                if (a && a->type() == element_type::STRING) call.arguments = sv(*a);
                else if (a && a->type() == element_type::OBJECT) call.arguments = simdjson::to_string(*a);
                else if (a) bad("messages", fmt::format("'{}.function.arguments' must be a JSON string", cp));
                else call.arguments = "{}";
                cm.tool_calls.push_back(std::move(call));
                ++k;
            }
        }
    } else if (cm.role == "tool") {
        cm.tool_call_id = want_string(mo, "tool_call_id", "messages", path, true);
    }
    if (auto n = json::field(mo, "name"); n && n->type() == element_type::STRING) cm.name = sv(*n);
}

}  // namespace eh::http
