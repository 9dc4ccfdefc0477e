// `engine-host [serve]`: load one model through a plugin and serve it over
// HTTP until SIGTERM/SIGINT (or POST /shutdown when enabled).
//
// The steps, in order: the flags become checked settings
// (serve_settings.hpp); signals are blocked in every thread and taken by one
// waiter (serve_runtime.hpp), so shutdown runs as ordinary code; the HTTP
// socket is bound first, so /health answers "loading" (503) during the model
// load; the model is loaded and its service attached (serve_engine.hpp);
// then the process waits for the shutdown latch and drains.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli.hpp"
#include "eh/http/model_pool.hpp"
#include "eh/http/server.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "plugin_report.hpp"
#include "eh/loader/plugin_search.hpp"
#include "eh/service/event_log.hpp"
#include "eh/service/kv_event_publisher.hpp"
#include "options.hpp"
#include "serve_access.hpp"
#include "serve_announce.hpp"
#include "serve_engine.hpp"
#include "serve_runtime.hpp"
#include "serve_settings.hpp"

namespace eh::cli {
namespace {

using service::log_event;
namespace lvl = spdlog::level;

void start_event_log(const ServeSettings& s, const po::variables_map& vm) {
    service::LogSettings ls;
    ls.worker_id = s.worker_id;
    ls.model = s.model.name;
    // (--gpus: every rank's, "1,2"; GPUs chosen by free memory are named in
    // the tensor_parallel and ready lines)
    ls.gpu = std::to_string(s.gpus.empty() ? s.gpu : s.gpus[0]);
    for (size_t i = 1; i < s.gpus.size(); ++i) ls.gpu += "," + std::to_string(s.gpus[i]);
    ls.json = s.log_format == "json";
    ls.log_content = s.log_content;
    ls.level = s.log_level;
    service::init_event_log(ls);
    log_event(lvl::info, "startup", {{"version", EH_VERSION}, {"abi", fmt::format("{}.{}", EH_ABI_MAJOR, EH_ABI_MINOR)},
                                     {"host", vm["host"].as<std::string>()}, {"port", s.port},
                                     {"plugins", loader::join_dirs(s.plugin_dirs)}, {"model_ref", s.model.ref},
                                     {"model_path", s.model.path}});
}

// The HTTP server, bound (not yet running). kOk, or the exit code of the
// error it printed.
int open_server(const http::ServerOptions& so, std::shared_ptr<service::Metrics> metrics,
                const std::shared_ptr<ShutdownLatch>& latch, std::optional<http::Server>& server, int& bound) {
    try {
        server.emplace(so, std::move(metrics));
    } catch (const Error& e) {
        print_error(e.what());
        return kUsage;
    }
    server->on_shutdown_request([latch] { latch->trigger("POST /shutdown"); });
    try {
        bound = server->bind();
    } catch (const Error& e) {
        log_event(lvl::err, "error", {{"code", code_name(e.code())}, {"message", e.what()}});
        print_error(e.what());
        return kFailure;
    }
    return kOk;
}

// --kv-events-endpoint's publisher, started before the HTTP thread: an
// endpoint that cannot be used ends startup here. kOk (with `out` null when
// the flag is absent), or the exit code of the error it printed.
int open_kv_events(const ServeSettings& s, const std::string& host, int bound,
                   std::shared_ptr<service::ZmqKvPublisher>& out) {
    if (!s.kv_events_endpoint) return kOk;
    service::KvPublisherOptions kpo;
    kpo.endpoint = *s.kv_events_endpoint;
    if (s.kv_events_replay_endpoint) kpo.replay_endpoint = *s.kv_events_replay_endpoint;
    kpo.topic = s.kv_events_topic ? *s.kv_events_topic
                                  : fmt::format("kv@{}:{}@{}", advertised_host(host), bound, s.model.name);
    try {
        out = std::make_shared<service::ZmqKvPublisher>(kpo);
    } catch (const Error& e) {
        log_event(lvl::err, "error", {{"code", code_name(e.code())}, {"message", e.what()}});
        print_error(e.what());
        return e.code() == Code::InvalidRequest ? kUsage : kFailure;
    }
    log_event(lvl::info, "kv_events", {{"endpoint", kpo.endpoint}, {"replay_endpoint", kpo.replay_endpoint},
                                       {"topic", kpo.topic}});
    return kOk;
}

// --callback-url: tells the orchestrator this worker serves. False (and
// logged, printed) when that failed.
bool announce(const ServeSettings& s, const RunningModel& running, const std::string& uri) {
    if (!s.callback_url) return true;
    std::string err;
    nlohmann::json body = {{"worker_id", s.worker_id}, {"model_ref", s.model.ref},
                           {"vram_bytes", running.info.vram_bytes_used}, {"uri", uri}};
    if (post_callback(*s.callback_url, body, err)) return true;
    log_event(lvl::err, "error", {{"code", "CALLBACK_FAILED"}, {"message", err}});
    print_error("callback to " + *s.callback_url + " failed: " + err);
    return false;
}

// A model's bytes on disk: the file's size, or a directory's files' sizes
// (its safetensors shards and tokenizer files).
uint64_t bytes_on_disk(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) return std::filesystem::file_size(path, ec);
    uint64_t sum = 0;
    for (const auto& e : std::filesystem::directory_iterator(path, ec))
        if (e.is_regular_file(ec)) sum += e.file_size(ec);
    return sum;
}

// Many models: none is loaded yet; each loads on its first request.
std::shared_ptr<http::ModelPool> start_pool(const ServeSettings& s, const ModelStartContext& ctx) {
    std::vector<http::PoolModelSpec> specs;
    for (const auto& m : s.models) specs.push_back({m.name, m.aliases, m.path, bytes_on_disk(m.path)});
    http::ModelPoolOptions po;
    po.memory_budget_bytes = uint64_t(s.models_memory_mb * 1024.0 * 1024.0);
    po.idle_unload = std::chrono::seconds(s.idle_unload_seconds);
    po.load_wait = std::chrono::seconds(s.model_load_wait_sec);
    nlohmann::json names = nlohmann::json::array();
    for (const auto& m : specs) names.push_back(m.name);
    log_event(lvl::info, "models", {{"models", names}, {"memory_budget_bytes", po.memory_budget_bytes},
                                    {"idle_unload_seconds", s.idle_unload_seconds}});
    return std::make_shared<http::ModelPool>(std::move(specs), pool_loader(s, ctx), po);
}

// What /health and /capabilities say of a many-model server: the default
// model's name, the batch and queue every model's service gets, the plugins.
http::NodeInfo pool_info(const ServeSettings& s) {
    http::NodeInfo ni;
    ni.model = s.model.name;
    ni.refuse_unknown_models = true;
    ni.slots = s.parallel;
    ni.queue_capacity = s.queue_size;
    ni.max_tokens_out = s.max_tokens_out;
    loader::LoaderOptions lo;
    lo.device = s.gpu;
    lo.open_in_process = false;
    ni.plugins = registry_json(loader::discover_plugins(s.plugin_dirs, lo));
    return ni;
}

}  // namespace

int cmd_serve(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    add_serve_options(desc);
    add_serve_access_options(desc);  // API keys, HTTPS, request limits
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, desc, kServeUsage, vm, code)) return code;
    ServeSettings s;
    if (std::string err; !read_serve_settings(vm, s, err)) {
        print_error(err);
        return kUsage;
    }

    auto latch = take_shutdown_signals();
    start_event_log(s, vm);

    auto metrics = std::make_shared<service::Metrics>();
    http::ServerOptions so;
    if (std::string err; !read_server_options(vm, s, so, err)) {
        print_error(err);
        return kUsage;
    }
    std::optional<http::Server> server_box;
    int bound = 0;
    if (int rc = open_server(so, metrics, latch, server_box, bound); rc != kOk) return rc;
    http::Server& server = *server_box;
    std::shared_ptr<service::ZmqKvPublisher> kv_publisher;
    if (int rc = open_kv_events(s, so.host, bound, kv_publisher); rc != kOk) return rc;
    std::thread http_thread([&] { server.run(); });
    const std::string uri = fmt::format("{}://{}:{}", so.ssl_cert_file.empty() ? "http" : "https", so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host, bound);
    log_event(lvl::info, "listening", {{"uri", uri}, {"port", bound}});

    RunningModel running;                // one model
    std::shared_ptr<http::ModelPool> pool;  // many models
    ResidencyWatch residency;
    int exit_code = kOk;
    auto stop_everything = [&] {
        server.begin_shutdown();
        if (running.svc) running.svc->shutdown();
        if (pool) pool->shutdown();
        // The default grace plus this fits the worker contract's 5 s from
        // SIGTERM to exit: cancelled streams only have their terminal event
        // left to write.
        server.drain(std::chrono::milliseconds(500));
        server.stop();
        if (http_thread.joinable()) http_thread.join();
        residency.stop();
        if (pool) pool->release();
        pool.reset();
        running.svc.reset();
        running.engine.reset();  // an engine process sees its socket close and exits
        if (kv_publisher) kv_publisher->stop();  // after the cache's last events
        running.model.reset();
    };

    try {
        const ModelStartContext ctx{&server, [latch] { return latch->fired(); }, metrics, kv_publisher, so.limits, uri};
        if (!s.models.empty()) {
            pool = start_pool(s, ctx);
            server.attach_pool(pool, pool_info(s));
        } else {
            start_model(s, s.model, ctx, running);
            residency.start(running.engine, server, s.residency_check_sec);
        }
        if (!announce(s, running, uri)) {
            exit_code = kFailure;
            latch->trigger("callback failed");
        }
    } catch (const Error& e) {
        log_event(lvl::err, "error", {{"code", code_name(e.code())}, {"message", e.what()}});
        print_error(std::string(e.what()) + " [" + code_name(e.code()) + "]");
        exit_code = latch->fired() && e.code() == Code::Cancelled ? kOk : exit_code_for(e.code());
        latch->trigger("startup failed");
    } catch (const std::exception& e) {
        log_event(lvl::err, "error", {{"code", "INTERNAL"}, {"message", e.what()}});
        print_error(std::string("internal error: ") + e.what());
        exit_code = kFailure;
        latch->trigger("startup failed");
    }

    std::string why = latch->wait();
    log_event(lvl::info, "shutdown", {{"reason", why}, {"phase", "begin"}});
    stop_everything();
    log_event(lvl::info, "shutdown", {{"reason", why}, {"phase", "complete"}, {"exit_code", exit_code}});
    return exit_code;
}

}  // namespace eh::cli
