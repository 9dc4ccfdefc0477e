// The OpenAI Responses API: POST /v1/responses (streamed as the API's
// semantic events, or whole), GET and DELETE /v1/responses/{id} over the
// bounded store of finished responses (responses_store.hpp) that
// previous_response_id continues from. The request is parsed by
// parse/responses_request.cpp, rendered and run as a chat request (the
// same template, tool-call parsing and constraints as /v1/chat/completions),
// and its output written by ResponsesOutput. Errors use the server's
// OpenAI-shaped envelope (code, message, type, param).
#pragma once

#include "eh/http/server.hpp"

namespace eh::http {

void install_responses(Server::Impl& s);

}  // namespace eh::http
