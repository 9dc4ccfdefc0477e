#include "eh/http/model_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <system_error>

#include "eh/service/event_log.hpp"
#include "eh/service/utf8.hpp"

namespace eh::http {

using service::log_event;
namespace lvl = spdlog::level;

namespace {
constexpr size_t npos = size_t(-1);
}

ModelPool::ModelPool(std::vector<PoolModelSpec> models, Loader loader, ModelPoolOptions options)
    : specs_(std::move(models)), loader_(std::move(loader)), options_(options), entries_(specs_.size()) {
    if (specs_.empty()) throw Error(Code::InvalidRequest, "a model pool needs at least one model");
    sweeper_ = std::thread([this] { sweep(); });
}

ModelPool::~ModelPool() {
    shutdown();
    release();
}

size_t ModelPool::index_of(const std::string& name) const {
    if (name.empty()) return 0;
    for (size_t i = 0; i < specs_.size(); ++i) {
        if (specs_[i].name == name) return i;
        if (std::find(specs_[i].aliases.begin(), specs_[i].aliases.end(), name) != specs_[i].aliases.end()) return i;
    }
    return npos;
}

const PoolModelSpec* ModelPool::find(const std::string& name) const {
    const size_t i = index_of(name);
    return i == npos ? nullptr : &specs_[i];
}

std::string ModelPool::unknown(const std::string& name) const {
    if (index_of(name) != npos) return "";
    // The first names only: a --models-dir may hold hundreds.
    constexpr size_t kListed = 20;
    std::vector<std::string> all;
    for (const auto& m : specs_) {
        all.push_back(m.name);
        for (const auto& a : m.aliases) all.push_back(a);
    }
    std::string names;
    for (size_t i = 0; i < all.size() && i < kListed; ++i) names += (i ? ", '" : "'") + all[i] + "'";
    if (all.size() > kListed) names += fmt::format(" and {} more (GET /v1/models lists them)", all.size() - kListed);
    return fmt::format("the model '{}' is not served here (served: {})", service::sanitize_utf8(name.substr(0, 200)),
                       names);
}

std::shared_ptr<service::Service> ModelPool::acquire(const std::string& name) {
    const size_t i = index_of(name);
    if (i == npos) throw Error(Code::NotFound, unknown(name));
    std::unique_lock lock(mu_);
    if (stopping_) throw Error(Code::ShuttingDown, "the server is shutting down; not accepting new jobs");
    Entry& e = entries_[i];
    if (e.state == State::Unloaded) {
        e.state = State::Loading;
        const uint64_t attempt = ++e.attempts;
        // Room for its estimate: what it held last time, else its size on disk.
        evict_lru_until_locked(i, e.last_memory ? e.last_memory : specs_[i].size_hint);
        log_event(lvl::info, "model_load_begin", {{"model", specs_[i].name}});
        try {
            std::thread([this, i, attempt] { load_thread(i, attempt); }).detach();
        } catch (const std::system_error& err) {  // no thread to be had
            e.state = State::Unloaded;
            throw Error(Code::Internal, std::string("cannot start the model's load: ") + err.what());
        }
        ++loading_now_;
    }
    const uint64_t mine = e.attempts;
    const bool settled = cv_.wait_for(lock, options_.load_wait, [&] { return stopping_ || e.state != State::Loading; });
    if (stopping_) throw Error(Code::ShuttingDown, "the server is shutting down; not accepting new jobs");
    if (!settled) throw ModelStillLoading(specs_[i].name);
    if (e.state == State::Loaded) {
        e.last_used = std::chrono::steady_clock::now();
        return e.loaded.service;
    }
    if (e.attempts == mine && !e.error.empty()) throw Error(e.error_code, e.error);
    // Loaded and evicted again before this request woke: it may retry.
    throw ModelStillLoading(specs_[i].name);
}

void ModelPool::load_thread(size_t i, uint64_t attempt) {
    const auto t0 = std::chrono::steady_clock::now();
    PooledModel m;
    std::string error;
    Code code = Code::Internal;
    try {
        if (options_.memory_budget_bytes) {
            // The models unloaded to make room hold their memory until their
            // last request has finished: the load begins after that.
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return stopping_ || (retired_.empty() && releasing_ == 0); });
            if (stopping_) throw Error(Code::ShuttingDown, "the server is shutting down");
        }
        m = loader_(specs_[i]);
        if (!m.service) throw Error(Code::Internal, "the loader returned no service");
    } catch (const Error& e) {
        error = e.what();
        code = e.code();
    } catch (const std::exception& e) {
        error = e.what();
    }
    std::vector<PooledModel> drop;  // freed outside the lock
    {
        std::lock_guard lock(mu_);
        Entry& e = entries_[i];
        if (!error.empty() || stopping_) {
            e.state = State::Unloaded;
            e.error = error.empty() ? "the server is shutting down" : error;
            e.error_code = error.empty() ? Code::ShuttingDown : code;
            if (m.service) drop.push_back(std::move(m));
            log_event(lvl::err, "model_load_failed",
                      {{"model", specs_[i].name}, {"code", code_name(e.error_code)}, {"message", e.error}});
        } else if (e.attempts == attempt) {
            e.loaded = std::move(m);
            e.last_memory = e.loaded.memory_bytes;
            e.state = State::Loaded;
            e.error.clear();
            e.last_used = std::chrono::steady_clock::now();
            log_event(lvl::info, "model_loaded",
                      {{"model", specs_[i].name}, {"memory_bytes", e.loaded.memory_bytes},
                       {"load_ms", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()}});
            evict_lru_until_locked(i, 0);  // the measured memory, now
        } else {
            drop.push_back(std::move(m));
        }
    }
    for (auto& d : drop) {
        d.service->shutdown();
        d.service.reset();
        if (d.release) d.release();
    }
    std::lock_guard lock(mu_);
    --loading_now_;
    cv_.notify_all();
}

void ModelPool::retire_locked(size_t i, const char* why) {
    Entry& e = entries_[i];
    log_event(lvl::info, "model_unload", {{"model", specs_[i].name}, {"reason", why}, {"phase", "begin"}});
    retired_.push_back({specs_[i].name, std::move(e.loaded)});
    e.loaded = {};
    e.state = State::Unloaded;
}

void ModelPool::evict_lru_until_locked(size_t keep, uint64_t extra) {
    if (options_.memory_budget_bytes == 0) return;
    for (;;) {
        uint64_t used = 0;
        size_t lru = npos;
        for (size_t j = 0; j < entries_.size(); ++j) {
            if (entries_[j].state != State::Loaded) continue;
            used += entries_[j].loaded.memory_bytes;
            if (j != keep && (lru == npos || entries_[j].last_used < entries_[lru].last_used)) lru = j;
        }
        if (used + extra <= options_.memory_budget_bytes || lru == npos) return;
        retire_locked(lru, "memory_budget");
    }
}

bool ModelPool::idle(const PooledModel& m) {
    // One reference: the pool's. A request between acquire() and its job
    // holds another; a job waiting or running is counted by the service.
    return m.service.use_count() == 1 && m.service->active_jobs() == 0 && m.service->queue_depth() == 0;
}

void ModelPool::sweep() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
        cv_.wait_for(lock, options_.sweep_every, [&] { return stopping_; });
        if (stopping_) break;
        const auto now = std::chrono::steady_clock::now();
        for (size_t i = 0; i < entries_.size(); ++i) {
            Entry& e = entries_[i];
            if (e.state != State::Loaded) continue;
            if (!idle(e.loaded)) {
                e.last_used = now;  // idle time counts from the last request's end
                continue;
            }
            if (options_.idle_unload.count() > 0 && now - e.last_used >= options_.idle_unload) retire_locked(i, "idle");
        }
        std::vector<Retired> done;
        for (auto it = retired_.begin(); it != retired_.end();) {
            if (idle(it->model)) {
                done.push_back(std::move(*it));
                it = retired_.erase(it);
            } else {
                ++it;
            }
        }
        if (done.empty()) continue;
        releasing_ += done.size();
        lock.unlock();
        for (auto& r : done) {
            r.model.service->shutdown();
            r.model.service.reset();
            if (r.model.release) r.model.release();
            log_event(lvl::info, "model_unload", {{"model", r.name}, {"phase", "complete"}});
        }
        lock.lock();
        releasing_ -= done.size();
        cv_.notify_all();  // a load waiting for room
    }
}

std::optional<NodeInfo> ModelPool::info(const std::string& name) const {
    const size_t i = index_of(name);
    if (i == npos) return std::nullopt;
    std::lock_guard lock(mu_);
    if (entries_[i].state != State::Loaded) return std::nullopt;
    return entries_[i].loaded.info;
}

bool ModelPool::unload(const std::string& name) {
    const size_t i = index_of(name);
    if (i == npos) throw Error(Code::NotFound, unknown(name));
    std::lock_guard lock(mu_);
    if (entries_[i].state != State::Loaded) return false;
    retire_locked(i, "request");
    return true;
}

nlohmann::json ModelPool::status() const {
    std::lock_guard lock(mu_);
    nlohmann::json out = nlohmann::json::array();
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < specs_.size(); ++i) {
        const Entry& e = entries_[i];
        nlohmann::json j = {{"id", specs_[i].name},
                            {"aliases", specs_[i].aliases},
                            {"state", e.state == State::Loaded ? "loaded" : e.state == State::Loading ? "loading" : "unloaded"}};
        if (e.state == State::Loaded) {
            j["memory_bytes"] = e.loaded.memory_bytes;
            j["active_jobs"] = e.loaded.service->active_jobs();
            j["queue_depth"] = e.loaded.service->queue_depth();
            j["idle_seconds"] = std::chrono::duration<double>(now - e.last_used).count();
            j["context_length"] = e.loaded.info.context_length;
            j["engine_state"] = service::engine_state_name(e.loaded.service->engine_state());  // ready, restarting, failed
        }
        if (e.state == State::Unloaded && !e.error.empty()) j["last_error"] = e.error;
        out.push_back(j);
    }
    return out;
}

std::vector<std::string> ModelPool::loaded() const {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (size_t i = 0; i < specs_.size(); ++i)
        if (entries_[i].state == State::Loaded) out.push_back(specs_[i].name);
    return out;
}

std::vector<std::shared_ptr<service::Service>> ModelPool::services() const {
    std::lock_guard lock(mu_);
    std::vector<std::shared_ptr<service::Service>> out;
    for (const auto& e : entries_)
        if (e.state == State::Loaded) out.push_back(e.loaded.service);
    for (const auto& r : retired_) out.push_back(r.model.service);
    return out;
}

uint64_t ModelPool::memory_used() const {
    std::lock_guard lock(mu_);
    uint64_t used = 0;
    for (const auto& e : entries_)
        if (e.state == State::Loaded) used += e.loaded.memory_bytes;
    return used;
}

void ModelPool::shutdown() {
    std::vector<std::shared_ptr<service::Service>> services;
    {
        std::unique_lock lock(mu_);
        if (stopping_ && !sweeper_.joinable()) return;
        stopping_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return loading_now_ == 0; });  // loads see the shutdown through their cancel hook
        for (auto& e : entries_)
            if (e.state == State::Loaded) services.push_back(e.loaded.service);
        for (auto& r : retired_) services.push_back(r.model.service);
    }
    if (sweeper_.joinable()) sweeper_.join();
    // At once: each waits out its shutdown grace.
    std::vector<std::thread> stops;
    for (auto& s : services) stops.emplace_back([s] { s->shutdown(); });
    for (auto& t : stops) t.join();
}

void ModelPool::release() {
    std::vector<PooledModel> all;
    {
        std::lock_guard lock(mu_);
        for (auto& e : entries_)
            if (e.state == State::Loaded) {
                all.push_back(std::move(e.loaded));
                e.loaded = {};
                e.state = State::Unloaded;
            }
        for (auto& r : retired_) all.push_back(std::move(r.model));
        retired_.clear();
    }
    for (auto& m : all) {
        m.service.reset();
        if (m.release) m.release();
    }
}

}  // namespace eh::http
