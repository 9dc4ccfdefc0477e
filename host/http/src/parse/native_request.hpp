// The native API's request bodies: POST /execute, /tokenize, /detokenize
// and /cancel. Unknown fields are refused (the API is this server's own, so
// a misspelt field is a mistake worth a 400).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/request.hpp"

namespace eh::http {

// POST /execute.
service::GenerationRequest parse_execute_request(std::string_view body, const service::RequestLimits& limits);

// POST /tokenize and /detokenize.
struct TokenizeRequest {
    std::string text;
    bool add_special = true;
    bool parse_special = false;
};
TokenizeRequest parse_tokenize_request(std::string_view body, const service::RequestLimits& limits);
std::vector<int32_t> parse_detokenize_request(std::string_view body, uint32_t vocab_size,
                                              const service::RequestLimits& limits);

// POST /cancel: the job id.
std::string parse_cancel_request(std::string_view body, const service::RequestLimits& limits);

}  // namespace eh::http
