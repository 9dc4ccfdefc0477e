// Internals shared by the route files.
#pragma once

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>
#include <string>

#include "eh/error.hpp"
#include "eh/service/job.hpp"
#include "eh/service/request.hpp"
#include "connection.hpp"
#include "eh/http/server.hpp"
#include "access_log.hpp"
#include "auth.hpp"
#include "eh/http/model_pool.hpp"

#include "artifacts.hpp"
#include "file_digest.hpp"

namespace eh::http {

enum class State { Loading, Ready, Stopping };

struct Server::Impl {
    ServerOptions options;
    ApiKeys keys;
    std::shared_ptr<service::Metrics> metrics;
    GatedServer http;
    // Server::run()/stop() may race (stop before listen has begun): run
    // never starts listening once stop was asked for, and stop waits for a
    // run in progress to end.
    std::atomic<bool> stop_requested{false}, in_run{false};
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    int64_t started_unix = 0;

    mutable std::mutex mu;
    std::shared_ptr<service::Service> service;  // set by attach()
    std::shared_ptr<ModelPool> pool_;           // set by attach_pool() (many models); then `service` stays null
    NodeInfo info;
    bool resident = true;
    std::string resident_why;
    std::function<void()> shutdown_fn;
    std::once_flag shutdown_once;

    // Artifact records (serve --artifacts-dir); null when off.
    std::unique_ptr<ArtifactStore> artifacts;
    std::unique_ptr<FileDigest> model_digest;

    std::atomic<State> state{State::Loading};
    std::atomic<float> load_progress{0};
    std::atomic<int> open_streams{0};

    // After a model (or the pool) is attached: loading is over, and the
    // server is ready unless it is already stopping.
    void loaded() {
        load_progress.store(1);
        State loading = State::Loading;
        state.compare_exchange_strong(loading, State::Ready);
    }

    std::shared_ptr<service::Service> get_service() const {
        std::lock_guard lock(mu);
        return service;
    }
    std::shared_ptr<ModelPool> get_pool() const {
        std::lock_guard lock(mu);
        return pool_;
    }
    NodeInfo get_info() const {
        std::lock_guard lock(mu);
        return info;
    }
    double uptime() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    }

    // One registration per API, beside its code.
    void install_gates();    // Host check, CORS, API key, error bodies (server.cpp)
    void install_health();   // /health, /capabilities, /metrics (health_api.cpp)
    void install_native();   // /execute, /cancel, /tokenize, /detokenize (native_api.cpp)
    void install_openai();     // /v1/models, /v1/completions, /v1/chat/completions (openai_api.cpp)
    void install_anthropic();  // /v1/messages (anthropic_api.cpp)
    void install_lifecycle();  // /health/live, /health/ready, /shutdown (lifecycle.cpp)
    void install_models();     // /v1/models/load, /v1/models/unload (models_api.cpp)
};

// The chat page's route (web_page.cpp).
void install_web_page(Server::Impl& s);

// lifecycle.cpp: /health's status (healthy, loading, shutting_down,
// unhealthy); `resident` false (and `reason` why) when the weights left
// device memory or the engine crashed too often.
struct ServingState {
    std::string status, reason;
    bool resident = true;
};
ServingState serving_state(const Server::Impl& s);
// Why a request naming `requested` as its model is refused (404): with
// --served-model-name, a name that is none of the served ones; "" when it
// is served (an empty name always is).
std::string unknown_model(const NodeInfo& ni, const std::string& requested);

// Keeps the open-stream count right however a stream ends.
struct StreamGuard {
    std::atomic<int>& n;
    explicit StreamGuard(std::atomic<int>& c) : n(c) { ++n; }
    ~StreamGuard() { --n; }
};

// ---- helpers (http_util.cpp) -----------------------------------------------

// The request's X-Correlation-Id when it is sane, else a fresh one; echoed
// in the response header.
std::string correlation_id(const httplib::Request& req, httplib::Response& res);
std::string new_correlation_id();
// Who submitted a request, for POST /cancel: the Authorization header when the
// client sent one (an API key: any client holding it), else its IP address.
std::string submitter(const httplib::Request& req);
// The request's prefix-cache scope (cache_scope.cpp): a digest of the API
// key it presented when keys are configured, else "".
std::string cache_scope_of(const Server::Impl& s, const httplib::Request& req);
// The next event of `job` for a route that answers once, at the end (not
// streamed). nullopt when the client's connection closed first: then every
// job of `request` is cancelled (CancelReason::Disconnect) at once, so its
// KV blocks go back to the pool instead of when the answer is written.
std::optional<service::JobEvent> wait_event(service::Service& svc, service::Job& job,
                                            const std::vector<std::shared_ptr<service::Job>>& request);
// The eh_requests_total outcome of a request refused before its job ran.
const char* rejection_outcome(const std::exception& e);
int http_status_for(Code code);
// A job's error event that says when to retry (ENGINE_CRASHED): Retry-After in whole seconds.
void set_retry_after(httplib::Response& res, const service::JobEvent& ev);
// {"error":{code,message,details,correlation_id,type,param}}
nlohmann::json error_body(const std::string& code, const std::string& message, const std::string& correlation,
                          const nlohmann::json& details = nlohmann::json::object(), const std::string& param = "");
void send_json(httplib::Response& res, int status, const nlohmann::json& body);
// error_body() plus the OpenAI "type" for the status.
nlohmann::json typed_error_body(int status, const std::string& code, const std::string& message,
                                const std::string& correlation, const nlohmann::json& details = nlohmann::json::object(),
                                const std::string& param = "");
void send_error(httplib::Response& res, int status, const std::string& code, const std::string& message,
                const std::string& correlation, const nlohmann::json& details = nlohmann::json::object(),
                const std::string& param = "");
// Maps an exception from validation/submission to a response (400/503...).
void send_exception(httplib::Response& res, const std::exception& e, const std::string& correlation);
// 503 unless the service is ready; returns the service when it is (with
// many models, the default model's, loaded first; an error answered when
// that fails).
std::shared_ptr<service::Service> require_ready(Server::Impl& s, httplib::Response& res, const std::string& correlation);
// require_ready's 503s without a service: false when it answered one.
bool accepting(Server::Impl& s, httplib::Response& res, const std::string& correlation);
// The service a request naming `model` runs on: the one model's once the
// name is checked (unknown_model), or the pool's model of that name, loaded
// first. Throws Error(NOT_FOUND) for a name not served, ModelStillLoading
// (503 MODEL_LOADING) past the pool's load wait.
std::shared_ptr<service::Service> service_for(Server::Impl& s, const std::string& model);
// A `model` of "<model>:<adapter>" (LoRA, --lora) on a one-model server with
// adapters, where <model> is a name the model answers to: `model` becomes
// <model> and `adapter` <adapter> (the service checks that it is served:
// 404 ADAPTER_NOT_FOUND). RequestError when `adapter` (the `lora` field)
// already names another. Anything else is left as it is.
void split_model_adapter(Server::Impl& s, std::string& model, std::string& adapter);
std::string dump(const nlohmann::json& j);

// ---- template_cancel.cpp -------------------------------------------------------

// Has the service render a parsed chat request (OpenAI's or Anthropic's)
// into its prompt (service::render_chat_prompt, where chat templating
// happens) on the connection's thread, with the cancel hook the template
// polls: its evaluation ends early when the server begins shutting down
// (throws SHUTTING_DOWN, 503) or the client has closed its connection
// (CANCELLED), so a long evaluation neither holds the shutdown nor works for
// nobody.
void render_chat_cancellable(Server::Impl& s, const service::Service& svc, service::ChatRequest& r);
std::string sse_event(const std::string& name, const nlohmann::json& data);
std::string sse_data(const nlohmann::json& data);
int64_t unix_now();

}  // namespace eh::http
