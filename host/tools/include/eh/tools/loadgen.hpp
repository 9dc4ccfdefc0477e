// Throughput under load through the HTTP API: N client threads each send
// /v1/completions requests back to back (distinct prompts, temperature 0,
// a fixed number of output tokens), 2N requests per level, and the level
// reports aggregate completion tokens/s, requests/s and latency percentiles.
// The same shape as ../shared/peers/loadgen.py, so numbers compare. With
// `stream` the requests are streamed and each level also reports time to
// first token (TTFT) and time per output token after it (TPOT, as vLLM's
// benchmark defines it: (latency - TTFT) / (tokens - 1)), which is the
// decode rate one client sees, free of per-request costs.
// With `chat` the requests are the chat-like workload of chat_workload.hpp
// (long prompts, a shared preamble, drawn answer lengths), always streamed,
// and each level also reports the prompt tokens sent and the ones the
// server reused from its prefix cache (usage.prompt_tokens_details).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eh/tools/chat_workload.hpp"

namespace eh::tools {

struct LoadOptions {
    std::string url = "http://127.0.0.1:8080";  // the server's base URL
    std::vector<uint32_t> levels = {1, 4, 16, 64};
    uint32_t max_tokens = 128;
    uint32_t requests_per_client = 2;
    // "model" field; empty: the server's. Comma-separated names: client c
    // sends the (c mod n)-th (many adapters of one server, e.g. base:NAME).
    std::string model;
    bool ignore_eos = true;                      // every request generates max_tokens (vLLM/llama-server extension)
    bool stream = false;                         // stream the answers; measure TTFT and TPOT
    nlohmann::json extra = nlohmann::json::object();  // merged into every request body (e.g. response_format)
    uint32_t timeout_s = 600;                    // per request
    bool chat = false;                           // the chat-like workload (implies stream; max_tokens unused)
    ChatWorkload workload;                       // with chat
    std::function<void(const std::string&)> log; // progress, may be empty
};

struct LevelResult {
    uint32_t clients = 0;
    uint32_t requests = 0, failed = 0;
    uint64_t completion_tokens = 0;
    double seconds = 0;
    double tokens_per_s = 0, requests_per_s = 0;
    double latency_p50_s = 0, latency_p95_s = 0, latency_p99_s = 0;
    // With stream only (requests of at least 2 tokens for TPOT):
    double ttft_p50_s = 0, ttft_p95_s = 0, ttft_p99_s = 0;
    double tpot_p50_s = 0, tpot_p95_s = 0, tpot_p99_s = 0;
    bool streamed = false;
    // With chat only, over the requests that succeeded: the prompt tokens the
    // server counted and reused (usage), and how many began with the preamble.
    bool chat = false;
    uint64_t prompt_tokens = 0, cached_prompt_tokens = 0;
    uint32_t shared_prefix_requests = 0;
    std::string first_error;
};

// Throws eh::Error when the server cannot be reached at all.
std::vector<LevelResult> run_load(const LoadOptions& options);
std::string to_table(const std::vector<LevelResult>& r);
// With the options the run had: `chat` adds the workload's settings.
nlohmann::json to_json(const std::vector<LevelResult>& r, const LoadOptions& o);

}  // namespace eh::tools
