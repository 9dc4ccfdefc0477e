#include "eh/service/chat_prompt.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace eh::service {

void render_chat_prompt(const TextCodec& codec, ChatRequest& r, const std::string& model,
                        const RequestLimits& limits, const std::function<bool()>& cancelled) {
    // First: a tools request to such a model would otherwise be told it has
    // no tool format, which is not the reason.
    if (const ChatTemplateState t = codec.chat_template_state(); t.kind == ChatTemplateState::Kind::Rejected)
        throw ChatTemplateUnusable(t);
    const ToolFormat format = codec.tool_format();
    if (format == ToolFormat::None) {
        // A template without a tool format would drop these silently.
        if (r.tools.enabled())
            throw RequestError("tools", fmt::format("model '{}' has no tool-call format in its chat template, so it cannot "
                                                    "be offered tools (served: templates that write Hermes <tool_call> "
                                                    "blocks, such as Qwen2.5, and gpt-oss's harmony calls)", model));
        for (size_t i = 0; i < r.messages.size(); ++i)
            if (!r.messages[i].tool_calls.empty() || r.messages[i].role == "tool")
                throw RequestError("messages", fmt::format("'messages[{}]' is a tool call or tool result, but model '{}' has "
                                                           "no tool-call format in its chat template", i, model));
    }
    ChatRenderOptions opt;
    if (r.tools.enabled()) opt.tools_json = r.tools.tools_json;
    if (!r.tools.reasoning_effort.empty())
        opt.extra_json = nlohmann::json{{"reasoning_effort", r.tools.reasoning_effort}}.dump();
    ChatPrompt p = codec.render_chat(r.messages, cancelled, opt);
    r.gen.prompt = std::move(p.text);
    r.gen.literal = std::move(p.literal);
    r.gen.control_text = format == ToolFormat::Harmony;
    if (r.tools.forced()) {
        if (r.gen.constraint.active())
            throw RequestError("tool_choice", "'tool_choice' \"required\" or a named function cannot be combined with "
                                              "'response_format'");
        constrain_tool_call(r, format, codec);
    }
    check_prompt(r.gen.prompt, "messages", limits);
}

}  // namespace eh::service
