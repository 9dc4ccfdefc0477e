// The engine-host HTTP server. It starts listening before the model is
// loaded (so /health can answer "loading"), serves generation once a
// Service is attached, and refuses new work once shutdown begins.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "eh/service/metrics.hpp"
#include "eh/service/service.hpp"

namespace httplib { class Server; }

namespace eh::http {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;                 // 0: any free port (see bound_port())
    bool cors = false;               // allow browser tooling on localhost origins
    bool allow_shutdown_endpoint = false;
    size_t threads = 32;             // unused: connections get a thread each, up to the gate's cap
    // Host header values accepted besides IP literals, "localhost" and the
    // bound host (DNS-rebinding guard); "*" accepts any.
    std::vector<std::string> allowed_hosts;
    service::RequestLimits limits;
    // API keys (auth.hpp): when any is set, every route but /health, the
    // chat page's files and (unless metrics_require_key) /metrics answers
    // 401 without one of them. The server keeps only their digests.
    std::vector<std::string> api_keys;
    bool metrics_require_key = false;
    // Connections one client address (IPv4, or IPv6 /64) may hold at once;
    // past it 429 TOO_MANY_CONNECTIONS (connection.hpp).
    size_t max_connections_per_client = 64;
    // HTTPS when both are set (PEM files; the certificate file may hold the
    // chain). bind() throws eh::Error when they cannot be used.
    std::string ssl_cert_file, ssl_key_file;
    // Per-job artifact records of native /execute jobs (docs/http-api.md,
    // "Artifact records"): off while artifacts_dir is empty.
    std::string artifacts_dir;
    size_t artifacts_max_files = 1000;
    size_t artifacts_max_transcript_bytes = size_t(1) << 20;
    // What the records name as the model: the --model reference as given
    // and the file whose SHA-256 they carry (hashed in the background).
    std::string model_ref, model_path;
    // The Responses API's store of finished responses (previous_response_id,
    // GET/DELETE /v1/responses/{id}): at most this many, holding at most this
    // many bytes of conversations and answers; the least recently used go
    // first. 0 responses: none is kept.
    size_t responses_max = 1000;
    size_t responses_max_bytes = size_t(64) << 20;
};

// Facts about the node, gathered once at startup: /health and /capabilities
// never call into the plugin.
struct NodeInfo {
    std::string model;               // the id clients use (OpenAI "model")
    // Further names clients may send as `model` (--served-model-name after
    // the first, and the file's name); /v1/models lists them after `model`.
    std::vector<std::string> model_aliases;
    // --served-model-name given: a request naming another model gets 404.
    bool refuse_unknown_models = false;
    std::string architecture;
    std::string quant_kind;
    std::string tokenizer_kind;
    uint64_t vram_bytes_used = 0;       // at load; once attached, /health reads the service's live figure
    uint32_t vocab_size = 0;
    int32_t bos_id = -1;             // the tokenizer's; -1: none (null in /health)
    int32_t eos_id = -1;
    uint32_t context_length = 0;     // the context the server runs with
    uint32_t trained_context_length = 0;
    uint32_t max_tokens_out = 2048;
    std::string plugin_name;
    std::string plugin_version;
    std::string engine;
    std::string device_name;
    // Every device the model runs on, one per rank (several with tensor
    // parallelism): [{rank, gpu, name, total_bytes, free_bytes_at_start}],
    // or [{rank, device: "cpu"}]; /health's "devices", /metrics'
    // eh_model_device_info.
    nlohmann::json devices = nlohmann::json::array();
    std::string device_kind;         // the plugin's: "cpu" weights are never "resident" in /health
    int compute_capability = 0;
    int cuda_runtime_version = 0;
    bool logprobs = false;
    size_t queue_capacity = 0;
    uint32_t slots = 1;              // requests that run at once (the batch)
    nlohmann::json plugins = nlohmann::json::array();  // record_json of every plugin seen
};

class ModelPool;  // model_pool.hpp

class Server {
public:
    Server(ServerOptions options, std::shared_ptr<service::Metrics> metrics);
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    // Binds the socket; returns the port (useful with port 0). Throws
    // eh::Error when the address cannot be bound.
    int bind();
    // Serves until stop(). Call from a thread of its own.
    void run();
    void stop();
    int bound_port() const { return port_; }

    // Model load progress in [0,1] while loading.
    void set_load_progress(float fraction);
    // The model is loaded: serve it.
    void attach(std::shared_ptr<service::Service> service, NodeInfo info);
    // Many models: requests pick one by name from `pool` (model_pool.hpp);
    // `info` holds the server-wide facts (plugins, limits) and the default
    // model's name.
    void attach_pool(std::shared_ptr<ModelPool> pool, NodeInfo info);
    // Result of the periodic residency check (done off the request path).
    void set_resident(bool resident, const std::string& why);
    // Stop accepting work; /health says "shutting_down", /health/ready
    // "draining".
    void begin_shutdown();
    // Waits (up to `timeout`) until no response stream is open.
    void drain(std::chrono::milliseconds timeout);
    // Called (once, from an HTTP thread) for POST /shutdown.
    void on_shutdown_request(std::function<void()> fn);

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
    int port_ = 0;
};

}  // namespace eh::http
