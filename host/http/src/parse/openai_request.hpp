// The OpenAI-compatible request bodies: POST /v1/completions and
// /v1/chat/completions (`messages` and `tools`: chat only). Unknown fields
// are ignored (clients send many this server has no use for); fields it
// cannot honour are refused rather than silently dropped.
#pragma once

#include <cstdint>
#include <string_view>

#include "eh/service/request.hpp"

namespace eh::http {

struct OpenAIRequest : service::ChatRequest {
    bool chat = false;
    bool include_usage = false;
    bool logprobs = false;
    uint32_t n = 1;                    // choices: samples of the same prompt
};
OpenAIRequest parse_openai_request(std::string_view body, bool chat, const service::RequestLimits& limits);

}  // namespace eh::http
