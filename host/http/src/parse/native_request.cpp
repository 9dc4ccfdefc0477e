#include "parse/native_request.hpp"

#include <fmt/format.h>

#include "parse/constraint_fields.hpp"
#include "parse/json_fields.hpp"

namespace eh::http {

using namespace json;

service::GenerationRequest parse_execute_request(std::string_view body, const RequestLimits& limits) {
    simdjson::dom::parser parser;
    simdjson::padded_string storage;
    object obj = parse_object(parser, storage, body, limits);
    reject_unknown(obj, {"job_id", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p",
                         "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "stop", "seed",
                         "logprobs", "add_special", "model", "lora", "n_ctx", "ignore_eos", "grammar", "json_schema",
                         "output_mode"});
    service::GenerationRequest r;
    auto id = get_string(obj, "job_id");
    if (!id) throw RequestError("job_id", "'job_id' is required");
    if (id->empty()) throw RequestError("job_id", "'job_id' must not be empty");
    if (id->size() > limits.max_job_id_bytes)
        throw RequestError("job_id", fmt::format("'job_id' is {} bytes; the limit is {}", id->size(), limits.max_job_id_bytes));
    if (id->find('\0') != std::string::npos) throw RequestError("job_id", "'job_id' contains a NUL character");
    r.job_id = *id;
    if (auto a = get_string(obj, "lora")) {  // a --lora adapter's name; the service checks it
        if (a->empty() || a->size() > 256) throw RequestError("lora", "'lora' must name an adapter (1-64 bytes)");
        r.adapter = std::move(*a);
    }
    auto prompt = get_string(obj, "prompt");
    if (!prompt) throw RequestError("prompt", "'prompt' is required");
    service::check_prompt(*prompt, "prompt", limits);
    r.prompt = std::move(*prompt);
    if (auto v = get_int(obj, "max_tokens", 1, limits.max_tokens)) r.max_tokens = uint32_t(*v);
    if (auto v = get_number(obj, "temperature", 0, 2)) r.sampling.temperature = *v;
    if (auto v = get_number(obj, "top_p", 0, 1)) r.sampling.top_p = *v;
    if (auto v = get_int(obj, "top_k", 0, INT32_MAX)) r.sampling.top_k = int32_t(*v);
    if (auto v = get_number(obj, "min_p", 0, 1)) r.sampling.min_p = *v;
    if (auto v = get_number(obj, "repetition_penalty", 0, 2, true)) r.sampling.repetition_penalty = *v;
    get_penalties(obj, r.sampling, limits);
    r.stop = get_stop(obj, "stop", limits);
    r.sampling.seed = get_uint64(obj, "seed");
    if (auto v = get_int(obj, "logprobs", 0, 20)) r.top_logprobs = int(*v);
    if (auto v = get_bool(obj, "add_special")) r.add_special = *v;
    if (auto v = get_bool(obj, "ignore_eos")) r.ignore_eos = *v;
    if (auto v = get_int(obj, "n_ctx", 1, service::kMaxRequestContext)) r.n_ctx = uint32_t(*v);
    r.constraint = get_native_constraint(obj);
    // Recorded, never acted on; a value the contract does not name is ignored.
    if (auto mode = get_string(obj, "output_mode"); mode && (*mode == "text" || *mode == "json" || *mode == "edits"))
        r.output_mode = *mode;
    return r;
}

TokenizeRequest parse_tokenize_request(std::string_view body, const RequestLimits& limits) {
    simdjson::dom::parser parser;
    simdjson::padded_string storage;
    object obj = parse_object(parser, storage, body, limits);
    reject_unknown(obj, {"text", "content", "add_special", "parse_special", "model"});  // model: native_model()
    TokenizeRequest r;
    auto text = get_string(obj, "text");
    if (!text) text = get_string(obj, "content");
    if (!text) throw RequestError("text", "'text' is required");
    service::check_prompt(*text, "text", limits, true);
    r.text = std::move(*text);
    if (auto v = get_bool(obj, "add_special")) r.add_special = *v;
    if (auto v = get_bool(obj, "parse_special")) r.parse_special = *v;
    return r;
}

std::vector<int32_t> parse_detokenize_request(std::string_view body, uint32_t vocab_size, const RequestLimits& limits) {
    simdjson::dom::parser parser;
    simdjson::padded_string storage;
    object obj = parse_object(parser, storage, body, limits);
    reject_unknown(obj, {"tokens", "model"});  // model: native_model()
    auto e = field(obj, "tokens");
    if (!e) throw RequestError("tokens", "'tokens' is required");
    if (e->type() != element_type::ARRAY) throw RequestError("tokens", fmt::format("'tokens' must be an array, not {}", type_name(e->type())));
    std::vector<int32_t> out;
    size_t i = 0;
    simdjson::dom::array arr_ = e->get_array().value_unsafe();
    for (element t : arr_) {
        if (t.type() != element_type::INT64 && t.type() != element_type::UINT64)
            throw RequestError("tokens", fmt::format("'tokens[{}]' must be an integer, not {}", i, type_name(t.type())));
        int64_t v = t.type() == element_type::INT64 ? t.get_int64().value_unsafe() : INT64_MAX;
        if (v < 0 || v >= int64_t(vocab_size))
            throw RequestError("tokens", fmt::format("'tokens[{}]' is not a token id (0..{})", i, vocab_size - 1));
        out.push_back(int32_t(v));
        ++i;
    }
    return out;
}

std::string parse_cancel_request(std::string_view body, const RequestLimits& limits) {
    simdjson::dom::parser parser;
    simdjson::padded_string storage;
    object obj = parse_object(parser, storage, body, limits);
    reject_unknown(obj, {"job_id"});
    auto id = get_string(obj, "job_id");
    if (!id) throw RequestError("job_id", "'job_id' is required");
    if (id->empty()) throw RequestError("job_id", "'job_id' must not be empty");
    return *id;
}

}  // namespace eh::http
