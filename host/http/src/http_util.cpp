#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "auth.hpp"
#include "eh/service/lora.hpp"
#include "eh/service/request.hpp"
#include "eh/service/service.hpp"
#include "eh/service/utf8.hpp"
#include "impl.hpp"

namespace eh::http {

std::string new_correlation_id() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    return fmt::format("{:016x}{:016x}", rng(), rng());
}

std::string correlation_id(const httplib::Request& req, httplib::Response& res) {
    std::string id = req.get_header_value("X-Correlation-Id");
    bool sane = !id.empty() && id.size() <= 128;
    for (unsigned char c : id) sane = sane && c > 0x20 && c < 0x7f;
    if (!sane) id = new_correlation_id();
    res.set_header("X-Correlation-Id", id);
    return id;
}

std::string submitter(const httplib::Request& req) {
    if (std::string why = credential_header_problem(req, false); !why.empty()) throw Error(Code::InvalidRequest, why);
    // The parsed credential, never the header's text: "bearer  KEY" is the
    // client that sent "Bearer KEY".
    const std::string id = credential_identity(req.get_header_value("Authorization"));
    return id.empty() ? "addr " + req.remote_addr : "cred " + id;
}

std::optional<service::JobEvent> wait_event(service::Service& svc, service::Job& job,
                                            const std::vector<std::shared_ptr<service::Job>>& request) {
    for (;;) {
        if (current_client_gone()) {
            for (const auto& j : request)
                if (!j->terminated()) svc.cancel(j->request.job_id, service::CancelReason::Disconnect, &j->request.owner);
            return std::nullopt;
        }
        if (auto ev = job.pop(std::chrono::milliseconds(200))) return ev;
    }
}

const char* rejection_outcome(const std::exception& e) {
    if (dynamic_cast<const ModelStillLoading*>(&e)) return "rejected_loading";
    if (auto* ee = dynamic_cast<const Error*>(&e)) {
        if (ee->code() == Code::QueueFull) return "rejected_queue_full";
        if (ee->code() == Code::ShuttingDown) return "rejected_shutdown";
        if (ee->code() == Code::InvalidRequest || ee->code() == Code::NotFound) return "rejected_invalid";
        if (ee->code() == Code::Cancelled) return "cancelled";  // the client left during its chat template
    }
    return "error";
}

int http_status_for(Code code) {
    switch (code) {
    case Code::InvalidRequest: return 400;
    case Code::NotFound: return 404;
    case Code::QueueFull: case Code::ShuttingDown: case Code::EngineCrashed: return 503;
    case Code::InferenceTimeout: return 504;
    case Code::Cancelled: return 499;
    case Code::ContextFull: return 400;
    default: return 500;
    }
}

void set_retry_after(httplib::Response& res, const service::JobEvent& ev) {
    if (ev.retry_after_ms) res.set_header("Retry-After", std::to_string((*ev.retry_after_ms + 999) / 1000));
}

static const char* openai_type(int status) {
    if (status >= 400 && status < 500) return "invalid_request_error";
    if (status == 503) return "server_overloaded";
    return "server_error";
}

nlohmann::json error_body(const std::string& code, const std::string& message, const std::string& correlation,
                          const nlohmann::json& details, const std::string& param) {
    nlohmann::json e = {{"code", code}, {"message", message}, {"details", details}, {"correlation_id", correlation}};
    e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
    return {{"error", e}};
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
    res.status = status;
    res.set_content(dump(body), "application/json");
}

nlohmann::json typed_error_body(int status, const std::string& code, const std::string& message,
                                const std::string& correlation, const nlohmann::json& details, const std::string& param) {
    nlohmann::json body = error_body(code, message, correlation, details, param);
    body["error"]["type"] = openai_type(status);
    return body;
}

void send_error(httplib::Response& res, int status, const std::string& code, const std::string& message,
                const std::string& correlation, const nlohmann::json& details, const std::string& param) {
    send_json(res, status, typed_error_body(status, code, message, correlation, details, param));
}

void send_exception(httplib::Response& res, const std::exception& e, const std::string& correlation) {
    if (auto* re = dynamic_cast<const service::RequestError*>(&e)) {
        nlohmann::json details = nlohmann::json::object();
        if (!re->field().empty()) details["field"] = re->field();
        send_error(res, 400, code_name(re->code()), re->what(), correlation, details, re->field());
        return;
    }
    if (dynamic_cast<const service::ChatTemplateUnusable*>(&e)) {
        send_error(res, 400, "CHAT_TEMPLATE_UNUSABLE", e.what(), correlation, {{"chat_template", "rejected"}});
        return;
    }
    if (auto* qf = dynamic_cast<const service::QueueFullError*>(&e)) {
        res.set_header("Retry-After", std::to_string((qf->retry_after_ms() + 999) / 1000));
        send_error(res, 503, code_name(qf->code()), qf->what(), correlation,
                   {{"retry_after_ms", qf->retry_after_ms()}, {"retriable", true}});
        return;
    }
    if (auto* an = dynamic_cast<const service::AdapterNotFound*>(&e)) {
        send_error(res, 404, "ADAPTER_NOT_FOUND", an->what(), correlation,
                   {{"adapter", service::sanitize_utf8(an->adapter().substr(0, 200))}});
        return;
    }
    if (auto* ml = dynamic_cast<const ModelStillLoading*>(&e)) {
        res.set_header("Retry-After", "5");
        send_error(res, 503, "MODEL_LOADING", ml->what(), correlation, {{"model", ml->model_name}});
        return;
    }
    if (auto* ee = dynamic_cast<const Error*>(&e)) {
        int status = http_status_for(ee->code());
        if (status == 503) res.set_header("Retry-After", "5");
        send_error(res, status, code_name(ee->code()), ee->what(), correlation);
        return;
    }
    send_error(res, 500, "INTERNAL", std::string("internal error: ") + e.what(), correlation);
}

bool accepting(Server::Impl& s, httplib::Response& res, const std::string& correlation) {
    State st = s.state.load();
    if (st == State::Loading) {
        res.set_header("Retry-After", "5");
        send_error(res, 503, "MODEL_LOADING", "the model is still loading; retry shortly", correlation,
                   {{"load_progress", s.load_progress.load()}});
        return false;
    }
    if (st == State::Stopping) {
        send_error(res, 503, "SHUTTING_DOWN", "the server is shutting down; not accepting new jobs", correlation);
        return false;
    }
    return true;
}

std::shared_ptr<service::Service> require_ready(Server::Impl& s, httplib::Response& res, const std::string& correlation) {
    if (!accepting(s, res, correlation)) return nullptr;
    const auto pool = s.get_pool();
    if (!pool) return s.get_service();
    try {
        return pool->acquire("");
    } catch (const std::exception& e) {
        send_exception(res, e, correlation);
        return nullptr;
    }
}

void split_model_adapter(Server::Impl& s, std::string& model, std::string& adapter) {
    const size_t colon = model.rfind(':');
    if (colon == std::string::npos || s.get_pool()) return;
    const auto svc = s.get_service();
    if (!svc || svc->options().adapters.empty()) return;
    const NodeInfo ni = s.get_info();
    const std::string base = model.substr(0, colon), name = model.substr(colon + 1);
    if (base != ni.model && std::find(ni.model_aliases.begin(), ni.model_aliases.end(), base) == ni.model_aliases.end())
        return;
    if (!adapter.empty() && adapter != name)
        throw service::RequestError("lora", fmt::format("'lora' names the adapter '{}' but 'model' names '{}'",
                                                        service::sanitize_utf8(adapter.substr(0, 64)),
                                                        service::sanitize_utf8(name.substr(0, 64))));
    model = base;
    adapter = name;
}

std::shared_ptr<service::Service> service_for(Server::Impl& s, const std::string& model) {
    if (const auto pool = s.get_pool()) return pool->acquire(model);
    if (std::string why = unknown_model(s.get_info(), model); !why.empty()) throw Error(Code::NotFound, why);
    return s.get_service();
}

std::string sse_event(const std::string& name, const nlohmann::json& data) {
    return "event: " + name + "\ndata: " + dump(data) + "\n\n";
}

std::string sse_data(const nlohmann::json& data) { return "data: " + dump(data) + "\n\n"; }

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace eh::http
