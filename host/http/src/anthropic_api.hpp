// The Anthropic Messages API: POST /v1/messages (streaming and not) and
// POST /v1/messages/count_tokens, over the same service as the OpenAI
// routes. Errors use Anthropic's shape:
// {"type":"error","error":{"type":"invalid_request_error","message":"..."}}.
#pragma once

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <string>

namespace eh::http {

// Anthropic's error type for an HTTP status: 400 invalid_request_error,
// 401 authentication_error, 403 permission_error, 404 not_found_error,
// 413 request_too_large, 429 rate_limit_error, 503 and 529
// overloaded_error, other 4xx invalid_request_error, anything else (499
// for a cancelled job included) api_error.
const char* anthropic_error_type(int status);
nlohmann::json anthropic_error_body(int status, const std::string& message);
void send_anthropic_error(httplib::Response& res, int status, const std::string& message);

}  // namespace eh::http
