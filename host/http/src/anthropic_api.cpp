#include "anthropic_api.hpp"

#include "anthropic_output.hpp"

#include "impl.hpp"
#include "parse/anthropic_request.hpp"
#include "stream.hpp"

namespace eh::http {

using service::JobEvent;

const char* anthropic_error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    case 499: return "api_error";  // a job cancelled by /cancel or shutdown: not the request's fault
    default: return status >= 400 && status < 500 ? "invalid_request_error" : "api_error";
    }
}

nlohmann::json anthropic_error_body(int status, const std::string& message) {
    return {{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

void send_anthropic_error(httplib::Response& res, int status, const std::string& message) {
    send_json(res, status, anthropic_error_body(status, message));
}

namespace {

// The shared helpers answer in the server's own envelope; Anthropic
// clients get the same status and message in theirs.
void to_anthropic(httplib::Response& res) {
    auto j = nlohmann::json::parse(res.body, nullptr, false);
    std::string message = "HTTP " + std::to_string(res.status);
    if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
        j["error"]["message"].is_string())
        message = j["error"]["message"].get<std::string>();
    send_anthropic_error(res, res.status, message);
}

nlohmann::json stop_sequence(const JobEvent& end) {
    return end.stop_reason == "stop" ? nlohmann::json(end.stop_sequence) : nlohmann::json(nullptr);
}

nlohmann::json stream_error(const JobEvent& ev) {
    return anthropic_error_body(ev.code == Code::Cancelled ? 499 : http_status_for(ev.code), ev.message);
}

}  // namespace

void Server::Impl::install_anthropic() {
    // Parses, renders and checks the prompt; nullopt after answering an error.
    auto prepare = [this](const httplib::Request& req, httplib::Response& res, const std::string& cid, bool count_only,
                          std::shared_ptr<service::Service>& svc) -> std::optional<AnthropicRequest> {
        if (!accepting(*this, res, cid)) {
            if (!count_only)
                metrics->request("messages", state.load() == State::Stopping ? "rejected_shutdown" : "rejected_loading");
            to_anthropic(res);
            return std::nullopt;
        }
        try {
            auto r = parse_anthropic_request(req.body, options.limits, count_only);
            std::string base = r.model;
            split_model_adapter(*this, base, r.gen.adapter);
            svc = service_for(*this, base);
            render_chat_cancellable(*this, *svc, r);
            r.gen.correlation_id = cid;
            return r;
        } catch (const std::exception& e) {
            if (!count_only) metrics->request("messages", rejection_outcome(e));
            send_exception(res, e, cid);
            to_anthropic(res);
            return std::nullopt;
        }
    };

    http.Post("/v1/messages/count_tokens", [this, prepare](const httplib::Request& req, httplib::Response& res) {
        std::string cid = correlation_id(req, res);
        std::shared_ptr<service::Service> svc;
        auto r = prepare(req, res, cid, true, svc);
        if (!r) return;
        try {
            send_json(res, 200, {{"input_tokens", svc->prompt_tokens(r->gen).size()}});  // images counted as served
        } catch (const std::exception& e) {
            send_exception(res, e, cid);
            to_anthropic(res);
        }
    });

    http.Post("/v1/messages", [this, prepare](const httplib::Request& req, httplib::Response& res) {
        std::string cid = correlation_id(req, res);
        std::shared_ptr<service::Service> svc;
        auto r = prepare(req, res, cid, false, svc);
        if (!r) return;
        std::shared_ptr<service::Job> job;
        try {
            r->gen.cache_scope = cache_scope_of(*this, req);
            job = svc->submit(r->gen);
        } catch (const std::exception& e) {
            metrics->request("messages", rejection_outcome(e));
            send_exception(res, e, cid);
            to_anthropic(res);
            return;
        }
        access::note_jobs({job});
        const std::string model = r->model;
        const std::string id = job->request.job_id;
        const uint32_t input_tokens = uint32_t(job->prompt_tokens.size());
        res.set_header("X-Job-Id", id);
        service::ChatParseOptions po{r->tools.enabled(), r->tools.parallel, {}};
        for (const auto& t : r->tools.tools) po.names.push_back(t.name);
        auto output = std::make_shared<AnthropicOutput>(svc->codec().tool_format(), po, r->tools.prefill, r->thinking);

        if (r->stream) {
            auto render = [=](const JobEvent& ev) -> std::string {
                switch (ev.kind) {
                case JobEvent::Kind::Started:
                    return sse_event("message_start",
                                     {{"type", "message_start"},
                                      {"message", {{"id", id}, {"type", "message"}, {"role", "assistant"},
                                                   {"content", nlohmann::json::array()}, {"model", model},
                                                   {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                                                   {"usage", {{"input_tokens", input_tokens}, {"output_tokens", 0}}}}}});
                case JobEvent::Kind::Token:
                    return output->events(ev.text);
                case JobEvent::Kind::End:
                    return output->finish_events() +
                           sse_event("message_delta", {{"type", "message_delta"},
                                                       {"delta", {{"stop_reason", output->stop_reason(ev.stop_reason)},
                                                                  {"stop_sequence", stop_sequence(ev)}}},
                                                       {"usage", {{"output_tokens", ev.tokens_out}}}}) +
                           sse_event("message_stop", {{"type", "message_stop"}});
                case JobEvent::Kind::Error:
                    return sse_event("error", stream_error(ev));
                }
                return {};
            };
            stream_job(*this, res, svc, job, render);
            return;
        }

        // Not streaming: collect the output. A client that goes away cancels
        // the job at once (wait_event).
        for (;;) {
            auto ev = wait_event(*svc, *job, {job});
            if (!ev) return;
            if (ev->kind == JobEvent::Kind::Token) {
                output->add(ev->text);
            } else if (ev->kind == JobEvent::Kind::Error) {
                set_retry_after(res, *ev);
                send_json(res, ev->code == Code::Cancelled ? 499 : http_status_for(ev->code), stream_error(*ev));
                return;
            } else if (ev->kind == JobEvent::Kind::End) {
                output->finish();
                send_json(res, 200,
                          {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"content", output->content()},
                           {"model", model}, {"stop_reason", output->stop_reason(ev->stop_reason)},
                           {"stop_sequence", stop_sequence(*ev)},
                           {"usage", {{"input_tokens", input_tokens}, {"output_tokens", ev->tokens_out}}}});
                return;
            }
        }
    });
}

}  // namespace eh::http
