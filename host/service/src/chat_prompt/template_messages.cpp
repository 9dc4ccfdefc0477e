// OpenAI chat messages -> the message objects chat templates are written
// for (the shape transformers' apply_chat_template passes them in).
#include <nlohmann/json.hpp>

#include "eh/service/chat_prompt.hpp"

namespace eh::service {

std::string template_messages_json(const std::vector<ChatMessage>& messages) {
    // ordered_json: templates write objects in the order the client sent them.
    using json = nlohmann::ordered_json;
    json arr = json::array();
    for (const auto& m : messages) {
        // content is always a string, also where the client sent null next
        // to tool_calls: templates test and concatenate it.
        json j = {{"role", m.role}, {"content", m.content}};
        if (!m.reasoning.empty()) j["thinking"] = m.reasoning;
        if (!m.tool_calls.empty()) {
            json calls = json::array();
            for (const auto& c : m.tool_calls) {
                // Templates write arguments with |tojson, so they want the
                // value; text that is not JSON stays a string (what
                // transformers does with it too).
                json args = json::parse(c.arguments, nullptr, false);
                if (args.is_discarded()) args = c.arguments;
                json call = {{"type", "function"}, {"function", {{"name", c.name}, {"arguments", args}}}};
                if (!c.id.empty()) call["id"] = c.id;
                calls.push_back(std::move(call));
            }
            j["tool_calls"] = std::move(calls);
        }
        if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
        if (!m.name.empty()) j["name"] = m.name;
        arr.push_back(std::move(j));
    }
    return arr.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace eh::service
