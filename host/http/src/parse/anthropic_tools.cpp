#include "parse/anthropic_tools.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "parse/tool_fields.hpp"

namespace eh::http {

using namespace json;

namespace {

void parse_tools(const element& e, ChatToolRequest& r) {
    if (e.type() != element_type::ARRAY)
        throw RequestError("tools", fmt::format("'tools' must be an array, not {}", type_name(e.type())));
    // The template gets OpenAI's shape: what transformers passes it.
    nlohmann::ordered_json as_functions = nlohmann::ordered_json::array();
    size_t i = 0;
    simdjson::dom::array arr = e.get_array().value_unsafe();
    for (element t : arr) {
        const std::string path = fmt::format("tools[{}]", i++);
        object to = want_object(t, "tools", path);
        const std::string type = want_string(to, "type", "tools", path, false);
        if (!type.empty() && type != "custom")
            throw RequestError("tools", fmt::format("'{}.type' \"{}\" is not supported (client tools only: a name, "
                                                    "description and input_schema)", path, type.substr(0, 40)));
        ToolDef d;
        d.name = want_string(to, "name", "tools", path, true);
        check_new_tool(r.tools, d.name, "tools", path + ".name");
        const std::string description = want_string(to, "description", "tools", path, false);
        auto schema = json::field(to, "input_schema");
        if (!schema) throw RequestError("tools", fmt::format("'{}.input_schema' is required", path));
        want_object(*schema, "tools", path + ".input_schema");
        d.parameters_json = simdjson::to_string(*schema);
        nlohmann::ordered_json fn = {{"name", d.name}};
        if (!description.empty()) fn["description"] = description;
        fn["parameters"] = nlohmann::ordered_json::parse(d.parameters_json);
        as_functions.push_back({{"type", "function"}, {"function", std::move(fn)}});
        r.tools.push_back(std::move(d));
    }
    if (!r.tools.empty()) r.tools_json = as_functions.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void parse_tool_choice(const element& e, ChatToolRequest& r) {
    object co = want_object(e, "tool_choice", "tool_choice");
    const std::string type = want_string(co, "type", "tool_choice", "tool_choice", true);
    using Choice = ChatToolRequest::Choice;
    if (type == "auto") r.choice = Choice::Auto;
    else if (type == "any") r.choice = Choice::Required;
    else if (type == "none") r.choice = Choice::None;
    else if (type == "tool") r.choice = Choice::Named;
    else
        throw RequestError("tool_choice", fmt::format("'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\"; "
                                                      "got '{}'", type.substr(0, 32)));
    if (r.choice == Choice::Named) {
        r.named = want_string(co, "name", "tool_choice", "tool_choice", true);
        bool found = false;
        for (const auto& t : r.tools) found = found || t.name == r.named;
        if (!found)
            throw RequestError("tool_choice",
                               fmt::format("'tool_choice.name' '{}' is not one of 'tools'", r.named.substr(0, 64)));
    }
    if (r.tools.empty() && (r.choice == Choice::Required || r.choice == Choice::Named))
        throw RequestError("tool_choice", fmt::format("'tool_choice' \"{}\" needs 'tools'", type));
    if (auto d = get_bool(co, "disable_parallel_tool_use")) r.parallel = !*d;
}

}  // namespace

ChatToolRequest parse_anthropic_tools(const object& body) {
    ChatToolRequest r;
    if (auto t = json::field(body, "tools")) parse_tools(*t, r);
    if (auto c = json::field(body, "tool_choice")) parse_tool_choice(*c, r);
    return r;
}

}  // namespace eh::http
