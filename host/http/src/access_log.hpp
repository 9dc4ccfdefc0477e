// The access log: exactly one `http_request` event (event_log.hpp's format,
// JSON or text) per request the server answers, refusals by the connection
// gate included. Fields: method, path (without the query, which may carry
// secrets; at most 256 bytes), status, bytes (response bytes written, head
// included), total_ms (end of the request head to the last byte written),
// queue_ms (generation requests only: the longest wait of the request's jobs
// between submission and admission into the batch), correlation_id and,
// when the request carried any, `routing`: the routing headers a gateway
// sets (kRoutingHeaders), by name. No other request header is logged, so
// neither are API keys.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "eh/service/job.hpp"

namespace httplib { struct Request; }

namespace eh::http::access {

// Logged when present: the request's id (Envoy sets it; the Gateway API
// Inference Extension's endpoint picker keys its work by it), the endpoint
// that picker chose for it, and the W3C trace context. Each value at most
// 256 bytes, invalid UTF-8 replaced.
inline constexpr const char* kRoutingHeaders[] = {"x-request-id", "x-gateway-destination-endpoint", "traceparent"};

struct Entry {
    std::string method, path, correlation_id;
    std::vector<std::pair<std::string, std::string>> routing;  // kRoutingHeaders present, in that order
    int status = 0;  // 0: no response was written
    uint64_t bytes = 0;
    double total_ms = 0;
    std::optional<double> queue_ms;
};

void write(const Entry& e);

// The request the calling connection thread is serving (set by the gate
// around httplib's handling); handlers that submit jobs name them here.
struct Scope {
    Scope();
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Entry entry;
    std::vector<std::shared_ptr<service::Job>> jobs;
    // queue_ms from the jobs that were admitted.
    void finish_queue_time();
};

Scope* current();
void note_jobs(const std::vector<std::shared_ptr<service::Job>>& jobs);

// The routing headers `req` carries, into e.routing.
void note_routing(Entry& e, const httplib::Request& req);

// `target` without its query, cut to 256 bytes.
std::string log_path(const std::string& target);

}  // namespace eh::http::access
