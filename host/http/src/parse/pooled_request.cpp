#include "parse/pooled_request.hpp"

#include <fmt/format.h>

#include "eh/service/pooling.hpp"
#include "parse/json_fields.hpp"

namespace eh::http {

using namespace json;

namespace {

// One array of token ids; `name` is the element's path for messages.
std::vector<int32_t> token_ids(const simdjson::dom::array& arr, const std::string& name) {
    std::vector<int32_t> out;
    size_t i = 0;
    for (element t : arr) {
        if (t.type() != element_type::INT64 && t.type() != element_type::UINT64)
            throw RequestError("input", fmt::format("'{}[{}]' must be a token id (an integer), not {}", name, i,
                                                    type_name(t.type())));
        const int64_t v = t.type() == element_type::INT64 ? t.get_int64().value_unsafe() : INT64_MAX;
        if (v < 0 || v > INT32_MAX)
            throw RequestError("input", fmt::format("'{}[{}]' is not a token id (0..{})", name, i, INT32_MAX));
        out.push_back(int32_t(v));
        ++i;
    }
    if (out.empty()) throw RequestError("input", fmt::format("'{}' is an empty array of token ids", name));
    return out;
}

service::PooledInput text_input(std::string text, const std::string& name, const RequestLimits& limits) {
    if (text.empty()) throw RequestError("input", fmt::format("'{}' must not be an empty string", name));
    service::check_prompt(text, "input", limits);
    service::PooledInput in;
    in.text = std::move(text);
    return in;
}

void check_count(size_t n, std::string_view field) {
    if (n > service::kMaxPooledInputs)
        throw RequestError(std::string(field), fmt::format("'{}' holds more than {} inputs; the limit is {} per request",
                                                           field, service::kMaxPooledInputs, service::kMaxPooledInputs));
}

}  // namespace

EmbeddingsRequest parse_embeddings_request(std::string_view body, const RequestLimits& limits) {
    simdjson::dom::parser parser;
    simdjson::padded_string storage;
    object obj = parse_object(parser, storage, body, limits);
    reject_unknown(obj, {"input", "model", "encoding_format", "dimensions", "user"});
    EmbeddingsRequest r;
    if (auto m = get_string(obj, "model")) r.model = *m;
    if (auto f = get_string(obj, "encoding_format")) {
        if (*f != "float" && *f != "base64")
            throw RequestError("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        r.base64 = *f == "base64";
    }
    if (auto d = get_int(obj, "dimensions", 1, INT32_MAX)) r.dimensions = uint32_t(*d);
    get_string(obj, "user");  // accepted, unused: a string or absent
    auto in = field(obj, "input");
    if (!in) throw RequestError("input", "'input' is required");
    switch (in->type()) {
    case element_type::STRING:
        r.inputs.push_back(text_input(std::string(in->get_string().value_unsafe()), "input", limits));
        break;
    case element_type::ARRAY: {
        simdjson::dom::array arr = in->get_array().value_unsafe();
        if (arr.size() == 0) throw RequestError("input", "'input' must not be an empty array");
        const element_type first = (*arr.begin()).type();
        if (first == element_type::INT64 || first == element_type::UINT64) {
            // One input given as token ids.
            service::PooledInput t;
            t.is_tokens = true;
            t.tokens = token_ids(arr, "input");
            r.inputs.push_back(std::move(t));
            break;
        }
        check_count(arr.size(), "input");
        size_t i = 0;
        for (element e : arr) {
            const std::string name = fmt::format("input[{}]", i++);
            if (e.type() == element_type::STRING) {
                r.inputs.push_back(text_input(std::string(e.get_string().value_unsafe()), name, limits));
            } else if (e.type() == element_type::ARRAY) {
                service::PooledInput t;
                t.is_tokens = true;
                t.tokens = token_ids(e.get_array().value_unsafe(), name);
                r.inputs.push_back(std::move(t));
            } else {
                throw RequestError("input", fmt::format("'{}' must be a string or an array of token ids, not {}", name,
                                                        type_name(e.type())));
            }
        }
        break;
    }
    default:
        throw RequestError("input", fmt::format("'input' must be a string or an array (of strings, of token ids, or "
                                                "of arrays of token ids), not {}",
                                                type_name(in->type())));
    }
    return r;
}

RerankRequest parse_rerank_request(std::string_view body, const RequestLimits& limits) {
    simdjson::dom::parser parser;
    simdjson::padded_string storage;
    object obj = parse_object(parser, storage, body, limits);
    reject_unknown(obj, {"query", "documents", "model", "top_n", "return_documents", "user"});
    RerankRequest r;
    if (auto m = get_string(obj, "model")) r.model = *m;
    get_string(obj, "user");
    auto q = get_string(obj, "query");
    if (!q) throw RequestError("query", "'query' is required");
    if (q->empty()) throw RequestError("query", "'query' must not be an empty string");
    service::check_prompt(*q, "query", limits);
    r.query = std::move(*q);
    if (auto n = get_int(obj, "top_n", 1, INT32_MAX)) r.top_n = uint32_t(*n);
    if (auto b = get_bool(obj, "return_documents")) r.return_documents = *b;
    auto docs = field(obj, "documents");
    if (!docs) throw RequestError("documents", "'documents' is required");
    if (docs->type() != element_type::ARRAY)
        throw RequestError("documents", fmt::format("'documents' must be an array, not {}", type_name(docs->type())));
    simdjson::dom::array arr = docs->get_array().value_unsafe();
    if (arr.size() == 0) throw RequestError("documents", "'documents' must not be an empty array");
    check_count(arr.size(), "documents");
    size_t i = 0;
    for (element e : arr) {
        const std::string name = fmt::format("documents[{}]", i++);
        std::string text;
        if (e.type() == element_type::STRING) {
            text = std::string(e.get_string().value_unsafe());
        } else if (e.type() == element_type::OBJECT) {
            object d = e.get_object().value_unsafe();
            reject_unknown(d, {"text"});
            auto t = get_string(d, "text");
            if (!t) throw RequestError("documents", fmt::format("'{}.text' is required", name));
            text = std::move(*t);
        } else {
            throw RequestError("documents", fmt::format("'{}' must be a string or an object with \"text\", not {}", name,
                                                        type_name(e.type())));
        }
        if (text.empty()) throw RequestError("documents", fmt::format("'{}' must not be an empty string", name));
        service::check_prompt(text, "documents", limits);
        r.documents.push_back(std::move(text));
    }
    return r;
}

}  // namespace eh::http
