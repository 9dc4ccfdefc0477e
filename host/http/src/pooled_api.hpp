// Final hidden states over HTTP: POST /v1/embeddings (OpenAI's shape; float
// or base64; many inputs batched through the scheduler's step) and POST
// /v1/rerank and /rerank (llama-server's and vLLM's shape), each served by a
// server started in that mode (--embedding, --rerank, or the model's GGUF
// pooling type). Their bodies are parsed by parse/pooled_request.cpp.
#pragma once

#include "eh/http/server.hpp"

namespace eh::http {

void install_pooled(Server::Impl& s);

}  // namespace eh::http
