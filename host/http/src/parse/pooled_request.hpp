// The bodies of POST /v1/embeddings (OpenAI's shape) and POST /v1/rerank
// (the shape llama-server, vLLM, Jina and Cohere clients send). Every broken
// rule is a service::RequestError naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eh/service/pooling.hpp"
#include "eh/service/request.hpp"

namespace eh::http {

struct EmbeddingsRequest {
    std::string model;
    // `input`: a string, an array of strings, an array of token ids or an
    // array of such arrays; each one input.
    std::vector<service::PooledInput> inputs;
    bool base64 = false;                  // encoding_format "base64" (else "float")
    std::optional<uint32_t> dimensions;   // served only as the model's own size
};

struct RerankRequest {
    std::string model;
    std::string query;
    std::vector<std::string> documents;   // strings, or objects {"text": ...}
    std::optional<uint32_t> top_n;        // absent: every document
    bool return_documents = false;
};

EmbeddingsRequest parse_embeddings_request(std::string_view body, const service::RequestLimits& limits);
RerankRequest parse_rerank_request(std::string_view body, const service::RequestLimits& limits);

}  // namespace eh::http
