#include "eh/service/metrics.hpp"

#include <fmt/format.h>

#include <chrono>

namespace eh::service {
namespace {

std::string num(double v) { return fmt::format("{}", v); }

// A metric family's HELP and TYPE lines; its samples follow.
void head(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// A family of one unlabelled sample. `value` as fmt writes it: a count
// (uint64_t) stays exact; gauges come as num().
template <class V>
void single(std::string& out, std::string_view name, std::string_view type, std::string_view help, const V& value) {
    head(out, name, type, help);
    out += fmt::format("{} {}\n", name, value);
}
template <class V>
void counter(std::string& out, std::string_view name, std::string_view help, const V& value) {
    single(out, name, "counter", help, value);
}

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

namespace {

void histogram(std::string& out, std::string_view name, std::string_view help, const Histogram& h) {
    head(out, name, "histogram", help);
    h.render(out, std::string(name));
}

// A label value in the text format: backslash, quote and newline escaped.
std::string label_value(std::string_view v) {
    std::string o;
    for (char c : v) {
        if (c == '\\') o += "\\\\";
        else if (c == '"') o += "\\\"";
        else if (c == '\n') o += "\\n";
        else o += c;
    }
    return o;
}

// The gauges the Gateway API Inference Extension's endpoint picker reads
// by default (its model-server protocol, vLLM's names and labels): a pool
// of `engine-type: vllm` servers routes to this one unchanged. One engine
// serves here: engine="0".
void render_vllm(std::string& out, const Gauges& g) {
    const std::string labels = fmt::format("{{model_name=\"{}\",engine=\"0\"}}", label_value(g.model_name));
    head(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
    out += fmt::format("vllm:num_requests_running{} {}\n", labels, num(g.active_jobs));
    head(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
    out += fmt::format("vllm:num_requests_waiting{} {}\n", labels, num(g.queue_depth));
    head(out, "vllm:kv_cache_usage_perc", "gauge",
         "KV-cache usage. 1 means 100 percent usage (blocks only cached prefixes hold count as free).");
    out += fmt::format("vllm:kv_cache_usage_perc{} {}\n", labels, num(g.kv_running_usage));
    // Its name before vLLM 0.9, which earlier endpoint-picker releases read by default.
    head(out, "vllm:gpu_cache_usage_perc", "gauge",
         "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.");
    out += fmt::format("vllm:gpu_cache_usage_perc{} {}\n", labels, num(g.kv_running_usage));
    // LoRA: the model-server protocol's adapter gauge, whose value is when
    // it was last updated; running_lora_adapters names the adapters loaded
    // and ready to serve (here every --lora adapter is), max_lora how many
    // may be.
    if (!g.lora_loaded.empty()) {
        auto list = [](const std::vector<std::string>& v) {
            std::string o;
            for (const auto& n : v) o += (o.empty() ? "" : ",") + n;
            return o;
        };
        head(out, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
        out += fmt::format("vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\","
                           "waiting_lora_adapters=\"{}\"}} {}\n",
                           g.lora_loaded.size(), label_value(list(g.lora_loaded)), label_value(list(g.lora_waiting)),
                           num(double(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch()).count()) / 1000.0));
    }
    // An info gauge (always 1): the facts are its labels.
    head(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    out += fmt::format("vllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\",enable_prefix_caching=\"{}\","
                       "cache_dtype=\"{}\",engine=\"0\"}} 1\n",
                       uint64_t(g.kv_block_tokens), uint64_t(g.kv_blocks_total), g.prefix_caching ? "True" : "False",
                       g.kv_cache_type);
    if (!g.spec_on) return;  // vLLM has them only with speculative decoding
    head(out, "vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts.");
    out += fmt::format("vllm:spec_decode_num_drafts_total{} {}\n", labels, num(g.spec_drafts));
    head(out, "vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.");
    out += fmt::format("vllm:spec_decode_num_draft_tokens_total{} {}\n", labels, num(g.spec_draft_tokens));
    head(out, "vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.");
    out += fmt::format("vllm:spec_decode_num_accepted_tokens_total{} {}\n", labels, num(g.spec_accepted_tokens));
}

// One unlabelled series of the Gauges: a field, or what `compute` makes of them.
struct Series {
    const char* type;  // "gauge" or "counter"
    const char* name;
    const char* help;
    double Gauges::*field = nullptr;
    double (*compute)(const Gauges&) = nullptr;
};

double acceptance_rate(const Gauges& g) {
    return g.spec_draft_tokens > 0 ? g.spec_accepted_tokens / g.spec_draft_tokens : 0.0;
}
double tokens_per_verify(const Gauges& g) {
    return g.spec_drafts > 0 ? 1.0 + g.spec_accepted_tokens / g.spec_drafts : 0.0;
}
double ready(const Gauges& g) { return g.ready ? 1.0 : 0.0; }

void series(std::string& out, const Series& s, const Gauges& g) {
    single(out, s.name, s.type, s.help, num(s.field ? g.*s.field : s.compute(g)));
}

// The scheduler's and the engine's series, in the order /metrics writes them.
const Series kSchedulerSeries[] = {
    {"gauge", "eh_queue_depth", "Jobs waiting to run.", &Gauges::queue_depth},
    {"gauge", "eh_active_jobs", "Jobs running now.", &Gauges::active_jobs},
    // The Gateway API inference extension's model-server protocol:
    // TotalQueuedRequests, TotalRunningRequests, KVCacheUtilization.
    {"gauge", "eh_num_requests_waiting", "Requests waiting to start.", &Gauges::queue_depth},
    {"gauge", "eh_num_requests_running", "Requests in the running batch.", &Gauges::active_jobs},
    {"gauge", "eh_kv_cache_usage_perc",
     "Fraction (0-1) of KV-cache blocks held, cached prefixes included.", &Gauges::kv_cache_usage},
    {"gauge", "eh_kv_cache_blocks", "Total KV-cache blocks.", &Gauges::kv_blocks_total},
    {"gauge", "eh_prefix_cache_entries", "Finished sequences kept for prefix reuse.", &Gauges::prefix_cache_entries},
    {"counter", "eh_prefix_cache_lookups_total",
     "Prefix-cache lookups (one per admitted request).", &Gauges::prefix_lookups},
    {"counter", "eh_prefix_cache_hits_total", "Lookups that reused a cached prefix.", &Gauges::prefix_hits},
    {"counter", "eh_prefix_cache_query_tokens_total",
     "Prompt tokens looked up in the prefix cache.", &Gauges::prefix_query_tokens},
    {"counter", "eh_prefix_cache_hit_tokens_total",
     "Prompt tokens reused from the prefix cache.", &Gauges::prefix_hit_tokens},
    {"gauge", "eh_kv_host_tier_budget_bytes",
     "Host memory the prefix cache may park evicted prefixes in (--kv-host-bytes; 0: off).",
     &Gauges::host_tier_budget},
    {"gauge", "eh_kv_host_tier_used_bytes", "Host memory parked prefixes hold.", &Gauges::host_tier_used},
    {"gauge", "eh_kv_host_tier_entries", "Prefixes parked in host memory.", &Gauges::host_tier_entries},
    {"counter", "eh_kv_host_tier_parks_total",
     "Evicted prefixes parked in host memory instead of dropped.", &Gauges::host_tier_parks},
    {"counter", "eh_kv_host_tier_park_bytes_total",
     "Bytes copied into host memory by parks.", &Gauges::host_tier_park_bytes},
    {"counter", "eh_kv_host_tier_restores_total",
     "Parked prefixes copied back into KV blocks for a request.", &Gauges::host_tier_restores},
    {"counter", "eh_kv_host_tier_restore_bytes_total",
     "Bytes copied back from host memory by restores.", &Gauges::host_tier_restore_bytes},
    {"counter", "eh_kv_host_tier_dropped_total",
     "Parked prefixes dropped (least recently used, for room; or contained in a newer one).",
     &Gauges::host_tier_dropped},
    {"counter", "eh_preemptions_total",
     "Requests preempted (KV blocks freed, recomputed later).", &Gauges::preemptions},
    {"counter", "eh_engine_restarts_total",
     "Times the engine process was started again after it crashed or hung.", &Gauges::engine_restarts},
    {"counter", "eh_engine_steps_total", "Batched steps run by the engine.", &Gauges::engine_steps},
    {"counter", "eh_engine_step_seconds_total",
     "Time the scheduler waited in the engine's step calls (device work not overlapped with host work).",
     &Gauges::engine_step_seconds},
    {"counter", "eh_engine_chained_steps_total",
     "Steps begun before the step ahead of them was read (the engine took each token on the device).",
     &Gauges::engine_chained_steps},
    {"counter", "eh_spec_decode_num_drafts_total",
     "Step items that verified draft tokens (speculative decoding).", &Gauges::spec_drafts},
    {"counter", "eh_spec_decode_num_draft_tokens_total",
     "Draft tokens those items carried.", &Gauges::spec_draft_tokens},
    {"counter", "eh_spec_decode_num_accepted_tokens_total",
     "Draft tokens the engine accepted.", &Gauges::spec_accepted_tokens},
    {"gauge", "eh_spec_decode_acceptance_rate",
     "Accepted draft tokens over draft tokens since the start (0 before any).", nullptr, acceptance_rate},
    {"gauge", "eh_spec_decode_tokens_per_step",
     "Tokens a verify item gave its request on average since the start: 1 + accepted / drafts (0 before any).",
     nullptr, tokens_per_verify},
    {"counter", "eh_spec_decode_skipped_steps_total",
     "Steps run without drafts because more requests decoded than --spec-max-batch.", &Gauges::spec_off_steps},
    {"counter", "eh_spec_decode_draft_seconds_total",
     "Host time spent drafting (a draft model's steps).", &Gauges::spec_draft_seconds},
    {"counter", "eh_constraint_seconds_total",
     "Host time computing token masks and updating matchers for structured output.", &Gauges::constraint_seconds},
};

// The process's, after vLLM's names.
const Series kProcessSeries[] = {
    {"gauge", "eh_vram_bytes", "Device memory held by the model.", &Gauges::vram_bytes},
    {"gauge", "eh_context_length", "Tokens per sequence (prompt + output).", &Gauges::context_length},
    {"gauge", "eh_ready", "1 when the model is loaded and serving.", nullptr, ready},
    {"gauge", "eh_uptime_seconds", "Seconds since the process started.", &Gauges::uptime_seconds},
};

}  // namespace

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
    head(out, "eh_requests_total", "counter", "Generation requests by endpoint and outcome.");
    for (const auto& [k, v] : requests_)
        out += fmt::format("eh_requests_total{{endpoint=\"{}\",outcome=\"{}\"}} {}\n", k.first, k.second, v);
    head(out, "eh_http_responses_total", "counter", "HTTP responses by route and status class.");
    for (const auto& [k, v] : http_)
        out += fmt::format("eh_http_responses_total{{route=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, v);
    counter(out, "eh_prompt_tokens_total", "Prompt tokens processed.", prompt_tokens_);
    counter(out, "eh_generated_tokens_total", "Tokens generated.", tokens_generated_);
    histogram(out, "eh_time_to_first_token_seconds",
              "Time from submission (queue time included) to the first generated token.", ttft_);
    histogram(out, "eh_inter_token_latency_seconds", "Time between consecutive generated tokens.", itl_);
    histogram(out, "eh_queue_time_seconds", "Time from submission to admission into the batch.", queue_);
    histogram(out, "eh_request_latency_seconds", "Time from submission to the end of a completed request.", e2e_);
    histogram(out, "eh_inference_duration_seconds",
              "Time from admission into the batch to the end of a completed request.", inference_);
    for (const Series& s : kSchedulerSeries) series(out, s, g);
    if (!g.model_name.empty()) render_vllm(out, g);  // once the model is loaded
    for (const Series& s : kProcessSeries) series(out, s, g);
    return out;
}

}  // namespace eh::service
