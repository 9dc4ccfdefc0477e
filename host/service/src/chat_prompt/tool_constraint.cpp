// tool_choice "required" or a named function: the output is constrained
// (host/constrain's tagged-JSON grammar, enforced by the token mask) to be
// exactly the call(s) in the model's own format, arguments matching each
// tool's parameters schema.
#include "eh/service/chat_prompt.hpp"

#include <fmt/format.h>

#include "eh/constrain/grammar.hpp"
#include "eh/constrain/vocab.hpp"
#include "eh/service/chat_output.hpp"

namespace eh::service {

namespace {

// The most calls one forced answer may hold (parallel_tool_calls with
// tool_choice "required").
constexpr uint32_t kMaxForcedCalls = 8;

std::string arguments_schema(const ToolDef& t) {
    return t.parameters_json.empty() ? R"({"type":"object"})" : t.parameters_json;
}

// `text` as the mask's vocabulary spells it: the control token's bytes when
// the model has it as one token (gpt-oss's <|message|>), else the text.
std::string markup(const TextCodec& codec, std::string_view text) {
    const std::vector<int32_t> ids = codec.encode(text, false, true);
    if (ids.size() == 1 && codec.token_bytes(ids[0]).empty() && !codec.is_eog(ids[0]))
        return constrain::control_token_bytes(text);
    return std::string(text);
}

}  // namespace

void constrain_tool_call(ChatRequest& r, ToolFormat format, const TextCodec& codec) {
    const ChatToolRequest& tc = r.tools;
    std::vector<const ToolDef*> tools;
    for (const auto& t : tc.tools)
        if (tc.choice != ChatToolRequest::Choice::Named || t.name == tc.named) tools.push_back(&t);
    std::vector<constrain::TaggedJson> alts;
    uint32_t max_calls = 1;
    std::string prefill;
    switch (format) {
    case ToolFormat::Hermes:
        for (const ToolDef* t : tools)
            alts.push_back({"<tool_call>\n{\"name\": \"" + t->name + "\", \"arguments\": ", arguments_schema(*t), "}\n</tool_call>"});
        if (tc.choice == ChatToolRequest::Choice::Required && tc.parallel) max_calls = kMaxForcedCalls;
        break;
    case ToolFormat::Harmony:
        // The header goes into the prompt as the assistant's answer begun,
        // up to where the tools differ. One tool: all of it, and the output
        // is the arguments. Several: up to "to=functions.", and the output
        // is the name, the rest of the header (control tokens, which the
        // mask allows by their vocabulary bytes) and the arguments. A call
        // ends with <|call|>, which ends generation: one call per answer.
        if (tools.size() == 1) {
            prefill = "<|channel|>commentary to=functions." + tools[0]->name + " <|constrain|>json<|message|>";
            alts.push_back({"", arguments_schema(*tools[0]), ""});
        } else {
            prefill = "<|channel|>commentary to=functions.";
            const std::string rest = " " + markup(codec, "<|constrain|>") + "json" + markup(codec, "<|message|>");
            for (const ToolDef* t : tools) alts.push_back({t->name + rest, arguments_schema(*t), ""});
        }
        break;
    case ToolFormat::None:
        return;  // render_chat_prompt refused the tools already
    }
    OutputConstraint c;
    c.kind = OutputConstraint::Kind::Prebuilt;
    c.field = "tool_choice";
    try {
        c.grammar = constrain::tagged_json_grammar(alts, 1, max_calls, "\n");
    } catch (const constrain::GrammarError& e) {
        throw RequestError("tools", fmt::format("a forced tool call needs each tool's parameters as a supported JSON "
                                                "schema: {}", e.what()));
    }
    // Equal keys must mean equal grammars (compiled tables are cached; one
    // cache per model, so the markup's spelling is fixed under a key).
    c.text = fmt::format("tools/{}/{}/{}/{}", tool_format_name(format), max_calls,
                         tc.choice == ChatToolRequest::Choice::Named ? tc.named : "*", tc.tools_json);
    r.gen.constraint = std::move(c);
    r.gen.prompt += prefill;
    r.tools.prefill = std::move(prefill);
}

}  // namespace eh::service
