// Starting the model a server runs: the plugin that serves it, the load
// (its progress on /health, in the log and on stderr), the service over the
// engine, and the facts /health and /capabilities report.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "eh/http/server.hpp"
#include "eh/loader/engine.hpp"
#include "eh/service/kv_event_publisher.hpp"
#include "eh/service/remote_engine.hpp"
#include "eh/service/service.hpp"
#include "serve_settings.hpp"

namespace eh::cli {

// What start_model() started; the caller releases it in reverse order.
struct RunningModel {
    std::shared_ptr<EngineModel> model;  // in this process only (not with --engine-process)
    std::shared_ptr<service::EngineSource> engine;
    std::shared_ptr<service::Service> svc;
    http::NodeInfo info;
};

struct ModelStartContext {
    http::Server& server;          // told the load's progress, then given the service
    std::function<bool()> cancel;  // true once shutdown began: the load stops
    std::shared_ptr<service::Metrics> metrics;
    std::shared_ptr<service::ZmqKvPublisher> kv_events;  // null when off
    service::RequestLimits limits;
    std::string uri;  // for the "ready" log line
};

// Loads `m` with the plugin that serves it and attaches its service to the
// server (/health turns ready). Throws Error; `out` holds what had started
// by then, for the caller to release.
void start_model(const ServeSettings& s, const ServedModelSpec& m, const ModelStartContext& ctx, RunningModel& out);

}  // namespace eh::cli
