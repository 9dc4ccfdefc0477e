// Starting the model a server runs: the plugin that serves it, the load
// (its progress on /health, in the log and on stderr), the service over the
// engine, and the facts /health and /capabilities report.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "eh/http/model_pool.hpp"
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
    uint64_t host_bytes = 0;  // the weights' host memory the plugin reports
};

struct ModelStartContext {
    http::Server* server;          // told the load's progress, then given the service; null for a pool's model
    std::function<bool()> cancel;  // true once shutdown began: the load stops
    std::shared_ptr<service::Metrics> metrics;
    std::shared_ptr<service::ZmqKvPublisher> kv_events;  // null when off
    service::RequestLimits limits;
    std::string uri;  // for the "ready" log line
};

// Loads `m` with the plugin that serves it and attaches its service to
// ctx.server when there is one (/health turns ready). Throws Error; `out`
// holds what had started by then, for the caller to release.
void start_model(const ServeSettings& s, const ServedModelSpec& m, const ModelStartContext& ctx, RunningModel& out);

// Many models: the pool's loader (model_pool.hpp), which starts a model as
// start_model does; its memory is the device memory the service holds plus
// the weights' host memory.
http::ModelPool::Loader pool_loader(const ServeSettings& s, ModelStartContext ctx);

}  // namespace eh::cli
