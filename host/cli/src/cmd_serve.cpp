// `engine-host [serve]`: load one model through a plugin and serve it over
// HTTP until SIGTERM/SIGINT (or POST /shutdown when enabled).
//
// Order matters: the HTTP socket is bound first so /health answers
// "loading" (503) during the model load; signals are blocked in every thread
// and taken by one waiter thread, so shutdown runs as ordinary code.
#include <boost/algorithm/string.hpp>
#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include "cli.hpp"
#include "device_choice.hpp"
#include "eh/http/last_words.hpp"
#include "eh/http/server.hpp"
#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/loader/plugin_search.hpp"
#include "eh/model/descriptor.hpp"
#include "eh/model/model_file.hpp"
#include "eh/service/event_log.hpp"
#include "eh/service/remote_engine.hpp"
#include "eh/service/kv_event_publisher.hpp"
#include "eh/service/service.hpp"
#include "load_progress.hpp"
#include "model_ref.hpp"
#include "options.hpp"
#include "plugin_report.hpp"
#include "serve_access.hpp"
#include "serve_codec.hpp"
#include "serve_model.hpp"

namespace eh::cli {
namespace {

using service::log_event;
namespace lvl = spdlog::level;

const char* kServeUsage = "Usage: engine-host [serve] --model REF [--plugins DIR] [--port N] [options]";

std::string new_uuid() {
    std::mt19937_64 rng{std::random_device{}()};
    uint64_t a = rng(), b = rng();
    a = (a & ~0xF000ull) | 0x4000ull;                        // version 4
    b = (b & ~(0xC000ull << 48)) | (0x8000ull << 48);         // RFC 4122 variant
    return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", uint32_t(a >> 32), uint16_t(a >> 16), uint16_t(a),
                       uint16_t(b >> 48), b & 0xFFFFFFFFFFFFull);
}

// Set once by a signal, POST /shutdown or a fatal error; main waits on it.
class ShutdownLatch {
public:
    void trigger(const std::string& why) {
        {
            std::lock_guard lock(mu_);
            if (fired_) return;
            fired_ = true;
            why_ = why;
        }
        cv_.notify_all();
    }
    std::string wait() {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return fired_; });
        return why_;
    }
    bool fired() {
        std::lock_guard lock(mu_);
        return fired_;
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool fired_ = false;
    std::string why_;
};

// POSTs {worker_id, model_ref, vram_bytes, uri} to the orchestrator.
bool post_callback(const std::string& url, const nlohmann::json& body, std::string& err) {
    static const std::regex re(R"(^(https?)://([^/:]+|\[[^\]]+\])(?::(\d+))?(/.*)?$)");
    std::smatch m;
    if (!std::regex_match(url, m, re)) {
        err = "not an http(s) URL";
        return false;
    }
    std::string base = m[1].str() + "://" + m[2].str() + (m[3].matched ? ":" + m[3].str() : "");
    std::string path = m[4].matched ? m[4].str() : "/";
    httplib::Client client(base);
    client.set_connection_timeout(10, 0);
    client.set_read_timeout(10, 0);
    auto res = client.Post(path, body.dump(), "application/json");
    if (!res) {
        err = "request failed: " + httplib::to_string(res.error());
        return false;
    }
    if (res->status < 200 || res->status >= 300) {
        err = fmt::format("HTTP {}", res->status);
        return false;
    }
    return true;
}

// The address a router knows this server by, for the KV-event topic: --host,
// or for a wildcard the first IPv4 address of an interface that is up and
// not loopback (a pod's IP).
std::string advertised_host(const std::string& host) {
    if (host != "0.0.0.0" && host != "::" && !host.empty()) return host;
    std::string found = "127.0.0.1";
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return found;
    for (ifaddrs* a = list; a; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK))
            continue;
        char buf[INET_ADDRSTRLEN];
        if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf)) {
            found = buf;
            break;
        }
    }
    ::freeifaddrs(list);
    return found;
}

}  // namespace

int cmd_serve(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("plugins", po::value<std::vector<std::string>>(), kPluginsHelp)
        ("model,m", po::value<std::string>()->required(), kModelHelp)
        ("offline", kOfflineHelp)
        ("model-name", po::value<std::string>(), "model id clients use (default: file name without .gguf)")
        ("served-model-name", po::value<std::vector<std::string>>()->composing(),
         "a name clients may send as `model` (repeatable; the first is the model's id unless --model-name is given); "
         "with it, a request naming any other model gets 404")
        ("chat-template-file", po::value<std::string>(), kChatTemplateFileHelp)
        ("port", po::value<int>()->default_value(8080), "TCP port (0 = any free port)")
        ("host", po::value<std::string>()->default_value("127.0.0.1"), "address to bind")
        ("worker-id", po::value<std::string>(), "UUID of this worker (generated when absent)")
        ("gpu-device", po::value<int>()->default_value(0), kGpuHelp)
        ("device", po::value<std::string>()->default_value("auto"), kDeviceHelp)
        ("max-tokens-out", po::value<uint32_t>()->default_value(0), "most tokens one request may generate (0 = as many as the context leaves)")
        ("inference-timeout-sec", po::value<uint32_t>()->default_value(300), "per-request time limit")
        ("ctx-size", po::value<uint32_t>()->default_value(0), "context length (prompt + output); default: the model's")
        ("kv-cache-size-mb", po::value<uint64_t>()->default_value(0), "KV-cache pool shared by all sequences (default: --gpu-memory-fraction); without --ctx-size the context is capped to what it holds")
        ("gpu-memory-fraction", po::value<float>()->default_value(0), "KV-cache pool as a fraction (0-1] of the device memory free after the weights (0 = plugin default)")
        ("parallel", po::value<uint32_t>()->default_value(64), "requests decoding at once in the batch (1-4096)")
        ("batch-tokens", po::value<uint32_t>()->default_value(2048), "tokens per forward step: decodes plus prefill chunks (16-65536)")
        ("no-prefix-cache", "do not keep finished sequences for prompts that share their prefix")
        ("prefix-cache-shared", "with --api-key: let a request reuse prefixes that requests of other API keys "
                                "computed (single tenant; by default each key reuses only its own)")
        ("no-chained-steps", "read every step's tokens before the next step starts (engines with ABI 1.3's "
                             "step_begin otherwise run the next step while the host streams this one's)")
        ("queue-size", po::value<size_t>()->default_value(256), "requests that may wait for a place in the batch")
        ("threads", po::value<uint32_t>()->default_value(0), "CPU threads for CPU engines (0 = plugin default)")
        ("engine-process", "run the engine plugin in a child process: a crash or hang there ends only the requests it was running, and the engine is restarted (docs/robustness.md)")
        ("engine-options", po::value<std::string>()->default_value(""), "JSON object handed to the engine plugin's model load, e.g. '{\"fp16_weights\":\"off\"}' (each plugin's README lists its keys)")
        ("callback-url", po::value<std::string>(), "POST {worker_id, model_ref, vram_bytes, uri} here once serving")
        ("cors", "allow cross-origin requests from localhost origins (browser tooling)")
        ("allowed-hosts", po::value<std::string>(), "comma-separated Host names accepted besides IPs, localhost and --host (* = any)")
        ("allow-shutdown-endpoint", "enable POST /shutdown")
        ("artifacts-dir", po::value<std::string>(), "write one JSON record per /execute job (request, result, SSE transcript) into DIR; off by default")
        ("responses-max", po::value<uint32_t>()->default_value(1000), "finished Responses API responses kept for previous_response_id and GET /v1/responses/{id} (0-1000000; 0 keeps none); the least recently used go first")
        ("responses-max-mb", po::value<uint32_t>()->default_value(64), "memory those responses may hold, in MiB (1-65536)")
        ("artifacts-max-files", po::value<uint32_t>()->default_value(1000), "records kept in --artifacts-dir (1-1000000); the oldest are removed")
        ("log-format", po::value<std::string>()->default_value("json"), "json or text")
        ("log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warn, error")
        ("log-content", "log prompts and generated text (off by default)")
        ("residency-check-sec", po::value<uint32_t>()->default_value(30), "how often weights residency is verified")
        ("kv-events-endpoint", po::value<std::string>(), "publish the prefix cache's KV events (vLLM's ZeroMQ format) on this PUB endpoint: tcp://*:5557 binds, tcp://HOST:PORT connects (off by default)")
        ("kv-events-replay-endpoint", po::value<std::string>(), "with --kv-events-endpoint: a ROUTER endpoint (bound) that replays kept event batches from a sequence number")
        ("kv-events-topic", po::value<std::string>(), "the events' topic (default kv@<host>:<port>@<model>)")
        ("kv-events-block-tokens", po::value<uint32_t>(), "tokens per announced block (1-65536; default the engine's KV block, 16 for the bundled plugins); a router's block size must match")
        ("kv-events-hash-seed", po::value<std::string>()->default_value(""), "seed of the block hash chain (llm-d's hashSeed, vLLM's PYTHONHASHSEED)")
        ("shutdown-grace-ms", po::value<uint32_t>()->default_value(4500), "time running jobs get to finish on shutdown; streams then get 500 ms to send their last event");
    po::variables_map vm;
    int code = kOk;
    add_serve_access_options(desc);  // API keys, HTTPS, request limits
    if (!parse_options(args, desc, kServeUsage, vm, code)) return code;

    const std::string log_format = vm["log-format"].as<std::string>();
    if (log_format != "json" && log_format != "text") {
        print_error("--log-format must be json or text");
        return kUsage;
    }
    auto level = spdlog::level::from_str(vm["log-level"].as<std::string>());
    if (level == spdlog::level::off && vm["log-level"].as<std::string>() != "off") {
        print_error("--log-level must be trace, debug, info, warn, error or off");
        return kUsage;
    }
    std::string worker_id = vm.count("worker-id") ? vm["worker-id"].as<std::string>() : new_uuid();
    static const std::regex uuid_re("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$");
    if (!std::regex_match(worker_id, uuid_re)) {
        print_error("--worker-id must be a UUID (e.g. 123e4567-e89b-12d3-a456-426614174000)");
        return kUsage;
    }
    const uint32_t max_out = vm["max-tokens-out"].as<uint32_t>();
    const uint32_t parallel = vm["parallel"].as<uint32_t>();
    if (parallel < 1 || parallel > 4096) {
        print_error("--parallel must be between 1 and 4096");
        return kUsage;
    }
    const uint32_t batch_tokens = vm["batch-tokens"].as<uint32_t>();
    if (batch_tokens < 16 || batch_tokens > 65536) {
        print_error("--batch-tokens must be between 16 and 65536");
        return kUsage;
    }
    const std::string engine_options = vm["engine-options"].as<std::string>();
    if (!engine_options.empty()) {
        const nlohmann::json j = nlohmann::json::parse(engine_options, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
            print_error("--engine-options must be a JSON object, e.g. '{\"fp16_weights\":\"off\"}'");
            return kUsage;
        }
    }
    const float mem_fraction = vm["gpu-memory-fraction"].as<float>();
    if (!(mem_fraction >= 0.0f && mem_fraction <= 1.0f)) {
        print_error("--gpu-memory-fraction must be in [0, 1] (0 = the plugin's default)");
        return kUsage;
    }
    if (vm["inference-timeout-sec"].as<uint32_t>() == 0) {
        print_error("--inference-timeout-sec must be positive");
        return kUsage;
    }
    int port = vm["port"].as<int>();
    if (port < 0 || port > 65535) {
        print_error("--port must be between 0 and 65535");
        return kUsage;
    }
    const int gpu = vm["gpu-device"].as<int>();
    const std::optional<int> named_gpu = vm["gpu-device"].defaulted() ? std::nullopt : std::optional<int>(gpu);
    if (gpu < 0) {
        print_error("--gpu-device must be 0 or more");
        return kUsage;
    }
    DevicePolicy policy;
    if (!parse_device_policy(vm["device"].as<std::string>(), policy)) {
        print_error("--device must be auto, gpu, cpu or any");
        return kUsage;
    }
    // Read and compiled before anything starts: a bad file is a usage error.
    std::optional<ChatTemplateChoice> chat_template;
    if (!chat_template_option(vm, chat_template)) return kUsage;
    const std::string model_ref = vm["model"].as<std::string>();
    const std::string model_path = resolve_model_ref(model_ref, vm.count("offline") > 0);
    const std::vector<std::string> plugin_dirs = loader::plugin_dirs(plugins_arg(vm));
    // The model's id, and the further names (--served-model-name, the file's
    // name) a request's `model` may use.
    const std::vector<std::string> served_names =
        vm.count("served-model-name") ? vm["served-model-name"].as<std::vector<std::string>>() : std::vector<std::string>{};
    for (const auto& n : served_names) {
        bool ok = !n.empty() && n.size() <= 256;
        for (unsigned char c : n) ok = ok && c >= 0x20 && c != 0x7f;
        if (!ok) {
            print_error("--served-model-name must be 1-256 bytes without control characters");
            return kUsage;
        }
    }
    const std::string model_name = vm.count("model-name") ? vm["model-name"].as<std::string>()
                                   : !served_names.empty() ? served_names.front()
                                                           : model_id(model_path);
    std::vector<std::string> model_aliases;
    for (const auto& n : served_names)
        if (n != model_name && std::find(model_aliases.begin(), model_aliases.end(), n) == model_aliases.end())
            model_aliases.push_back(n);
    if (const std::string file_name = model_id(model_path); !served_names.empty() && file_name != model_name &&
        std::find(model_aliases.begin(), model_aliases.end(), file_name) == model_aliases.end())
        model_aliases.push_back(file_name);

    if (vm.count("kv-events-endpoint")) {
        if (vm.count("no-prefix-cache")) {
            print_error("--kv-events-endpoint announces the prefix cache's blocks: it cannot go with --no-prefix-cache");
            return kUsage;
        }
        if (vm.count("kv-events-block-tokens") &&
            (vm["kv-events-block-tokens"].as<uint32_t>() < 1 || vm["kv-events-block-tokens"].as<uint32_t>() > 65536)) {
            print_error("--kv-events-block-tokens must be between 1 and 65536");
            return kUsage;
        }
    } else if (vm.count("kv-events-replay-endpoint") || vm.count("kv-events-topic") || vm.count("kv-events-block-tokens")) {
        print_error("--kv-events-replay-endpoint, --kv-events-topic and --kv-events-block-tokens need --kv-events-endpoint");
        return kUsage;
    }

    // Signals go to one thread; everyone else (HTTP, worker) has them blocked.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
    auto latch = std::make_shared<ShutdownLatch>();
    std::thread([sigs, latch] {
        int sig = 0;
        sigwait(&sigs, &sig);
        latch->trigger(sig == SIGINT ? "SIGINT" : "SIGTERM");
    }).detach();

    service::LogSettings ls;
    ls.worker_id = worker_id;
    ls.model = model_name;
    ls.gpu = std::to_string(gpu);
    ls.json = log_format == "json";
    ls.log_content = vm.count("log-content") > 0;
    ls.level = level;
    service::init_event_log(ls);
    log_event(lvl::info, "startup", {{"version", EH_VERSION}, {"abi", fmt::format("{}.{}", EH_ABI_MAJOR, EH_ABI_MINOR)},
                                     {"host", vm["host"].as<std::string>()}, {"port", port},
                                     {"plugins", loader::join_dirs(plugin_dirs)}, {"model_ref", model_ref},
                                     {"model_path", model_path}});

    auto metrics = std::make_shared<service::Metrics>();
    http::ServerOptions so;
    so.host = vm["host"].as<std::string>();
    so.port = port;
    so.cors = vm.count("cors") > 0;
    if (vm.count("allowed-hosts")) boost::split(so.allowed_hosts, vm["allowed-hosts"].as<std::string>(), boost::is_any_of(","));
    so.allow_shutdown_endpoint = vm.count("allow-shutdown-endpoint") > 0;
    if (max_out) so.limits.max_tokens = max_out;
    if (std::string err; !apply_serve_access_options(vm, so, err)) {
        print_error(err);
        return kUsage;
    }
    // Every running and waiting request holds an HTTP thread while it streams.
    so.threads = vm["queue-size"].as<size_t>() + parallel + 16;
    so.responses_max = vm["responses-max"].as<uint32_t>();
    so.responses_max_bytes = size_t(vm["responses-max-mb"].as<uint32_t>()) << 20;
    if (so.responses_max > 1000000 || so.responses_max_bytes < (size_t(1) << 20) ||
        so.responses_max_bytes > (size_t(65536) << 20)) {
        print_error("--responses-max must be between 0 and 1000000 and --responses-max-mb between 1 and 65536");
        return kUsage;
    }
    if (vm.count("artifacts-dir")) {
        so.artifacts_dir = vm["artifacts-dir"].as<std::string>();
        so.artifacts_max_files = vm["artifacts-max-files"].as<uint32_t>();
        if (so.artifacts_dir.empty() || so.artifacts_max_files < 1 || so.artifacts_max_files > 1000000) {
            print_error("--artifacts-dir must name a directory and --artifacts-max-files be between 1 and 1000000");
            return kUsage;
        }
        so.model_ref = model_ref;
        so.model_path = model_path;
    }
    std::optional<http::Server> server_box;
    try {
        server_box.emplace(so, metrics);
    } catch (const Error& e) {
        print_error(e.what());
        return kUsage;
    }
    http::Server& server = *server_box;
    server.on_shutdown_request([latch] { latch->trigger("POST /shutdown"); });
    int bound;
    try {
        bound = server.bind();
    } catch (const Error& e) {
        log_event(lvl::err, "error", {{"code", code_name(e.code())}, {"message", e.what()}});
        print_error(e.what());
        return kFailure;
    }
    // Before the HTTP thread starts: an endpoint that cannot be used ends
    // startup here.
    std::shared_ptr<service::ZmqKvPublisher> kv_publisher;
    if (vm.count("kv-events-endpoint")) {
        service::KvPublisherOptions kpo;
        kpo.endpoint = vm["kv-events-endpoint"].as<std::string>();
        if (vm.count("kv-events-replay-endpoint")) kpo.replay_endpoint = vm["kv-events-replay-endpoint"].as<std::string>();
        kpo.topic = vm.count("kv-events-topic") ? vm["kv-events-topic"].as<std::string>()
                                                : fmt::format("kv@{}:{}@{}", advertised_host(so.host), bound, model_name);
        try {
            kv_publisher = std::make_shared<service::ZmqKvPublisher>(kpo);
        } catch (const Error& e) {
            log_event(lvl::err, "error", {{"code", code_name(e.code())}, {"message", e.what()}});
            print_error(e.what());
            return e.code() == Code::InvalidRequest ? kUsage : kFailure;
        }
        log_event(lvl::info, "kv_events", {{"endpoint", kpo.endpoint}, {"replay_endpoint", kpo.replay_endpoint},
                                           {"topic", kpo.topic}});
    }
    std::thread http_thread([&] { server.run(); });
    const std::string uri = fmt::format("{}://{}:{}", so.ssl_cert_file.empty() ? "http" : "https", so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host, bound);
    log_event(lvl::info, "listening", {{"uri", uri}, {"port", bound}});

    const bool engine_process = vm.count("engine-process") > 0;
    std::shared_ptr<EngineModel> model;           // in this process only
    std::shared_ptr<service::EngineSource> engine;
    std::shared_ptr<service::Service> svc;
    std::thread residency;
    std::mutex residency_mu;
    std::condition_variable residency_cv;
    bool residency_stop = false;
    int exit_code = kOk;

    auto stop_everything = [&] {
        server.begin_shutdown();
        if (svc) svc->shutdown();
        // The default grace plus this fits the worker contract's 5 s from
        // SIGTERM to exit: cancelled streams only have their terminal event
        // left to write.
        server.drain(std::chrono::milliseconds(500));
        server.stop();
        if (http_thread.joinable()) http_thread.join();
        {
            std::lock_guard lock(residency_mu);
            residency_stop = true;
        }
        residency_cv.notify_all();
        if (residency.joinable()) residency.join();
        svc.reset();
        engine.reset();  // an engine process sees its socket close and exits
        if (kv_publisher) kv_publisher->stop();  // after the cache's last events
        model.reset();
    };

    try {
        loader::LoaderOptions lo;
        lo.device = gpu;
        lo.open_in_process = !engine_process;
        Registry reg = loader::discover_plugins(plugin_dirs, lo);
        for (const auto* r : reg.rejected())
            log_event(lvl::warn, "plugin_rejected", {{"plugin", r->caps.name}, {"library", r->library_path}, {"reasons", r->reasons}});

        std::shared_ptr<model::ModelFile> file = model::ModelFile::open(model_path);
        const PluginRecord& plugin = choose_plugin(reg, model_requirements(*file), policy, named_gpu);
        // Engine plugins run in this process: if one dies on a fatal signal,
        // the log's last line says which, how and when (last_words.hpp).
        auto last_words = [&plugin](const char* phase) {
            http::set_last_words([&plugin, phase](const char* sig, const std::string& ts) {
                return service::format_event(
                    lvl::critical, "engine_crashed",
                    {{"code", "INTERNAL"}, {"signal", sig}, {"phase", phase}, {"plugin", plugin.caps.name},
                     {"plugin_version", plugin.caps.version},
                     {"message", fmt::format("the engine plugin died on {} while {}; the worker exits with 128 + the "
                                             "signal number and should be restarted",
                                             sig, phase)}},
                    ts);
            });
        };
        if (!engine_process) last_words("loading");

        log_event(lvl::info, "model_load_start", {{"plugin", plugin.caps.name}, {"plugin_version", plugin.caps.version},
                                                  {"format", file->format_name()}, {"architecture", std::string(file->architecture())}});
        LoadProgressBar bar(progress_bar_fits(STDERR_FILENO, STDOUT_FILENO));
        int next_mark = 0;
        std::string last_stage;  // each distinct stage once (the CUDA plugins' kernel plan lines among them)
        EngineLoadOptions elo;
        elo.device = gpu;
        elo.n_threads = vm["threads"].as<uint32_t>();
        elo.options_json = engine_options;
        elo.progress = [&](float f, const char* stage) {
            server.set_load_progress(f);
            bar.update(f);
            if (stage && *stage && last_stage != stage) {
                last_stage = stage;
                log_event(lvl::info, "model_load_stage", {{"stage", last_stage}});
            }
            while (next_mark <= 100 && f * 100.0f + 1e-3f >= float(next_mark)) {
                log_event(lvl::info, "model_load_progress", {{"percent", next_mark}, {"stage", stage ? stage : ""}});
                next_mark += 25;
            }
        };
        elo.cancel = [latch] { return latch->fired(); };
        auto t0 = std::chrono::steady_clock::now();
        if (engine_process) {
            service::EngineProcessOptions epo;
            epo.argv = {"/proc/self/exe", "engine-worker", "--manifest", plugin.manifest_path, "--model", model_path,
                        "--model-name", model_name, "--gpu-device", std::to_string(gpu),
                        "--threads", std::to_string(elo.n_threads), "--engine-options", engine_options,
                        "--log-format", log_format, "--log-level", vm["log-level"].as<std::string>(),
                        "--worker-id", worker_id};
            if (ls.log_content) epo.argv.push_back("--log-content");
            epo.progress = [&](float f, const std::string& stage) { elo.progress(f, stage.c_str()); };
            epo.cancel = elo.cancel;
            engine = service::start_engine_process(std::move(epo));
        } else {
            model = EngineModel::load(plugin.api, model_path, &file->view(), file, elo);
            engine = service::local_engine(model);
        }
        const service::EngineFacts facts = engine->facts();
        while (next_mark <= 100) {  // a plugin that reports no progress still logs every mark
            log_event(lvl::info, "model_load_progress", {{"percent", next_mark}, {"stage", "done"}});
            next_mark += 25;
        }
        bar.update(1.0f);
        const eh_model_info& mi = facts.info;
        // The worker contract's quant_kind is the file's quantization
        // ("Q4_K_M", from general.file_type), not the plugin's dominant
        // tensor type; the plugin's answer stands in when the file has none.
        const std::string file_quant = model::describe(*file).quant_kind;
        const std::string quant_kind = file_quant.empty() ? std::string(mi.quant_kind) : file_quant;
        log_event(lvl::info, "model_load_complete",
                  {{"vram_bytes", mi.device_bytes_used}, {"host_bytes", mi.host_bytes_used}, {"quant_kind", quant_kind},
                   {"load_ms", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()}});

        auto codec = make_codec(*file, std::move(chat_template));
        const service::ChatTemplateState chat_state = codec->chat_template_state();
        if (chat_state.kind == service::ChatTemplateState::Kind::Rejected)
            // Serve still starts (completions and /execute need no template);
            // chat requests answer CHAT_TEMPLATE_UNUSABLE.
            log_event(lvl::err, "chat_template_rejected",
                      {{"code", "CHAT_TEMPLATE_UNUSABLE"}, {"source", chat_state.source}, {"message", chat_state.error},
                       {"chat_requests", "refused until restarted with --chat-template-file"}});
        else if (chat_state.source == "file")
            log_event(lvl::info, "chat_template", {{"source", "file"}, {"path", vm["chat-template-file"].as<std::string>()}});
        service::ServiceOptions sopt;
        sopt.n_ctx = choose_context(*file, mi, vm["ctx-size"].as<uint32_t>(), vm["kv-cache-size-mb"].as<uint64_t>());
        sopt.queue_capacity = vm["queue-size"].as<size_t>();
        sopt.max_running = parallel;
        sopt.max_step_tokens = batch_tokens;
        sopt.kv_budget_bytes = vm["kv-cache-size-mb"].as<uint64_t>() * 1024 * 1024;
        sopt.kv_memory_fraction = mem_fraction;
        sopt.prefix_cache = vm.count("no-prefix-cache") == 0;
        sopt.prefix_cache_shared = vm.count("prefix-cache-shared") != 0;
        sopt.chained_steps = vm.count("no-chained-steps") == 0;
        sopt.inference_timeout = std::chrono::seconds(vm["inference-timeout-sec"].as<uint32_t>());
        sopt.shutdown_grace = std::chrono::milliseconds(vm["shutdown-grace-ms"].as<uint32_t>());
        sopt.limits = so.limits;
        sopt.model_name = model_name;
        if (kv_publisher) {
            kv_publisher->set_medium(plugin.caps.device_kind == std::string("cpu") ? "CPU" : "GPU");
            sopt.kv_events = kv_publisher;
            if (vm.count("kv-events-block-tokens")) sopt.kv_events_block_tokens = vm["kv-events-block-tokens"].as<uint32_t>();
            sopt.kv_events_hash_seed = vm["kv-events-hash-seed"].as<std::string>();
        }
        svc = std::make_shared<service::Service>(engine, codec, sopt, metrics);

        http::NodeInfo ni;
        ni.model = model_name;
        ni.model_aliases = model_aliases;
        ni.refuse_unknown_models = !served_names.empty();
        ni.architecture = mi.architecture;
        ni.quant_kind = quant_kind;
        ni.tokenizer_kind = codec->kind();
        ni.vram_bytes_used = mi.device_bytes_used;
        ni.vocab_size = codec->vocab_size();
        ni.bos_id = codec->bos_id();
        ni.eos_id = codec->eos_id();
        ni.context_length = svc->n_ctx();
        ni.trained_context_length = mi.context_length;
        ni.max_tokens_out = max_out ? std::min(max_out, svc->n_ctx()) : svc->n_ctx();
        ni.slots = svc->max_running();
        ni.plugin_name = plugin.caps.name;
        ni.plugin_version = plugin.caps.version;
        ni.engine = plugin.caps.engine;
        ni.device_name = mi.device_name;
        ni.device_kind = plugin.caps.device_kind;
        ni.compute_capability = mi.compute_capability;
        ni.cuda_runtime_version = mi.runtime_version;
        ni.logprobs = facts.session_logits;
        ni.queue_capacity = sopt.queue_capacity;
        ni.plugins = registry_json(reg);
        // Residency is checked here, never on a request's path.
        std::string why;
        server.set_resident(engine->check_residency(&why), why);
        // Logged before /health answers ready, so whoever sees the one can read the other.
        const service::SeqLimits& kl = svc->kv_limits();
        log_event(lvl::info, "ready", {{"uri", uri}, {"context_length", svc->n_ctx()}, {"plugin", plugin.caps.name},
                                       {"engine_process", engine_process ? nlohmann::json(svc->stats().engine_pid.load()) : nlohmann::json(nullptr)},
                                       {"tokenizer", codec->kind()},
                                       {"chat_template", service::chat_template_kind_name(chat_state.kind)},
                                       {"batched", svc->batched()},
                                       {"max_running", svc->max_running()}, {"kv_blocks", kl.total_blocks},
                                       {"kv_block_tokens", kl.block_tokens}, {"kv_cache_bytes", svc->kv_cache_bytes()}});
        server.attach(svc, ni);
        if (!engine_process) last_words("serving");

        uint32_t every = vm["residency-check-sec"].as<uint32_t>();
        residency = std::thread([&, every] {
            std::unique_lock lock(residency_mu);
            while (!residency_cv.wait_for(lock, std::chrono::seconds(every ? every : 30), [&] { return residency_stop; })) {
                lock.unlock();
                std::string w;
                bool ok = engine->check_residency(&w);
                server.set_resident(ok, w);
                if (!ok) log_event(lvl::err, "error", {{"code", "RESIDENCY_CHECK_FAILED"}, {"message", w}});
                lock.lock();
            }
        });

        if (vm.count("callback-url")) {
            std::string err;
            nlohmann::json body = {{"worker_id", worker_id}, {"model_ref", model_ref}, {"vram_bytes", mi.device_bytes_used},
                                   {"uri", uri}};
            if (!post_callback(vm["callback-url"].as<std::string>(), body, err)) {
                log_event(lvl::err, "error", {{"code", "CALLBACK_FAILED"}, {"message", err}});
                print_error("callback to " + vm["callback-url"].as<std::string>() + " failed: " + err);
                exit_code = kFailure;
                latch->trigger("callback failed");
            }
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
