// Many models behind one server: each named model is loaded on first use
// (or POST /v1/models/load), gets a Service of its own, and is unloaded
// least recently used first when the loaded models' memory passes a budget,
// after it sat idle too long, or on POST /v1/models/unload. An unload never
// ends a request: the model stops being handed out at once and is released
// when its last request has finished.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "eh/http/server.hpp"
#include "eh/service/service.hpp"

namespace eh::http {

struct PoolModelSpec {
    std::string name;                  // the id /v1/models lists and requests send
    std::vector<std::string> aliases;  // further names a request may send
    std::string path;                  // what the loader opens
    // Its memory before it was ever loaded (the weights' bytes on disk):
    // room is made for it under the budget before its first load; later
    // loads use what it held the last time.
    uint64_t size_hint = 0;
};

// What the loader returns for a loaded model.
struct PooledModel {
    std::shared_ptr<service::Service> service;
    NodeInfo info;
    uint64_t memory_bytes = 0;      // counted against the budget
    std::function<void()> release;  // after the service is shut down and dropped: frees the engine and weights
};

struct ModelPoolOptions {
    uint64_t memory_budget_bytes = 0;                   // 0: no budget
    std::chrono::seconds idle_unload{0};                // 0: never
    std::chrono::milliseconds load_wait{60000};         // how long a request waits for its model's load
    std::chrono::milliseconds sweep_every{200};         // how often idle and retired models are looked at
};

// A request's model is still loading past ModelPoolOptions::load_wait: the
// route answers 503 MODEL_LOADING with Retry-After.
struct ModelStillLoading : std::runtime_error {
    explicit ModelStillLoading(const std::string& model)
        : std::runtime_error("the model '" + model + "' is still loading; retry shortly"), model_name(model) {}
    std::string model_name;
};

class ModelPool {
public:
    using Loader = std::function<PooledModel(const PoolModelSpec&)>;

    // `models` non-empty; the first is the default (a request without `model`).
    ModelPool(std::vector<PoolModelSpec> models, Loader loader, ModelPoolOptions options);
    ~ModelPool();
    ModelPool(const ModelPool&) = delete;
    ModelPool& operator=(const ModelPool&) = delete;

    // The model a name (id or alias) means; nullptr for none. "" is the default.
    const PoolModelSpec* find(const std::string& name) const;
    const std::vector<PoolModelSpec>& models() const { return specs_; }
    // Why a name is refused (404 NOT_FOUND): "" when it names a model.
    std::string unknown(const std::string& name) const;

    // The service of the model `name` means, loading it first when it is not
    // loaded (waits up to load_wait). Throws Error(NotFound) for an unknown
    // name, ModelStillLoading past the wait, the load's own Error when it
    // failed, Error(ShuttingDown) once shutdown began.
    std::shared_ptr<service::Service> acquire(const std::string& name);
    // The facts of a loaded model (for the response's `model` and the
    // template); nullopt when it is not loaded.
    std::optional<NodeInfo> info(const std::string& name) const;

    // Starts an unload: false when the model was not loaded. Its running
    // requests finish first.
    bool unload(const std::string& name);

    // [{id, aliases, state: loaded|loading|unloaded, memory_bytes, active_jobs, ...}]
    nlohmann::json status() const;
    // Loaded models' names.
    std::vector<std::string> loaded() const;
    // Every service still alive (loaded, or unloading while its requests
    // finish): POST /cancel looks for a job in each.
    std::vector<std::shared_ptr<service::Service>> services() const;
    uint64_t memory_used() const;

    // Stops handing models out and shuts every service down at once
    // (running requests end as with one model: shutdown_grace, then
    // SHUTTING_DOWN); waits for loads in progress. release() then drops the
    // services and frees their engines, once the HTTP side has stopped.
    void shutdown();
    void release();

private:
    enum class State { Unloaded, Loading, Loaded };
    struct Entry {
        State state = State::Unloaded;
        PooledModel loaded;
        std::chrono::steady_clock::time_point last_used{};
        uint64_t attempts = 0;  // loads begun; a waiter watches its own
        uint64_t last_memory = 0;  // what it held when last loaded; 0: never loaded
        std::string error;      // the last load's failure
        Code error_code = Code::Internal;
    };
    struct Retired {
        std::string name;
        PooledModel model;
    };

    size_t index_of(const std::string& name) const;  // npos for none
    void load_thread(size_t i, uint64_t attempt);
    void retire_locked(size_t i, const char* why);  // mu_ held
    // Unloads the least recently used loaded models, never `keep`, until the
    // loaded ones and `extra` more bytes fit --models-memory-mb. mu_ held.
    void evict_lru_until_locked(size_t keep, uint64_t extra);
    void sweep();
    static bool idle(const PooledModel& m);

    const std::vector<PoolModelSpec> specs_;
    const Loader loader_;
    const ModelPoolOptions options_;
    mutable std::mutex mu_;
    std::condition_variable cv_;  // a load ended; shutdown
    std::vector<Entry> entries_;
    std::vector<Retired> retired_;
    size_t loading_now_ = 0;  // load threads (detached) still running
    size_t releasing_ = 0;    // retired models the sweeper is releasing now
    bool stopping_ = false;
    std::thread sweeper_;
};

}  // namespace eh::http
