#include "parse/openai_request.hpp"

#include <fmt/format.h>

#include <random>

#include "eh/constrain/grammar.hpp"
#include "parse/chat_messages.hpp"
#include "parse/constraint_fields.hpp"
#include "parse/json_fields.hpp"
#include "parse/tool_fields.hpp"

namespace eh::http {

using namespace json;

namespace {

std::string generated_id(const char* prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    return fmt::format("{}-{:016x}", prefix, rng());
}

std::vector<ChatMessage> parse_messages(const object& obj, const RequestLimits& limits, RequestImages& images) {
    return read_messages(obj, limits, {"system", "developer", "user", "assistant", "tool"}, "",
                         [&](const object& mo, size_t i, const std::string& role, std::vector<ChatMessage>& out) {
                             ChatMessage cm;
                             cm.role = role;
                             const std::string where = fmt::format("messages[{}].content", i);
                             if (auto c = field(mo, "content")) {
                                 if (role == "user") user_content(*c, "messages", where, limits, cm, images);
                                 else cm.content = text_content(*c, "messages", where);
                             }
                             parse_message_tool_fields(mo, i, cm);
                             out.push_back(std::move(cm));
                         });
}

// vLLM's structured-output fields: guided_json / guided_regex /
// guided_choice / guided_grammar (before vLLM 0.12), and their successor
// structured_outputs {json | regex | choice | grammar | json_object}. At
// most one constraint may be asked for; `field` names it in errors.
OutputConstraint vllm_constraint(const std::string& field, const std::string& kind, const element& v) {
    OutputConstraint c;
    c.field = field;
    const std::string what = field == "structured_outputs" ? "'structured_outputs." + kind + "'" : "'" + field + "'";
    try {
        if (kind == "json") {
            c.kind = OutputConstraint::Kind::JsonSchema;
            if (v.type() == element_type::OBJECT || v.type() == element_type::BOOL) {
                c.text = simdjson::minify(v);
            } else if (v.type() == element_type::STRING) {  // the schema as JSON text
                simdjson::dom::parser p;
                const simdjson::padded_string text(std::string(v.get_string().value_unsafe()));
                element schema;
                if (p.parse(text).get(schema) != simdjson::SUCCESS ||
                    (schema.type() != element_type::OBJECT && schema.type() != element_type::BOOL))
                    throw RequestError(field, what + " must be a JSON schema: an object, or a string holding one");
                c.text = simdjson::minify(schema);
            } else {
                throw RequestError(field, fmt::format("{} must be an object (a JSON schema), not {}", what, type_name(v.type())));
            }
        } else if (kind == "regex") {
            if (v.type() != element_type::STRING)
                throw RequestError(field, fmt::format("{} must be a string, not {}", what, type_name(v.type())));
            const std::string pattern(v.get_string().value_unsafe());
            c.kind = OutputConstraint::Kind::Prebuilt;
            c.grammar = constrain::regex_output_grammar(pattern);
            c.text = "regex:" + pattern;
        } else if (kind == "choice") {
            if (v.type() != element_type::ARRAY)
                throw RequestError(field, fmt::format("{} must be an array of strings, not {}", what, type_name(v.type())));
            std::vector<std::string> choices;
            const simdjson::dom::array arr = v.get_array().value_unsafe();
            for (const element& e : arr) {
                if (e.type() != element_type::STRING)
                    throw RequestError(field, fmt::format("{} must hold strings only, not {}", what, type_name(e.type())));
                choices.emplace_back(e.get_string().value_unsafe());
            }
            c.kind = OutputConstraint::Kind::Prebuilt;
            c.grammar = constrain::choice_grammar(choices);
            c.text = "choice:" + simdjson::minify(v);
        } else if (kind == "grammar") {
            if (v.type() != element_type::STRING)
                throw RequestError(field, fmt::format("{} must be a string, not {}", what, type_name(v.type())));
            c.kind = OutputConstraint::Kind::Grammar;
            c.text = std::string(v.get_string().value_unsafe());
        } else {  // json_object
            if (v.type() != element_type::BOOL || !v.get_bool().value_unsafe())
                throw RequestError(field, what + " must be true when given");
            c.kind = OutputConstraint::Kind::JsonObject;
        }
    } catch (const constrain::GrammarError& e) {
        throw RequestError(field, std::string(e.what()));
    }
    return c;
}

OutputConstraint get_vllm_constraint(const object& obj) {
    struct Asked {
        std::string field, kind;
        element value;
    };
    std::vector<Asked> asked;
    for (const char* kind : {"json", "regex", "choice", "grammar"})
        if (auto v = field(obj, std::string("guided_") + kind)) asked.push_back({std::string("guided_") + kind, kind, *v});
    if (field(obj, "guided_whitespace_pattern"))
        throw RequestError("guided_whitespace_pattern", "'guided_whitespace_pattern' is not supported (JSON output "
                                                        "uses its own whitespace rules)");
    if (auto so = field(obj, "structured_outputs")) {
        if (so->type() != element_type::OBJECT)
            throw RequestError("structured_outputs", fmt::format("'structured_outputs' must be an object, not {}",
                                                                 type_name(so->type())));
        const object o = so->get_object().value_unsafe();
        for (const char* unsupported : {"whitespace_pattern", "structural_tag"})
            if (field(o, unsupported))
                throw RequestError("structured_outputs",
                                   fmt::format("'structured_outputs.{}' is not supported", unsupported));
        size_t n = 0;
        for (const char* kind : {"json", "regex", "choice", "grammar", "json_object"})
            if (auto v = field(o, kind)) asked.push_back({"structured_outputs", kind, *v}), ++n;
        if (n == 0)
            throw RequestError("structured_outputs", "'structured_outputs' needs one of json, regex, choice, grammar "
                                                     "or json_object");
    }
    if (asked.empty()) return {};
    if (asked.size() > 1) {
        auto name = [](const Asked& a) { return a.field == "structured_outputs" ? a.field + "." + a.kind : a.field; };
        throw RequestError(asked[1].field, fmt::format("give at most one output constraint; got '{}' and '{}'",
                                                       name(asked[0]), name(asked[1])));
    }
    return vllm_constraint(asked[0].field, asked[0].kind, asked[0].value);
}

}  // namespace

OpenAIRequest parse_openai_request(std::string_view body, bool chat, const RequestLimits& limits) {
    simdjson::dom::parser parser;
    simdjson::padded_string storage;
    object obj = parse_object(parser, storage, body, limits);
    OpenAIRequest r;
    r.chat = chat;
    r.gen.origin = chat ? "chat" : "completions";
    r.gen.job_id = generated_id(chat ? "chatcmpl" : "cmpl");
    if (auto m = get_string(obj, "model")) r.model = *m;
    if (auto a = get_string(obj, "lora")) {  // a --lora adapter's name; the service checks it
        if (a->empty() || a->size() > 256) throw RequestError("lora", "'lora' must name an adapter (1-64 bytes)");
        r.gen.adapter = std::move(*a);
    }
    if (chat) {
        r.messages = parse_messages(obj, limits, r.gen.images);
        r.gen.add_special = false;  // the template (or render_chat) writes BOS when the model wants one
        r.gen.parse_special = true;
    } else {
        auto p = field(obj, "prompt");
        if (!p) throw RequestError("prompt", "'prompt' is required");
        if (p->type() == element_type::STRING) {
            r.gen.prompt = std::string(p->get_string().value_unsafe());
        } else if (p->type() == element_type::ARRAY) {
            auto arr = p->get_array().value_unsafe();
            if (arr.size() != 1 || arr.at(0).type() != element_type::STRING)
                throw RequestError("prompt", "'prompt' arrays must hold exactly one string (batches are not supported)");
            r.gen.prompt = std::string(arr.at(0).get_string().value_unsafe());
        } else {
            throw RequestError("prompt", fmt::format("'prompt' must be a string, not {}", type_name(p->type())));
        }
        service::check_prompt(r.gen.prompt, "prompt", limits);
        if (auto echo = get_bool(obj, "echo"); echo && *echo) throw RequestError("echo", "'echo' is not supported");
        if (auto s = get_string(obj, "suffix"); s && !s->empty()) throw RequestError("suffix", "'suffix' is not supported");
    }
    if (auto n = get_int(obj, "n", 1, 16)) r.n = uint32_t(*n);  // Service::kMaxN
    if (auto n = get_int(obj, "best_of", 1, 1000000); n && *n != 1) throw RequestError("best_of", "'best_of' must be 1");
    const char* max_key = chat && field(obj, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (auto v = get_int(obj, max_key, 1, limits.max_tokens)) r.gen.max_tokens = uint32_t(*v);
    else if (!chat) r.gen.max_tokens = std::min<uint32_t>(16, limits.max_tokens);  // OpenAI's default
    if (auto v = get_number(obj, "temperature", 0, 2)) r.gen.sampling.temperature = *v;
    if (auto v = get_number(obj, "top_p", 0, 1)) r.gen.sampling.top_p = *v;
    if (auto v = get_int(obj, "top_k", 0, INT32_MAX)) r.gen.sampling.top_k = int32_t(*v);
    if (auto v = get_number(obj, "min_p", 0, 1)) r.gen.sampling.min_p = *v;
    if (auto v = get_number(obj, "repetition_penalty", 0, 2, true)) r.gen.sampling.repetition_penalty = *v;
    get_penalties(obj, r.gen.sampling, limits);
    r.gen.stop = get_stop(obj, "stop", limits);
    if (auto v = get_bool(obj, "ignore_eos")) r.gen.ignore_eos = *v;  // vLLM's and llama-server's extension
    r.gen.sampling.seed = get_uint64(obj, "seed");
    if (auto s = get_bool(obj, "stream")) r.stream = *s;
    if (auto so = field(obj, "stream_options")) {
        if (so->type() != element_type::OBJECT)
            throw RequestError("stream_options", fmt::format("'stream_options' must be an object, not {}", type_name(so->type())));
        if (auto u = get_bool(so->get_object().value_unsafe(), "include_usage")) r.include_usage = *u;
    }
    if (chat) {
        if (auto lp = get_bool(obj, "logprobs")) r.logprobs = *lp;
        auto top = get_int(obj, "top_logprobs", 0, 20);
        if (top && !r.logprobs) throw RequestError("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (r.logprobs) r.gen.top_logprobs = int(top.value_or(0));
    } else if (auto lp = get_int(obj, "logprobs", 0, 5)) {
        r.logprobs = true;
        r.gen.top_logprobs = int(*lp);
    }
    r.gen.constraint = get_response_format(obj);
    if (OutputConstraint v = get_vllm_constraint(obj); v.active()) {
        if (r.gen.constraint.active())
            throw RequestError(v.field, fmt::format("give at most one output constraint; got 'response_format' and '{}'",
                                                    v.field));
        r.gen.constraint = std::move(v);
    }
    if (chat) r.tools = parse_chat_tools(obj);
    else if (field(obj, "tools")) throw RequestError("tools", "'tools' is served on /v1/chat/completions only");
    return r;
}

}  // namespace eh::http
