// The serve flags for who may call the server and how much one request may
// send: API keys, HTTPS and the request limits (docs/http-api.md,
// "Authentication", "HTTPS" and "Limits").
#pragma once

#include <string>

#include "eh/http/server.hpp"
#include "options.hpp"

namespace eh::cli {

// The environment variable holding one more API key (keeps it out of `ps`).
inline constexpr const char* kApiKeyEnv = "ENGINE_HOST_API_KEY";

void add_serve_access_options(po::options_description& desc);

// Fills `so` from the flags and ENGINE_HOST_API_KEY; false with `err` set
// for a bad value (a bad key, an unreadable key file, a limit out of range).
bool apply_serve_access_options(const po::variables_map& vm, http::ServerOptions& so, std::string& err);

}  // namespace eh::cli
