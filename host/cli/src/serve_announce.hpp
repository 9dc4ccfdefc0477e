// How a server makes itself known: the address a router knows it by, and
// the --callback-url notice to an orchestrator once it serves.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace eh::cli {

// POSTs `body` ({worker_id, model_ref, vram_bytes, uri}) to `url`; false
// with `err` set when it is not an http(s) URL, the request fails or the
// answer is not 2xx.
bool post_callback(const std::string& url, const nlohmann::json& body, std::string& err);

// The address a router knows this server by, for the KV-event topic: `host`
// (--host), or for a wildcard the first IPv4 address of an interface that is
// up and not loopback (a pod's IP).
std::string advertised_host(const std::string& host);

}  // namespace eh::cli
