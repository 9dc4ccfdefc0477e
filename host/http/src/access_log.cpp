#include "access_log.hpp"

#include <algorithm>

#include "eh/service/event_log.hpp"

namespace eh::http::access {
namespace {

thread_local Scope* t_current = nullptr;

}  // namespace

void write(const Entry& e) {
    nlohmann::json f = {{"method", e.method}, {"path", e.path}, {"status", e.status}, {"bytes", e.bytes},
                        {"total_ms", e.total_ms}, {"correlation_id", e.correlation_id}};
    if (e.queue_ms) f["queue_ms"] = *e.queue_ms;
    service::log_event(spdlog::level::info, "http_request", std::move(f));
}

Scope::Scope() { t_current = this; }
Scope::~Scope() {
    if (t_current == this) t_current = nullptr;
}

void Scope::finish_queue_time() {
    for (const auto& j : jobs) {
        int64_t us = j->queue_us.load();
        if (us >= 0) entry.queue_ms = std::max(entry.queue_ms.value_or(0.0), double(us) / 1000.0);
    }
}

Scope* current() { return t_current; }

void note_jobs(const std::vector<std::shared_ptr<service::Job>>& jobs) {
    if (!t_current) return;
    for (const auto& j : jobs)
        if (std::find(t_current->jobs.begin(), t_current->jobs.end(), j) == t_current->jobs.end()) t_current->jobs.push_back(j);
}

std::string log_path(const std::string& target) {
    std::string p = target.substr(0, target.find('?'));
    if (p.size() > 256) p.resize(256);
    return p;
}

}  // namespace eh::http::access
