#include "parse/responses_request.hpp"

#include <fmt/format.h>

#include <random>

#include "parse/chat_messages.hpp"
#include "parse/json_fields.hpp"
#include "parse/tool_fields.hpp"

namespace eh::http {

using namespace json;
using service::kMaxToolCallsPerMessage;

namespace {

[[noreturn]] void bad(std::string_view field, const std::string& msg) { throw RequestError(std::string(field), msg); }

nlohmann::json to_json(const element& e) { return nlohmann::json::parse(simdjson::to_string(e)); }

std::string clip(const std::string& s) { return s.substr(0, 40); }

// ---- input -------------------------------------------------------------------

// A message item's content: a string, or text parts (input_text,
// output_text, refusal) joined in order.
std::string message_text(const element& c, const std::string& where) {
    if (c.type() == element_type::STRING) return std::string(c.get_string().value_unsafe());
    if (c.type() != element_type::ARRAY)
        bad("input", fmt::format("'{}' must be a string or an array of content parts, not {}", where, type_name(c.type())));
    std::string out;
    size_t k = 0;
    simdjson::dom::array arr = c.get_array().value_unsafe();
    for (element part : arr) {
        const std::string at = fmt::format("{}[{}]", where, k++);
        object p = want_object(part, "input", at);
        const std::string type = want_string(p, "type", "input", at, true);
        if (type == "input_text" || type == "output_text") out += want_string(p, "text", "input", at, true);
        else if (type == "refusal") out += want_string(p, "refusal", "input", at, true);
        else if (type == "input_image" || type == "input_file" || type == "input_audio")
            bad("input", fmt::format("'{}.type' \"{}\" is not supported on /v1/responses (text only; images go in "
                                     "/v1/chat/completions or /v1/messages on a server started with --mmproj)", at, type));
        else
            bad("input", fmt::format("'{}.type' \"{}\" is not supported (input_text, output_text and refusal parts "
                                     "only)", at, clip(type)));
    }
    return out;
}

// A reasoning item's text: its reasoning_text content, else its summary.
std::string reasoning_text(const object& item, const std::string& where) {
    std::string out;
    for (const char* key : {"content", "summary"}) {
        auto e = field(item, key);
        if (!e) continue;
        if (e->type() != element_type::ARRAY)
            bad("input", fmt::format("'{}.{}' must be an array, not {}", where, key, type_name(e->type())));
        size_t k = 0;
        simdjson::dom::array arr = e->get_array().value_unsafe();
        for (element part : arr) {
            const std::string at = fmt::format("{}.{}[{}]", where, key, k++);
            object p = want_object(part, "input", at);
            const std::string type = want_string(p, "type", "input", at, true);
            const char* want = std::string_view(key) == "content" ? "reasoning_text" : "summary_text";
            if (type != want) bad("input", fmt::format("'{}.type' must be \"{}\"; got '{}'", at, want, clip(type)));
            out += want_string(p, "text", "input", at, true);
        }
        if (!out.empty()) break;  // the full reasoning when given; the summary otherwise
    }
    return out;
}

std::string nonempty_string(const object& o, const char* key, const std::string& where) {
    std::string s = want_string(o, key, "input", where, true);
    if (s.empty()) bad("input", fmt::format("'{}.{}' must not be empty", where, key));
    return s;
}

std::vector<ChatMessage> parse_input(const object& obj, const RequestLimits& limits) {
    auto in = field(obj, "input");
    if (!in) bad("input", "'input' is required");
    std::vector<ChatMessage> out;
    if (in->type() == element_type::STRING) {
        ChatMessage m;
        m.role = "user";
        m.content = std::string(in->get_string().value_unsafe());
        service::check_prompt(m.content, "input", limits, true);
        out.push_back(std::move(m));
        return out;
    }
    if (in->type() != element_type::ARRAY)
        bad("input", fmt::format("'input' must be a string or an array of input items, not {}", type_name(in->type())));
    size_t joinable = SIZE_MAX;  // the assistant message a function_call item joins (same turn)
    std::string reasoning;       // of a reasoning item, for the assistant turn that follows it
    size_t reasoning_at = SIZE_MAX;
    auto assistant = [&](ChatMessage m) {
        if (reasoning_at != SIZE_MAX) m.reasoning = std::move(reasoning), reasoning.clear(), reasoning_at = SIZE_MAX;
        out.push_back(std::move(m));
        joinable = out.size() - 1;
    };
    size_t i = 0;
    simdjson::dom::array arr = in->get_array().value_unsafe();
    for (element e : arr) {
        if (i >= limits.max_messages) bad("input", fmt::format("'input' has more than {} items", limits.max_messages));
        const std::string at = fmt::format("input[{}]", i++);
        object item = want_object(e, "input", at);
        std::string type = want_string(item, "type", "input", at, false);
        if (type.empty() && field(item, "role")) type = "message";  // an "easy" message: {role, content}
        if (type == "message") {
            ChatMessage m;
            m.role = want_string(item, "role", "input", at, true);
            if (m.role != "user" && m.role != "assistant" && m.role != "system" && m.role != "developer")
                bad("input", fmt::format("'{}.role' must be one of user, assistant, system, developer; got '{}'", at,
                                         clip(m.role)));
            auto c = field(item, "content");
            if (!c) bad("input", fmt::format("'{}.content' is required", at));
            m.content = message_text(*c, at + ".content");
            if (m.role == "assistant") {
                assistant(std::move(m));
                continue;
            }
            if (reasoning_at != SIZE_MAX) break;  // refused below
            out.push_back(std::move(m));
        } else if (type == "function_call") {
            ChatToolCall call;
            call.id = nonempty_string(item, "call_id", at);
            call.name = nonempty_string(item, "name", at);
            call.arguments = want_string(item, "arguments", "input", at, true);
            if (reasoning_at != SIZE_MAX || joinable == SIZE_MAX) {
                ChatMessage m;
                m.role = "assistant";
                assistant(std::move(m));
            }
            auto& calls = out[joinable].tool_calls;
            if (calls.size() >= kMaxToolCallsPerMessage)
                bad("input", fmt::format("'{}': one assistant turn has more than {} function calls", at,
                                         kMaxToolCallsPerMessage));
            calls.push_back(std::move(call));
            continue;
        } else if (type == "function_call_output") {
            if (reasoning_at != SIZE_MAX) break;
            ChatMessage m;
            m.role = "tool";
            m.tool_call_id = nonempty_string(item, "call_id", at);
            auto o = field(item, "output");
            if (!o) bad("input", fmt::format("'{}.output' is required", at));
            m.content = message_text(*o, at + ".output");
            out.push_back(std::move(m));
        } else if (type == "reasoning") {
            if (reasoning_at == SIZE_MAX) reasoning_at = i - 1;
            reasoning += reasoning_text(item, at);
            if (auto ec = field(item, "encrypted_content"); ec && ec->type() != element_type::STRING)
                bad("input", fmt::format("'{}.encrypted_content' must be a string", at));
            continue;  // (encrypted_content is opaque to every server but the one that wrote it: left out)
        } else if (type == "item_reference") {
            bad("input", fmt::format("'{}.type' \"item_reference\" is not supported: send the item itself, or "
                                     "'previous_response_id'", at));
        } else if (type.empty()) {
            bad("input", fmt::format("'{}.type' is required (or a 'role' for a message)", at));
        } else {
            bad("input", fmt::format("'{}.type' \"{}\" is not supported (message, function_call, "
                                     "function_call_output and reasoning items only)", at, clip(type)));
        }
        joinable = SIZE_MAX;
    }
    if (reasoning_at != SIZE_MAX)
        bad("input", fmt::format("'input[{}]': a reasoning item must be followed by the assistant message or "
                                 "function_call it led to", reasoning_at));
    if (out.empty()) bad("input", "'input' must not be empty");
    for (const auto& m : out) service::check_prompt(m.content, "input", limits, true);
    return out;
}

// ---- tools -------------------------------------------------------------------

// Function tools {type:"function", name, description, parameters, strict}:
// the template gets them in the chat shape ({type, function:{...}}).
void parse_tools(const element& e, ChatToolRequest& r) {
    if (e.type() != element_type::ARRAY) bad("tools", fmt::format("'tools' must be an array, not {}", type_name(e.type())));
    nlohmann::ordered_json as_chat = nlohmann::ordered_json::array();
    size_t i = 0;
    simdjson::dom::array arr = e.get_array().value_unsafe();
    for (element t : arr) {
        const std::string path = fmt::format("tools[{}]", i++);
        object to = want_object(t, "tools", path);
        const std::string type = want_string(to, "type", "tools", path, true);
        if (type != "function")
            bad("tools", fmt::format("'{}.type' \"{}\" is not supported (function tools only: built-in tools run "
                                     "on OpenAI's servers)", path, clip(type)));
        ToolDef d;
        d.name = want_string(to, "name", "tools", path, true);
        check_new_tool(r.tools, d.name, "tools", path + ".name");
        const std::string description = want_string(to, "description", "tools", path, false);
        nlohmann::ordered_json fn = {{"name", d.name}};
        if (!description.empty()) fn["description"] = description;
        if (auto p = json::field(to, "parameters")) {
            want_object(*p, "tools", path + ".parameters");
            d.parameters_json = simdjson::to_string(*p);
            fn["parameters"] = nlohmann::ordered_json::parse(d.parameters_json);
        }
        if (auto s = json::field(to, "strict"); s && s->type() != element_type::BOOL)
            bad("tools", fmt::format("'{}.strict' must be a boolean", path));
        as_chat.push_back({{"type", "function"}, {"function", std::move(fn)}});
        r.tools.push_back(std::move(d));
    }
    if (!r.tools.empty()) r.tools_json = as_chat.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void parse_tool_choice(const element& c, ChatToolRequest& r) {
    using Choice = ChatToolRequest::Choice;
    if (c.type() == element_type::STRING) {
        const std::string s(c.get_string().value_unsafe());
        if (s == "auto") r.choice = Choice::Auto;
        else if (s == "none") r.choice = Choice::None;
        else if (s == "required") r.choice = Choice::Required;
        else bad("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                            "{{\"type\":\"function\",\"name\":...}}; got '{}'", clip(s)));
    } else {
        object co = want_object(c, "tool_choice", "tool_choice");
        const std::string type = want_string(co, "type", "tool_choice", "tool_choice", true);
        if (type != "function")
            bad("tool_choice", fmt::format("'tool_choice.type' \"{}\" is not supported (\"function\" only)", clip(type)));
        r.named = want_string(co, "name", "tool_choice", "tool_choice", true);
        r.choice = Choice::Named;
        bool found = false;
        for (const auto& t : r.tools) found = found || t.name == r.named;
        if (!found) bad("tool_choice", fmt::format("'tool_choice.name' '{}' is not one of 'tools'", r.named.substr(0, 64)));
    }
    if (r.tools.empty() && (r.choice == Choice::Required || r.choice == Choice::Named))
        bad("tool_choice", "'tool_choice' \"required\" or a function needs 'tools'");
}

// reasoning: {effort: low|medium|high, summary}. No summaries are written:
// a reasoning item carries the whole reasoning (see the docs).
std::string parse_reasoning(const element& e, nlohmann::json& echo) {
    object o = want_object(e, "reasoning", "reasoning");
    std::string effort;
    if (auto ef = field(o, "effort")) {
        if (ef->type() != element_type::STRING) bad("reasoning", "'reasoning.effort' must be a string");
        effort = std::string(ef->get_string().value_unsafe());
        if (effort != "low" && effort != "medium" && effort != "high")
            bad("reasoning", fmt::format("'reasoning.effort' must be \"low\", \"medium\" or \"high\"; got '{}'", clip(effort)));
    }
    for (const char* key : {"summary", "generate_summary"})
        if (auto s = field(o, key)) {
            const std::string v = s->type() == element_type::STRING ? std::string(s->get_string().value_unsafe()) : "";
            if (v != "auto" && v != "concise" && v != "detailed")
                bad("reasoning", fmt::format("'reasoning.{}' must be \"auto\", \"concise\" or \"detailed\"", key));
        }
    echo = {{"effort", effort.empty() ? nlohmann::json(nullptr) : nlohmann::json(effort)}, {"summary", nullptr}};
    return effort;
}

// text: {format: {type: text | json_object | json_schema (name, schema,
// description, strict)}}: the constraint response_format gives on the chat
// route, flat as the Responses API writes it.
OutputConstraint parse_text(const element& e) {
    OutputConstraint c;
    c.field = "text";
    object o = want_object(e, "text", "text");
    if (auto v = field(o, "verbosity"))
        if (v->type() != element_type::STRING || v->get_string().value_unsafe() != "medium")
            bad("text", "'text.verbosity' is not supported (only \"medium\", the default)");
    auto f = field(o, "format");
    if (!f) return c;
    object fo = want_object(*f, "text", "text.format");
    const std::string type = want_string(fo, "type", "text", "text.format", true);
    if (type == "text") return c;
    if (type == "json_object") {
        c.kind = OutputConstraint::Kind::JsonObject;
        return c;
    }
    if (type != "json_schema")
        bad("text", fmt::format("'text.format.type' must be text, json_object or json_schema; got '{}'", clip(type)));
    want_string(fo, "name", "text", "text.format", false);  // a label; type-checked only
    want_string(fo, "description", "text", "text.format", false);
    if (auto s = field(fo, "strict"); s && s->type() != element_type::BOOL)
        bad("text", "'text.format.strict' must be a boolean");
    auto schema = field(fo, "schema");
    if (!schema) bad("text", "'text.format.schema' is required");
    if (schema->type() != element_type::OBJECT && schema->type() != element_type::BOOL)
        bad("text", fmt::format("'text.format.schema' must be an object, not {}", type_name(schema->type())));
    c.kind = OutputConstraint::Kind::JsonSchema;
    c.text = simdjson::minify(*schema);
    return c;
}

// Fields of the API this server cannot honour: a 400 naming each, rather
// than an answer that silently differs from what was asked.
void refuse_unsupported(const object& obj) {
    if (auto b = get_bool(obj, "background"); b && *b)
        bad("background", "'background': true is not supported (responses run while the request is open)");
    for (const char* key : {"conversation", "prompt", "top_logprobs", "max_tool_calls", "context_management"})
        if (field(obj, key)) bad(key, fmt::format("'{}' is not supported", key));
    if (auto t = get_string(obj, "truncation"); t && *t != "disabled")
        bad("truncation", "'truncation' must be \"disabled\" (input that does not fit the context is a 400)");
    if (auto inc = field(obj, "include")) {
        if (inc->type() != element_type::ARRAY) bad("include", "'include' must be an array of strings");
        simdjson::dom::array arr = inc->get_array().value_unsafe();
        for (element v : arr) {
            if (v.type() != element_type::STRING) bad("include", "'include' must be an array of strings");
            // Reasoning items carry their text in `content` already; this
            // server encrypts nothing, so there is nothing more to include.
            if (v.get_string().value_unsafe() != "reasoning.encrypted_content")
                bad("include", fmt::format("'include' value '{}' is not supported",
                                           clip(std::string(v.get_string().value_unsafe()))));
        }
    }
    if (auto md = field(obj, "metadata")) {
        if (md->type() != element_type::OBJECT) bad("metadata", "'metadata' must be an object of strings");
        size_t n = 0;
        object mo = md->get_object().value_unsafe();
        for (auto kv : mo) {
            if (++n > 16) bad("metadata", "'metadata' has more than 16 keys");
            if (kv.value.type() != element_type::STRING) bad("metadata", "'metadata' values must be strings");
            if (kv.key.size() > 64 || kv.value.get_string().value_unsafe().size() > 512)
                bad("metadata", "'metadata' keys are at most 64 bytes and values at most 512");
        }
    }
    for (const char* key : {"user", "safety_identifier", "prompt_cache_key", "service_tier"})
        if (auto v = field(obj, key); v && v->type() != element_type::STRING)
            bad(key, fmt::format("'{}' must be a string", key));
}

}  // namespace

std::string new_response_id() {
    static thread_local std::mt19937_64 rng{[] {
        std::random_device rd;
        std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
        return std::mt19937_64(seq);
    }()};
    return fmt::format("resp_{:016x}{:016x}", rng(), rng());
}

ResponsesRequest parse_responses_request(std::string_view body, const RequestLimits& limits) {
    simdjson::dom::parser parser;
    simdjson::padded_string storage;
    object obj = parse_object(parser, storage, body, limits);
    ResponsesRequest r;
    r.gen.origin = "responses";
    r.gen.job_id = new_response_id();
    r.gen.add_special = false;  // the template writes BOS when the model wants one
    r.gen.parse_special = true;
    refuse_unsupported(obj);
    if (auto m = get_string(obj, "model")) r.model = *m;
    if (auto ins = field(obj, "instructions")) {
        if (ins->type() != element_type::STRING)
            bad("instructions", fmt::format("'instructions' must be a string, not {}", type_name(ins->type())));
        r.instructions = std::string(ins->get_string().value_unsafe());
        service::check_prompt(r.instructions, "instructions", limits, true);
    }
    r.input = parse_input(obj, limits);
    if (auto p = get_string(obj, "previous_response_id")) {
        bool ok = !p->empty() && p->size() <= kMaxResponseIdBytes;
        for (unsigned char c : *p) ok = ok && (std::isalnum(c) || c == '_' || c == '-');
        if (!ok)
            bad("previous_response_id", fmt::format("'previous_response_id' must be 1 to {} letters, digits, '_' or '-'",
                                                    kMaxResponseIdBytes));
        r.previous_response_id = *p;
    }
    if (auto s = get_bool(obj, "store")) r.store = *s;
    if (auto s = get_bool(obj, "stream")) r.stream = *s;
    std::optional<int64_t> max_out = get_int(obj, "max_output_tokens", 1, limits.max_tokens);
    if (max_out) r.gen.max_tokens = uint32_t(*max_out);
    if (auto v = get_number(obj, "temperature", 0, 2)) r.gen.sampling.temperature = *v;
    if (auto v = get_number(obj, "top_p", 0, 1)) r.gen.sampling.top_p = *v;

    nlohmann::json reasoning_echo = {{"effort", nullptr}, {"summary", nullptr}};
    if (auto t = field(obj, "tools")) parse_tools(*t, r.tools);
    if (auto c = field(obj, "tool_choice")) parse_tool_choice(*c, r.tools);
    if (auto p = get_bool(obj, "parallel_tool_calls")) r.tools.parallel = *p;
    if (auto re = field(obj, "reasoning")) r.tools.reasoning_effort = parse_reasoning(*re, reasoning_echo);
    if (auto t = field(obj, "text")) r.gen.constraint = parse_text(*t);
    // (The chat route's check, named in this API's words.)
    if (r.tools.forced() && r.gen.constraint.active())
        bad("tool_choice", "'tool_choice' \"required\" or a function cannot be combined with a JSON 'text.format'");

    nlohmann::json text_echo = {{"format", {{"type", "text"}}}};
    if (auto t = field(obj, "text"); t && field(t->get_object().value_unsafe(), "format"))
        text_echo["format"] = to_json(*field(t->get_object().value_unsafe(), "format"));
    r.echo = {
        {"instructions", r.instructions.empty() && !field(obj, "instructions") ? nlohmann::json(nullptr)
                                                                              : nlohmann::json(r.instructions)},
        {"max_output_tokens", max_out ? nlohmann::json(*max_out) : nlohmann::json(nullptr)},
        {"metadata", field(obj, "metadata") ? to_json(*field(obj, "metadata")) : nlohmann::json::object()},
        {"parallel_tool_calls", r.tools.parallel},
        {"previous_response_id", r.previous_response_id.empty() ? nlohmann::json(nullptr)
                                                                : nlohmann::json(r.previous_response_id)},
        {"reasoning", reasoning_echo},
        {"store", r.store},
        {"temperature", r.gen.sampling.temperature},
        {"text", text_echo},
        {"tool_choice", field(obj, "tool_choice") ? to_json(*field(obj, "tool_choice")) : nlohmann::json("auto")},
        {"tools", field(obj, "tools") ? to_json(*field(obj, "tools")) : nlohmann::json::array()},
        {"top_p", r.gen.sampling.top_p},
        {"truncation", "disabled"},
    };
    if (auto u = get_string(obj, "user")) r.echo["user"] = *u;
    return r;
}

}  // namespace eh::http
