// The tool-calling and reasoning fields of an OpenAI chat request: `tools`,
// `tool_choice`, `parallel_tool_calls`, `reasoning_effort`, and the tool
// fields of messages (assistant `tool_calls` and `reasoning_content`, tool
// `tool_call_id`).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace eh::service {

// Limits (400 beyond them).
inline constexpr size_t kMaxTools = 128;           // entries in `tools`
inline constexpr size_t kMaxToolCallsPerMessage = 128;
inline constexpr size_t kMaxToolNameBytes = 64;    // OpenAI's: [a-zA-Z0-9_-], 1..64

struct ToolDef {
    std::string name;
    std::string parameters_json;  // the JSON schema of the arguments; "" when absent
};

struct ChatToolRequest {
    enum class Choice { Auto, None, Required, Named };
    std::string tools_json;        // the `tools` array as sent (compact JSON), "" for none
    std::vector<ToolDef> tools;
    Choice choice = Choice::Auto;  // OpenAI's default: auto when tools are given
    std::string named;             // Choice::Named: the function
    bool parallel = true;          // parallel_tool_calls
    std::string reasoning_effort;  // "", "low", "medium" or "high"
    // Set when the call is forced on a harmony model: the answer's start
    // (the call's header), written into the prompt; the output parser reads
    // it before the output.
    std::string prefill;

    // Tool calls are parsed from the output (and offered to the template).
    bool enabled() const { return !tools.empty() && choice != Choice::None; }
    // The output must be a call (tool_choice required or a named function).
    bool forced() const { return enabled() && (choice == Choice::Required || choice == Choice::Named); }
};

}  // namespace eh::service
