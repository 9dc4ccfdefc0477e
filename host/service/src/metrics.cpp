#include "eh/service/metrics.hpp"

#include <fmt/format.h>

namespace eh::service {
namespace {

std::string num(double v) { return fmt::format("{}", v); }

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        cum += counts_[i];
        out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, num(bounds_[i]), cum);
    }
    cum += counts_.back();
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cum);
    out += fmt::format("{}_sum {}\n{}_count {}\n", name, num(sum_), name, count_);
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      queue_({0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      e2e_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300}),
      inference_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300}) {}

void Metrics::request(const std::string& endpoint, const std::string& outcome) {
    std::lock_guard lock(mu_);
    ++requests_[{endpoint, outcome}];
}

void Metrics::http_response(const std::string& route, int status) {
    std::lock_guard lock(mu_);
    ++http_[{route, std::to_string(status / 100) + "xx"}];
}

void Metrics::prompt_tokens(uint64_t n) {
    std::lock_guard lock(mu_);
    prompt_tokens_ += n;
}

void Metrics::tokens_generated(uint64_t n) {
    std::lock_guard lock(mu_);
    tokens_generated_ += n;
}

void Metrics::time_to_first_token(double s) {
    std::lock_guard lock(mu_);
    ttft_.observe(s);
}

void Metrics::inter_token_latency(double s) {
    std::lock_guard lock(mu_);
    itl_.observe(s);
}

void Metrics::queue_time(double s) {
    std::lock_guard lock(mu_);
    queue_.observe(s);
}

void Metrics::request_latency(double s) {
    std::lock_guard lock(mu_);
    e2e_.observe(s);
}

void Metrics::inference_duration(double s) {
    std::lock_guard lock(mu_);
    inference_.observe(s);
}

std::string Metrics::render(const Gauges& g) const {
    std::lock_guard lock(mu_);
    std::string out;
    out += "# HELP eh_requests_total Generation requests by endpoint and outcome.\n# TYPE eh_requests_total counter\n";
    for (const auto& [k, v] : requests_)
        out += fmt::format("eh_requests_total{{endpoint=\"{}\",outcome=\"{}\"}} {}\n", k.first, k.second, v);
    out += "# HELP eh_http_responses_total HTTP responses by route and status class.\n# TYPE eh_http_responses_total counter\n";
    for (const auto& [k, v] : http_)
        out += fmt::format("eh_http_responses_total{{route=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, v);
    out += "# HELP eh_prompt_tokens_total Prompt tokens processed.\n# TYPE eh_prompt_tokens_total counter\n";
    out += fmt::format("eh_prompt_tokens_total {}\n", prompt_tokens_);
    out += "# HELP eh_generated_tokens_total Tokens generated.\n# TYPE eh_generated_tokens_total counter\n";
    out += fmt::format("eh_generated_tokens_total {}\n", tokens_generated_);
    out += "# HELP eh_time_to_first_token_seconds Time from submission (queue time included) to the first generated token.\n"
           "# TYPE eh_time_to_first_token_seconds histogram\n";
    ttft_.render(out, "eh_time_to_first_token_seconds");
    out += "# HELP eh_inter_token_latency_seconds Time between consecutive generated tokens.\n"
           "# TYPE eh_inter_token_latency_seconds histogram\n";
    itl_.render(out, "eh_inter_token_latency_seconds");
    out += "# HELP eh_queue_time_seconds Time from submission to admission into the batch.\n"
           "# TYPE eh_queue_time_seconds histogram\n";
    queue_.render(out, "eh_queue_time_seconds");
    out += "# HELP eh_request_latency_seconds Time from submission to the end of a completed request.\n"
           "# TYPE eh_request_latency_seconds histogram\n";
    e2e_.render(out, "eh_request_latency_seconds");
    out += "# HELP eh_inference_duration_seconds Time from admission into the batch to the end of a completed request.\n"
           "# TYPE eh_inference_duration_seconds histogram\n";
    inference_.render(out, "eh_inference_duration_seconds");
    out += "# HELP eh_queue_depth Jobs waiting to run.\n# TYPE eh_queue_depth gauge\n";
    out += fmt::format("eh_queue_depth {}\n", num(g.queue_depth));
    out += "# HELP eh_active_jobs Jobs running now.\n# TYPE eh_active_jobs gauge\n";
    out += fmt::format("eh_active_jobs {}\n", num(g.active_jobs));
    // The Gateway API inference extension's model-server protocol:
    // TotalQueuedRequests, TotalRunningRequests, KVCacheUtilization.
    out += "# HELP eh_num_requests_waiting Requests waiting to start.\n# TYPE eh_num_requests_waiting gauge\n";
    out += fmt::format("eh_num_requests_waiting {}\n", num(g.queue_depth));
    out += "# HELP eh_num_requests_running Requests in the running batch.\n# TYPE eh_num_requests_running gauge\n";
    out += fmt::format("eh_num_requests_running {}\n", num(g.active_jobs));
    out += "# HELP eh_kv_cache_usage_perc Fraction (0-1) of KV-cache blocks held, cached prefixes included.\n"
           "# TYPE eh_kv_cache_usage_perc gauge\n";
    out += fmt::format("eh_kv_cache_usage_perc {}\n", num(g.kv_cache_usage));
    out += "# HELP eh_kv_cache_blocks Total KV-cache blocks.\n# TYPE eh_kv_cache_blocks gauge\n";
    out += fmt::format("eh_kv_cache_blocks {}\n", num(g.kv_blocks_total));
    out += "# HELP eh_prefix_cache_entries Finished sequences kept for prefix reuse.\n# TYPE eh_prefix_cache_entries gauge\n";
    out += fmt::format("eh_prefix_cache_entries {}\n", num(g.prefix_cache_entries));
    out += "# HELP eh_prefix_cache_lookups_total Prefix-cache lookups (one per admitted request).\n"
           "# TYPE eh_prefix_cache_lookups_total counter\n";
    out += fmt::format("eh_prefix_cache_lookups_total {}\n", num(g.prefix_lookups));
    out += "# HELP eh_prefix_cache_hits_total Lookups that reused a cached prefix.\n# TYPE eh_prefix_cache_hits_total counter\n";
    out += fmt::format("eh_prefix_cache_hits_total {}\n", num(g.prefix_hits));
    out += "# HELP eh_prefix_cache_query_tokens_total Prompt tokens looked up in the prefix cache.\n"
           "# TYPE eh_prefix_cache_query_tokens_total counter\n";
    out += fmt::format("eh_prefix_cache_query_tokens_total {}\n", num(g.prefix_query_tokens));
    out += "# HELP eh_prefix_cache_hit_tokens_total Prompt tokens reused from the prefix cache.\n"
           "# TYPE eh_prefix_cache_hit_tokens_total counter\n";
    out += fmt::format("eh_prefix_cache_hit_tokens_total {}\n", num(g.prefix_hit_tokens));
    out += "# HELP eh_preemptions_total Requests preempted (KV blocks freed, recomputed later).\n"
           "# TYPE eh_preemptions_total counter\n";
    out += fmt::format("eh_preemptions_total {}\n", num(g.preemptions));
    out += "# HELP eh_engine_steps_total Batched steps run by the engine.\n# TYPE eh_engine_steps_total counter\n";
    out += fmt::format("eh_engine_steps_total {}\n", num(g.engine_steps));
    out += "# HELP eh_engine_step_seconds_total Time in the engine's step calls (device work included).\n"
           "# TYPE eh_engine_step_seconds_total counter\n";
    out += fmt::format("eh_engine_step_seconds_total {}\n", num(g.engine_step_seconds));
    out += "# HELP eh_constraint_seconds_total Host time computing token masks and updating matchers for "
           "structured output.\n# TYPE eh_constraint_seconds_total counter\n";
    out += fmt::format("eh_constraint_seconds_total {}\n", num(g.constraint_seconds));
    out += "# HELP eh_vram_bytes Device memory held by the model.\n# TYPE eh_vram_bytes gauge\n";
    out += fmt::format("eh_vram_bytes {}\n", num(g.vram_bytes));
    out += "# HELP eh_context_length Tokens per sequence (prompt + output).\n# TYPE eh_context_length gauge\n";
    out += fmt::format("eh_context_length {}\n", num(g.context_length));
    out += "# HELP eh_ready 1 when the model is loaded and serving.\n# TYPE eh_ready gauge\n";
    out += fmt::format("eh_ready {}\n", g.ready ? 1 : 0);
    out += "# HELP eh_uptime_seconds Seconds since the process started.\n# TYPE eh_uptime_seconds gauge\n";
    out += fmt::format("eh_uptime_seconds {}\n", num(g.uptime_seconds));
    return out;
}

}  // namespace eh::service
