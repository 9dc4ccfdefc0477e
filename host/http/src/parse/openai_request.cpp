#include "parse/openai_request.hpp"

#include <fmt/format.h>

#include <random>

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

std::vector<ChatMessage> parse_messages(const object& obj, const RequestLimits& limits) {
    return read_messages(obj, limits, {"system", "developer", "user", "assistant", "tool"}, "",
                         [](const object& mo, size_t i, const std::string& role, std::vector<ChatMessage>& out) {
                             ChatMessage cm;
                             cm.role = role;
                             if (auto c = field(mo, "content"))
                                 cm.content = text_content(*c, "messages", fmt::format("messages[{}].content", i));
                             parse_message_tool_fields(mo, i, cm);
                             out.push_back(std::move(cm));
                         });
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
    if (chat) {
        r.messages = parse_messages(obj, limits);
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
    if (chat) r.tools = parse_chat_tools(obj);
    else if (field(obj, "tools")) throw RequestError("tools", "'tools' is served on /v1/chat/completions only");
    return r;
}

}  // namespace eh::http
