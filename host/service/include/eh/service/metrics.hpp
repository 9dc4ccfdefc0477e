// Prometheus metrics. Labels come from small fixed sets (endpoint, outcome,
// HTTP status class) so cardinality stays bounded: never a job id.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace eh::service {

class Histogram {
public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double v);
    // Appends the _bucket/_sum/_count lines.
    void render(std::string& out, const std::string& name) const;

private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // per bucket, not cumulative
    double sum_ = 0;
    uint64_t count_ = 0;
};

struct Gauges {
    double queue_depth = 0;            // requests waiting to start
    double active_jobs = 0;            // requests running (in the batch)
    double kv_cache_usage = 0;         // fraction of KV blocks held, cached prefixes included
    // Fraction of KV blocks the running requests hold: blocks only cached
    // prefixes hold count as free, since admission evicts them on demand
    // (vLLM's kv_cache_usage_perc counts its evictable cached blocks so).
    double kv_running_usage = 0;
    double kv_blocks_total = 0;
    double kv_block_tokens = 0;
    bool prefix_caching = false;
    // What the KV blocks hold ("f16", "q8_0", "fp8", "f32"; kv_cache_type.hpp),
    // "auto" when the plugin does not say: vllm:cache_config_info's cache_dtype.
    std::string kv_cache_type = "auto";
    std::string model_name;            // the first name clients use (vllm:* model_name label)
    double prefix_cache_entries = 0;
    // counters kept by the scheduler
    double prefix_lookups = 0, prefix_hits = 0, prefix_query_tokens = 0, prefix_hit_tokens = 0;
    // The prefix cache's host tier (--kv-host-bytes): its budget (0: off),
    // use and entries; entries parked and restored, their bytes; parked
    // entries dropped (for room, or made redundant by a longer one).
    double host_tier_budget = 0, host_tier_used = 0, host_tier_entries = 0;
    double host_tier_parks = 0, host_tier_park_bytes = 0, host_tier_restores = 0, host_tier_restore_bytes = 0;
    double host_tier_dropped = 0;
    double preemptions = 0;
    double engine_restarts = 0;        // engine processes started again after a crash (--engine-process)
    double engine_steps = 0, engine_step_seconds = 0, constraint_seconds = 0, engine_chained_steps = 0;
    // Speculative decoding: on (configured and the engine verifies); verify
    // items, the drafts they carried, the drafts accepted; steps it sat out
    // (more than --spec-max-batch decoding); time spent drafting.
    bool spec_on = false;
    double spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0, spec_off_steps = 0, spec_draft_seconds = 0;
    double vram_bytes = 0;
    double uptime_seconds = 0;
    double context_length = 0;
    // LoRA adapters (--lora), for vllm:lora_requests_info: every one loaded
    // (all are resident, ready to serve), and those waiting requests ask.
    std::vector<std::string> lora_loaded, lora_waiting;
    bool ready = false;
};

class Metrics {
public:
    Metrics();
    // endpoint: execute, completions, chat; outcome: completed, cancelled,
    // timeout, error, rejected_invalid, rejected_queue_full, rejected_shutdown
    void request(const std::string& endpoint, const std::string& outcome);
    void http_response(const std::string& route, int status);
    void prompt_tokens(uint64_t n);
    void tokens_generated(uint64_t n);
    void time_to_first_token(double seconds);
    void inter_token_latency(double seconds);
    void queue_time(double seconds);        // submission to admission into the batch
    void request_latency(double seconds);   // submission to the last token
    void inference_duration(double seconds);  // admission into the batch to the last token
    std::string render(const Gauges& g) const;

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, std::string>, uint64_t> requests_;
    std::map<std::pair<std::string, std::string>, uint64_t> http_;
    uint64_t prompt_tokens_ = 0;
    uint64_t tokens_generated_ = 0;
    Histogram ttft_;
    Histogram itl_;
    Histogram queue_;
    Histogram e2e_;
    Histogram inference_;
};

}  // namespace eh::service
