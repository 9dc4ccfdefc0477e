#include "access_log.hpp"

#include <httplib.h>

#include <algorithm>

#include "eh/service/event_log.hpp"
#include "eh/service/utf8.hpp"

namespace eh::http::access {
namespace {

thread_local Scope* t_current = nullptr;

}  // namespace

void write(const Entry& e) {
    nlohmann::json f = {{"method", e.method}, {"path", e.path}, {"status", e.status}, {"bytes", e.bytes},
                        {"total_ms", e.total_ms}, {"correlation_id", e.correlation_id}};
    if (e.queue_ms) f["queue_ms"] = *e.queue_ms;
    if (!e.routing.empty()) {
        nlohmann::json r = nlohmann::json::object();
        for (const auto& [name, value] : e.routing) r[name] = value;
        f["routing"] = std::move(r);
    }
    service::log_event(spdlog::level::info, "http_request", std::move(f));
}

void note_routing(Entry& e, const httplib::Request& req) {
    e.routing.clear();
    for (const char* name : kRoutingHeaders) {
        if (!req.has_header(name)) continue;
        std::string v = req.get_header_value(name);
        if (v.size() > 256) v.resize(256);
        e.routing.emplace_back(name, service::sanitize_utf8(v));
    }
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
