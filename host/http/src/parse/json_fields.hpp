// Typed field access on a simdjson DOM object with precise messages, for
// the request parsers of every endpoint (parse/*_request.cpp). Null counts as
// absent, so clients that send `"field": null` get the default. Every broken
// rule is a service::RequestError naming the field.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/request.hpp"

namespace eh::http::json {

// What the parsers fill in: the service's input types.
using service::ChatMessage;
using service::ChatToolCall;
using service::ChatToolRequest;
using service::OutputConstraint;
using service::RequestError;
using service::RequestLimits;
using service::Sampling;
using service::ToolDef;

using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;

const char* type_name(element_type t);

// Parses `body` (size-checked) into the parser and returns the root object.
// Duplicate keys are rejected at every depth (reject_duplicate_keys).
object parse_object(simdjson::dom::parser& parser, simdjson::padded_string& storage,
                    std::string_view body, const RequestLimits& limits);

// Refuses an object anywhere in `root` that holds a key twice (compared
// after unescaping, so "a" and "\u0061" are the same key): which of two
// values wins is a guess, and a gateway in front may guess the other way.
// The RequestError's field is the top-level key it is under; the message
// names the path: "duplicate field 'messages[0].role'".
void reject_duplicate_keys(const element& root);

// Rejects keys outside `allowed`.
void reject_unknown(const object& obj, std::initializer_list<std::string_view> allowed);

std::optional<element> field(const object& obj, std::string_view key);
std::optional<std::string> get_string(const object& obj, std::string_view key);
std::optional<double> get_number(const object& obj, std::string_view key, double lo, double hi,
                                 bool lo_open = false);
std::optional<int64_t> get_int(const object& obj, std::string_view key, int64_t lo, int64_t hi);
std::optional<uint64_t> get_uint64(const object& obj, std::string_view key);
std::optional<bool> get_bool(const object& obj, std::string_view key);
// {"<token id>": bias, ...} with biases in [-100, 100] (OpenAI's logit_bias).
std::vector<std::pair<int32_t, float>> get_logit_bias(const object& obj, std::string_view key,
                                                      const RequestLimits& limits);
// presence_penalty / frequency_penalty / logit_bias into `s`.
void get_penalties(const object& obj, Sampling& s, const RequestLimits& limits);
// A string or an array of strings.
std::vector<std::string> get_stop(const object& obj, std::string_view key, const RequestLimits& limits);

}  // namespace eh::http::json
