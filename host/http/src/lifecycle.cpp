// What a cluster asks of a server's lifecycle: liveness apart from
// readiness (Kubernetes probes), and which model names it answers to.
#include <fmt/format.h>

#include <algorithm>

#include "eh/service/utf8.hpp"
#include "impl.hpp"

namespace eh::http {

ServingState serving_state(const Server::Impl& s) {
    bool resident;
    std::string why;
    {
        std::lock_guard lock(s.mu);
        resident = s.resident;
        why = s.resident_why;
    }
    const State st = s.state.load();
    const auto svc = s.get_service();
    // An engine process being restarted is loading its model again; one
    // that crashed too often stays down.
    const service::EngineState es = svc ? svc->engine_state() : service::EngineState::Ready;
    if (es == service::EngineState::Failed) {
        resident = false;
        why = "the engine crashed too often and is not restarted";
    }
    ServingState out;
    out.resident = resident;
    if (!resident) out.reason = why;
    out.status = st == State::Loading ? "loading" : st == State::Stopping ? "shutting_down"
                 : es == service::EngineState::Restarting ? "loading"
                 : resident ? "healthy" : "unhealthy";
    return out;
}

std::string unknown_model(const NodeInfo& ni, const std::string& requested) {
    if (!ni.refuse_unknown_models || requested.empty() || requested == ni.model) return "";
    if (std::find(ni.model_aliases.begin(), ni.model_aliases.end(), requested) != ni.model_aliases.end()) return "";
    std::string names = "'" + ni.model + "'";
    for (const auto& a : ni.model_aliases) names += ", '" + a + "'";
    return fmt::format("the model '{}' is not served here (served: {})",
                       service::sanitize_utf8(requested.substr(0, 200)), names);
}

void Server::Impl::install_lifecycle() {
    // Liveness: the process answers and can serve again without a restart.
    // Loading and draining are alive; an engine that crashed too often or
    // weights that left device memory are not (a restart is the cure).
    http.Get("/health/live", [this](const httplib::Request& req, httplib::Response& res) {
        correlation_id(req, res);
        const ServingState s = serving_state(*this);
        nlohmann::json j = {{"status", s.status == "unhealthy" ? "unhealthy" : "alive"}};
        if (s.status == "unhealthy") j["reason"] = s.reason;
        send_json(res, s.status == "unhealthy" ? 503 : 200, j);
    });
    // Readiness: send it requests. 503 while loading, from the moment
    // shutdown begins (SIGTERM: "draining", while running requests finish),
    // and while unhealthy.
    http.Get("/health/ready", [this](const httplib::Request& req, httplib::Response& res) {
        correlation_id(req, res);
        const ServingState s = serving_state(*this);
        const std::string status = s.status == "healthy" ? "ready" : s.status == "shutting_down" ? "draining" : s.status;
        nlohmann::json j = {{"status", status}};
        if (status == "unhealthy") j["reason"] = s.reason;
        if (status == "draining")
            if (auto svc = get_service()) j["running"] = svc->active_jobs();
        send_json(res, status == "ready" ? 200 : 503, j);
    });
    // Stop on request, when started with --allow-shutdown-endpoint.
    http.Post("/shutdown", [this](const httplib::Request& req, httplib::Response& res) {
        std::string cid = correlation_id(req, res);
        if (!options.allow_shutdown_endpoint) {
            send_error(res, 404, "NOT_FOUND", "POST /shutdown is disabled (start with --allow-shutdown-endpoint)", cid);
            return;
        }
        std::function<void()> fn;
        {
            std::lock_guard lock(mu);
            fn = shutdown_fn;
        }
        send_json(res, 202, {{"status", "shutting_down"}});
        if (fn) std::call_once(shutdown_once, fn);
    });
}

}  // namespace eh::http
