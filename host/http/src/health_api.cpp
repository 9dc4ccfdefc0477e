// The server's own reports: /health (the worker contract's status and the
// model's facts), /capabilities (what this worker can run) and /metrics
// (Prometheus text).
#include <fmt/format.h>

#include <filesystem>

#include "eh/service/event_log.hpp"
#include "eh/service/kv_cache_type.hpp"
#include "impl.hpp"

namespace eh::http {
namespace {

// CUDA's runtime version number (1000 * major + 10 * minor) as "13.0"; null
// for engines without one.
nlohmann::json cuda_version_string(int v) {
    if (v <= 0) return nullptr;
    return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

// What /capabilities says about a plugin: file names, not absolute paths
// (they tell a caller about the machine, not the plugin), and no free-memory
// figure (a probe-time number, stale by the time anyone reads it; /health
// and /metrics carry the live ones).
nlohmann::json public_plugin(nlohmann::json p) {
    for (const char* k : {"library", "manifest"})
        if (p.contains(k) && p[k].is_string()) p[k] = std::filesystem::path(p[k].get<std::string>()).filename().string();
    if (p.contains("probe") && p["probe"].is_object()) p["probe"].erase("free_memory_bytes");
    return p;
}

// A label value in the text format: backslash, quote and newline escaped.
std::string label_value(const std::string& v) {
    std::string out;
    for (char c : v) {
        if (c == '\\' || c == '"') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out;
}

// Which models are loaded (1) or not (0), and the memory they hold.
std::string pool_metrics(const ModelPool& pool) {
    std::string out = "# HELP eh_model_loaded 1 while the model is loaded (many-model serve)\n# TYPE eh_model_loaded gauge\n";
    for (const auto& m : pool.status()) {
        out += fmt::format("eh_model_loaded{{model=\"{}\"}} {}\n", label_value(m["id"].get<std::string>()),
                           m["state"] == "loaded" ? 1 : 0);
    }
    out += "# HELP eh_models_memory_bytes memory the loaded models hold, counted against --models-memory-mb\n"
           "# TYPE eh_models_memory_bytes gauge\n";
    out += fmt::format("eh_models_memory_bytes {}\n", pool.memory_used());
    return out;
}

// One line a rank: the GPU it runs on and its name.
std::string device_metrics(const nlohmann::json& devices) {
    if (!devices.is_array() || devices.empty()) return "";
    std::string out = "# HELP eh_model_device_info the devices the model runs on, one per rank (several with tensor "
                      "parallelism)\n# TYPE eh_model_device_info gauge\n";
    for (const auto& d : devices) {
        const std::string gpu = d.contains("gpu") ? std::to_string(d["gpu"].get<int>()) : "cpu";
        const std::string name = d.contains("name") ? d["name"].get<std::string>() : std::string();
        out += fmt::format("eh_model_device_info{{rank=\"{}\",gpu=\"{}\",name=\"{}\"}} 1\n", d["rank"].get<size_t>(),
                           gpu, label_value(name));
    }
    return out;
}

// /health's speculative decoding: its source as it runs; when asked for
// and off, why; its settings.
nlohmann::json speculation_json(const service::Service& svc) {
    const service::SpecOptions& so = svc.options().spec;
    nlohmann::json spec = {{"source", svc.speculation()}};
    if (so.source != service::SpecSource::Off) {
        spec["requested"] = service::spec_source_name(so.source);
        spec["draft_max"] = so.draft_max;
        spec["max_batch"] = so.max_batch;
        if (so.source == service::SpecSource::Ngram) spec["ngram"] = {so.ngram_min, so.ngram_max};
        if (!so.draft_name.empty()) spec["draft_model"] = so.draft_name;
        if (!svc.speculation_off_reason().empty()) spec["reason"] = svc.speculation_off_reason();
    }
    return spec;
}

// /health's prefix-cache host tier: asked (--kv-host-bytes), on, its use.
nlohmann::json host_tier_json(const service::Service& svc) {
    const service::HostTierStats& ht = svc.stats().host_tier;
    nlohmann::json host_tier = {{"requested_bytes", svc.options().kv_host_bytes},
                                {"budget_bytes", ht.budget_bytes.load()},
                                {"used_bytes", ht.used_bytes.load()},
                                {"entries", ht.entries.load()},
                                {"parks", ht.parks.load()},
                                {"restores", ht.restores.load()}};
    if (!svc.host_tier_off_reason().empty()) host_tier["reason"] = svc.host_tier_off_reason();
    return host_tier;
}

nlohmann::json scheduler_json(const service::Service& svc) {
    service::Gauges g;
    svc.fill_gauges(g);
    const service::SeqLimits& kl = svc.kv_limits();
    return {{"batched", svc.batched()},
            {"running", svc.active_jobs()},
            {"waiting", svc.queue_depth()},
            {"max_running", svc.max_running()},
            {"max_step_tokens", kl.max_step_tokens},
            {"prefill_chunk_tokens", svc.prefill_chunk_tokens()},
            {"kv_block_tokens", kl.block_tokens},
            {"kv_blocks_total", kl.total_blocks},
            {"kv_cache_usage", g.kv_cache_usage},
            {"prefix_cache_entries", uint64_t(g.prefix_cache_entries)},
            {"prefix_cache_hit_tokens", uint64_t(g.prefix_hit_tokens)},
            {"preemptions", uint64_t(g.preemptions)}};
}

// What /health adds once a service runs: its engine, queue, memory, KV
// cache, speculation, host tier, adapters, chat template and scheduler.
void add_service_health(nlohmann::json& j, const service::Service& svc) {
    const service::SchedulerStats& ss = svc.stats();
    j["engine"] = {{"state", service::engine_state_name(svc.engine_state())},
                   {"process", ss.engine_pid.load() ? nlohmann::json(ss.engine_pid.load()) : nlohmann::json(nullptr)},
                   {"restarts", ss.engine_restarts.load()}};
    j["queue_depth"] = svc.queue_depth();
    j["active_jobs"] = svc.active_jobs();
    // The model plus its KV-cache pool and step buffers, allocated at start.
    j["vram_bytes_used"] = svc.device_bytes_used();
    j["vram_bytes_model"] = svc.model_device_bytes();
    j["kv_bytes_per_token"] = svc.kv_bytes_per_token();
    j["kv_cache_bytes"] = svc.kv_cache_bytes();
    // What the blocks hold ("f16", "q8_0", "fp8", "f32"); null when the plugin does not say.
    const uint32_t kv_type = svc.kv_limits().kv_type;
    j["kv_cache_type"] = kv_type == service::kKvTypeUnknown ? nlohmann::json(nullptr)
                                                            : nlohmann::json(service::kv_cache_type_name(kv_type));
    j["speculation"] = speculation_json(svc);
    j["kv_host_tier"] = host_tier_json(svc);
    j["lora_adapters"] = svc.options().adapters;  // --lora, in the order given
    const service::ChatTemplateState t = svc.codec().chat_template_state();
    j["chat_template"] = {{"status", service::chat_template_kind_name(t.kind)}};
    if (!t.source.empty()) j["chat_template"]["source"] = t.source;
    if (!t.error.empty()) j["chat_template"]["error"] = t.error;
    j["scheduler"] = scheduler_json(svc);
}

// GET /health: the worker contract's status (healthy, loading, unhealthy,
// shutting_down; 200 only when healthy) and the model's facts.
void send_health(Server::Impl& s, httplib::Response& res) {
    NodeInfo ni = s.get_info();
    const State st = s.state.load();
    const auto svc = s.get_service();
    const ServingState ss = serving_state(s);
    const std::string& status = ss.status;
    nlohmann::json j = {
        {"status", status},
        {"model", ni.model},
        // The contract's meaning: weights held in device memory. A CPU
        // engine can be healthy, but its weights are never resident.
        {"resident", st == State::Ready && ss.resident && ni.device_kind != "cpu"},
        {"quant_kind", ni.quant_kind},
        {"vram_bytes_used", ni.vram_bytes_used},
        {"tokenizer_kind", ni.tokenizer_kind},
        {"vocab_size", ni.vocab_size},
        {"bos_id", ni.bos_id >= 0 ? nlohmann::json(ni.bos_id) : nlohmann::json(nullptr)},
        {"eos_id", ni.eos_id >= 0 ? nlohmann::json(ni.eos_id) : nlohmann::json(nullptr)},
        {"context_length", ni.context_length},
        {"uptime_seconds", s.uptime()},
        {"plugin", {{"name", ni.plugin_name}, {"version", ni.plugin_version}}},
        {"sm", ni.compute_capability},
        {"cuda_runtime_version", cuda_version_string(ni.cuda_runtime_version)},
        {"device", ni.device_name},
        {"devices", ni.devices},
        {"worker_id", service::log_settings().worker_id},
    };
    if (st == State::Loading) j["load_progress"] = s.load_progress.load();
    if (!ss.resident) j["reason"] = ss.reason;
    if (svc) add_service_health(j, *svc);
    if (const auto pool = s.get_pool()) {
        j["models"] = pool->status();
        j["models_memory_bytes"] = pool->memory_used();
    }
    send_json(res, status == "healthy" ? 200 : 503, j);
}

// GET /capabilities: what this worker can run.
nlohmann::json capabilities_json(const Server::Impl& s, const NodeInfo& ni) {
    nlohmann::json accepted = nlohmann::json::array(), rejected = nlohmann::json::array();
    for (const auto& p : ni.plugins) {
        if (p.value("accepted", false)) accepted.push_back(public_plugin(p));
        else rejected.push_back(public_plugin({{"name", p.value("name", "")}, {"library", p.value("library", "")},
                                               {"manifest", p.value("manifest", "")},
                                               {"reasons", p.value("reasons", nlohmann::json::array())}}));
    }
    // A model whose chat template was rejected cannot take chat work.
    nlohmann::json workloads = {"generate", "chat", "tokenize", "detokenize"};
    if (auto svc = s.get_service();
        svc && svc->codec().chat_template_state().kind == service::ChatTemplateState::Kind::Rejected)
        workloads = {"generate", "tokenize", "detokenize"};
    const service::RequestLimits& limits = s.options.limits;
    return {
        {"api_version", "1"},
        {"engine", ni.engine},
        {"engine_version", ni.plugin_version},
        {"plugin", ni.plugin_name},
        {"model", ni.model},
        {"architecture", ni.architecture},
        {"ctx_max", ni.context_length},
        {"max_tokens_out", ni.max_tokens_out},
        {"concurrency", {{"slots", ni.slots}, {"queue_capacity", ni.queue_capacity}}},
        {"workloads", workloads},
        {"endpoints", {"/execute", "/cancel", "/health", "/health/live", "/health/ready", "/capabilities",
                       "/v1/capabilities", "/metrics", "/tokenize", "/detokenize", "/v1/models", "/v1/completions",
                       "/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"}},
        {"sampler", {{"temperature", {{"min", 0}, {"max", 2}, {"default", 1}}},
                     {"top_p", {{"min", 0}, {"max", 1}, {"default", 1}}},
                     {"top_k", {{"min", 0}, {"default", 0}}},
                     {"min_p", {{"min", 0}, {"max", 1}, {"default", 0}}},
                     {"repetition_penalty", {{"min_exclusive", 0}, {"max", 2}, {"default", 1}}},
                     {"seed", {{"type", "uint64"}}},
                     {"stop", {{"max_count", limits.max_stop}}}}},
        {"logprobs", ni.logprobs},
        {"limits", {{"max_prompt_chars", limits.max_prompt_chars}, {"max_body_bytes", limits.max_body_bytes}}},
        {"plugins", {{"accepted", accepted}, {"rejected", rejected}}},
        // The contract's per-engine view; one engine serves here.
        // sampler_profile_version names the sampler's behaviour (what a
        // seed and the sampling fields produce); it changes when that does.
        {"engines", nlohmann::json::array({{{"engine", ni.engine},
                                             {"engine_version", ni.plugin_version},
                                             {"plugin", ni.plugin_name},
                                             {"sampler_profile_version", "1"},
                                             {"ctx_max", ni.context_length},
                                             {"max_tokens_out", ni.max_tokens_out},
                                             {"concurrency", {{"slots", ni.slots}}},
                                             {"supported_workloads", workloads}}})},
    };
}

// GET /metrics: the service's series, the devices', the pool's.
std::string metrics_text(const Server::Impl& s) {
    service::Gauges g;
    g.uptime_seconds = s.uptime();
    g.ready = s.state.load() == State::Ready;
    NodeInfo ni = s.get_info();
    g.vram_bytes = double(ni.vram_bytes_used);
    g.context_length = ni.context_length;
    if (auto svc = s.get_service()) {
        g.vram_bytes = double(svc->device_bytes_used());
        svc->fill_gauges(g);
    }
    std::string text = s.metrics->render(g);
    text += device_metrics(ni.devices);
    if (const auto pool = s.get_pool()) text += pool_metrics(*pool);
    return text;
}

}  // namespace

void Server::Impl::install_health() {
    http.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
        correlation_id(req, res);
        send_health(*this, res);
    });
    // /v1/capabilities is the worker contract's name; /capabilities stays.
    http.Get("/(v1/)?capabilities", [this](const httplib::Request& req, httplib::Response& res) {
        std::string cid = correlation_id(req, res);
        if (state.load() == State::Loading) {
            require_ready(*this, res, cid);
            return;
        }
        send_json(res, 200, capabilities_json(*this, get_info()));
    });
    http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
        correlation_id(req, res);
        res.set_content(metrics_text(*this), "text/plain; version=0.0.4; charset=utf-8");
    });
}

}  // namespace eh::http
