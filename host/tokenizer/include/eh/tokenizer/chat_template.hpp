// Chat templates: OpenAI-style messages -> prompt text, by running the
// model's own Jinja template (tokenizer.chat_template in a GGUF, or
// tokenizer_config.json / chat_template.jinja beside a tokenizer.json).
//
// The interpreter covers the Jinja2 subset that chat templates use, with the
// settings Hugging Face transformers renders them with (trim_blocks,
// lstrip_blocks, loop controls, tojson without HTML escaping,
// raise_exception, strftime_now). Unsupported syntax fails at compile time
// with eh::Error(InvalidRequest) naming the line; a template's own
// raise_exception() fails render() with InvalidRequest and its message.
//
// Limits: expressions and blocks nest at most 200 levels, and an
// expression's tree (chains such as 1+1+1... included) is at most 200
// levels tall (deeper fails compile()); lists and dicts nested deeper than
// 1,024 levels fail render() where printed, compared or written as JSON; any
// string a template builds is at most 8 MiB and any list
// 1,000,000 items; steps and output are budgeted per render (ChatOptions).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace eh::tokenizer {

struct ChatOptions {
    bool add_generation_prompt = true;
    std::string bos_token;  // exposed to the template as bos_token / eos_token
    std::string eos_token;
    // JSON array of OpenAI tool definitions, or "" for none.
    std::string tools_json;
    // JSON object of extra template variables (e.g. {"reasoning_effort":"low"}),
    // or "" for none.
    std::string extra_json;
    // The date strftime_now() reports, as "YYYY-MM-DD HH:MM:SS" (UTC);
    // "" means the current time. Tests pin it.
    std::string now;

    // Evaluation budget, so a hostile template ends: a render that runs more
    // steps (statements, loop iterations, calls) or writes more bytes fails
    // with InvalidRequest; `cancelled`, when set, is polled every 1,024 steps
    // and a true answer fails the render with Code::Cancelled. A real chat
    // template uses a few thousand steps per conversation.
    uint64_t max_steps = 1'000'000;
    size_t max_output_bytes = size_t(8) << 20;
    std::function<bool()> cancelled;
};

class ChatTemplate {
public:
    // Parses the template once; render() may then run many times, from
    // several threads.
    static std::shared_ptr<const ChatTemplate> compile(std::string_view source);

    // messages_json: a JSON array of {"role": ..., "content": ..., ...}
    // objects (content may also be null; extra fields such as tool_calls or
    // thinking are passed through to the template).
    virtual std::string render(std::string_view messages_json, const ChatOptions& options) const = 0;
    virtual ~ChatTemplate() = default;
};

}  // namespace eh::tokenizer
