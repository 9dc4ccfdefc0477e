#include "responses_api.hpp"

#include <fmt/format.h>

#include "eh/service/utf8.hpp"
#include "impl.hpp"
#include "parse/responses_request.hpp"
#include "responses_output.hpp"
#include "responses_store.hpp"
#include "stream.hpp"

namespace eh::http {

using service::JobEvent;

namespace {

// One response in flight: its output, what the response object echoes, and
// where it is stored when it ends.
struct Run {
    std::string id, model;
    int64_t created_at = 0;
    nlohmann::json echo;
    ResponsesOutput output;
    std::shared_ptr<service::Service> svc;  // its codec counts the reasoning tokens
    std::shared_ptr<ResponseStore> store;   // null: store false
    std::string scope;
    std::vector<service::ChatMessage> conversation;  // up to this response's input, without instructions
    uint32_t input_tokens = 0, cached_tokens = 0;
    bool created = false;  // response.created was sent (streaming)
    std::shared_ptr<service::Job> job;
    std::string cid;  // the request's correlation id

    Run(service::ToolFormat format, const service::ChatParseOptions& po, const std::string& prefill)
        : output(format, po, prefill) {}

    nlohmann::json response(const std::string& status, nlohmann::json usage = nullptr, nlohmann::json error = nullptr,
                            nlohmann::json incomplete = nullptr) const {
        nlohmann::json r = echo;
        r.update({{"id", id}, {"object", "response"}, {"created_at", created_at}, {"status", status}, {"error", error},
                  {"incomplete_details", incomplete}, {"model", model}, {"output", output.output()}, {"usage", usage}});
        return r;
    }

    // The output ended: the closing events go to `events`; returns the
    // final response object, stored when the request asked for that.
    nlohmann::json end(const JobEvent& ev, std::string& events) {
        const bool incomplete = ev.stop_reason == "length";
        events = output.finish_events(incomplete);
        const std::string reasoning = output.reasoning();
        const size_t reasoning_tokens = reasoning.empty() ? 0 : svc->codec().encode(reasoning, false, false).size();
        nlohmann::json usage = {{"input_tokens", input_tokens},
                                {"input_tokens_details", {{"cached_tokens", cached_tokens}}},
                                {"output_tokens", ev.tokens_out},
                                {"output_tokens_details", {{"reasoning_tokens", std::min<size_t>(reasoning_tokens, ev.tokens_out)}}},
                                {"total_tokens", input_tokens + ev.tokens_out}};
        nlohmann::json r = incomplete ? response("incomplete", usage, nullptr, {{"reason", "max_output_tokens"}})
                                      : response("completed", usage);
        if (store) {
            conversation.push_back(output.message());
            store->put(id, StoredResponse{scope, dump(r), std::move(conversation)});
        }
        return r;
    }

    // Streaming: response.created and response.in_progress, once.
    std::string begin() {
        if (created) return {};
        created = true;
        const nlohmann::json begun = response("in_progress");
        std::string out = output.event("response.created", {{"response", begun}});  // (numbered before the next)
        return out + output.event("response.in_progress", {{"response", begun}});
    }

    nlohmann::json failed(const JobEvent& ev) const {
        return response("failed", nullptr, {{"code", code_name(ev.code)}, {"message", ev.message}});
    }

    // Streaming: the events one of the job's events makes.
    std::string stream_events(const JobEvent& ev) {
        switch (ev.kind) {
        case JobEvent::Kind::Started:
            cached_tokens = ev.cached_tokens;
            return begin();
        case JobEvent::Kind::Token:
            return output.events(ev.text);
        case JobEvent::Kind::End: {
            std::string out;
            nlohmann::json r = end(ev, out);
            const std::string type = r["status"] == "incomplete" ? "response.incomplete" : "response.completed";
            return out + output.event(type, {{"response", std::move(r)}});
        }
        case JobEvent::Kind::Error: {
            // (A job can fail before it starts: the stream still opens with
            // response.created, as clients expect.)
            std::string out = begin();  // first: it takes the first sequence numbers
            return out + output.event("response.failed", {{"response", failed(ev)}});
        }
        }
        return {};
    }

    // Not streaming: collect the output. A client that goes away cancels the
    // job at once (wait_event).
    void send(httplib::Response& res) {
        for (;;) {
            auto ev = wait_event(*svc, *job, {job});
            if (!ev) return;
            if (ev->kind == JobEvent::Kind::Started) {
                cached_tokens = ev->cached_tokens;
            } else if (ev->kind == JobEvent::Kind::Token) {
                output.add(ev->text);
            } else if (ev->kind == JobEvent::Kind::Error) {
                set_retry_after(res, *ev);
                const int status = http_status_for(ev->code);
                send_json(res, status, typed_error_body(status, code_name(ev->code), ev->message, cid,
                                                        {{"retriable", ev->retriable}}));
                return;
            } else if (ev->kind == JobEvent::Kind::End) {
                std::string ignored;
                send_json(res, 200, end(*ev, ignored));
                return;
            }
        }
    }
};

std::string not_found(const std::string& id) {
    return fmt::format("Response with id '{}' not found", service::sanitize_utf8(id.substr(0, kMaxResponseIdBytes)));
}

// The conversation this request continues (previous_response_id's, then
// its input), returned; and the messages to render into r: the
// instructions as a system message, then that conversation. Throws
// RequestError when the previous response is not stored.
std::vector<service::ChatMessage> compose(ResponsesRequest& r, ResponseStore& store, const std::string& scope,
                                          size_t max_count, size_t max_bytes) {
    std::vector<service::ChatMessage> conversation;
    if (!r.previous_response_id.empty()) {
        auto prev = store.get(r.previous_response_id, scope);
        if (!prev)
            throw service::RequestError(
                "previous_response_id",
                fmt::format("Previous response with id '{}' not found: it was stored with 'store': false, "
                            "deleted, evicted (the server keeps the {} most recently used responses, {} bytes "
                            "in all), made with another API key, or never existed",
                            r.previous_response_id, max_count, max_bytes));
        conversation = prev->conversation;
    }
    conversation.insert(conversation.end(), r.input.begin(), r.input.end());
    if (!r.instructions.empty()) {
        service::ChatMessage m;
        m.role = "system";
        m.content = r.instructions;
        r.messages.push_back(std::move(m));
    }
    r.messages.insert(r.messages.end(), conversation.begin(), conversation.end());
    return conversation;
}

// POST /v1/responses up to its submitted job; nullptr when it was refused
// (the response is written then).
std::shared_ptr<Run> submit(Server::Impl& s, const std::shared_ptr<ResponseStore>& store, size_t max_count,
                            size_t max_bytes, const httplib::Request& req, httplib::Response& res, bool& stream) {
    const std::string cid = correlation_id(req, res);
    if (!accepting(s, res, cid)) {
        s.metrics->request("responses", s.state.load() == State::Stopping ? "rejected_shutdown" : "rejected_loading");
        return nullptr;
    }
    ResponsesRequest r;
    std::shared_ptr<service::Service> svc;
    std::vector<service::ChatMessage> conversation;
    std::shared_ptr<service::Job> job;
    const std::string scope = cache_scope_of(s, req);
    try {
        r = parse_responses_request(req.body, s.options.limits);
        std::string base = r.model;
        split_model_adapter(s, base, r.gen.adapter);
        svc = service_for(s, base);
        conversation = compose(r, *store, scope, max_count, max_bytes);
        try {
            render_chat_cancellable(s, *svc, r);
        } catch (const service::RequestError& e) {
            // The rendered conversation's rules name `messages`; this
            // API's clients sent `input` (and previous_response_id).
            if (e.field() != "messages") throw;
            throw service::RequestError("input", e.what());
        }
        r.gen.correlation_id = cid;
        r.gen.cache_scope = scope;
        job = svc->submit(r.gen);
    } catch (const std::exception& e) {
        s.metrics->request("responses", rejection_outcome(e));
        send_exception(res, e, cid);
        return nullptr;
    }
    access::note_jobs({job});
    res.set_header("X-Job-Id", job->request.job_id);

    service::ChatParseOptions po{r.tools.enabled(), r.tools.parallel, {}};
    for (const auto& t : r.tools.tools) po.names.push_back(t.name);
    auto run = std::make_shared<Run>(svc->codec().tool_format(), po, r.tools.prefill);
    run->id = job->request.job_id;
    run->model = r.model.empty() ? s.get_info().model : r.model;
    run->created_at = unix_now();
    run->echo = std::move(r.echo);
    run->svc = svc;
    if (r.store) run->store = store;
    run->scope = scope;
    run->conversation = std::move(conversation);
    run->input_tokens = uint32_t(job->prompt_tokens.size());
    run->job = job;
    run->cid = cid;
    stream = r.stream;
    return run;
}

}  // namespace

void install_responses(Server::Impl& s) {
    const size_t max_count = s.options.responses_max, max_bytes = s.options.responses_max_bytes;
    auto store = std::make_shared<ResponseStore>(max_count, max_bytes);
    Server::Impl* self = &s;

    s.http.Post("/v1/responses", [self, store, max_count, max_bytes](const httplib::Request& req, httplib::Response& res) {
        bool stream = false;
        const auto run = submit(*self, store, max_count, max_bytes, req, res, stream);
        if (!run) return;
        if (!stream) return run->send(res);
        stream_job(*self, res, run->svc, run->job, [run](const JobEvent& ev) { return run->stream_events(ev); });
    });

    // A stored response, as POST returned it (the final one when streamed).
    s.http.Get(R"(/v1/responses/([^/]+))", [self, store](const httplib::Request& req, httplib::Response& res) {
        const std::string cid = correlation_id(req, res);
        const std::string id = req.matches[1];
        // (OpenAI replays a background response's events here; responses run
        // while their request is open, so there are none to replay.)
        if (req.has_param("stream") && req.get_param_value("stream") != "false")
            return send_error(res, 400, "INVALID_REQUEST", "'stream' is not supported here: GET returns the stored response",
                              cid, {{"field", "stream"}}, "stream");
        auto r = store->get(id, cache_scope_of(*self, req));
        if (!r) return send_error(res, 404, "NOT_FOUND", not_found(id), cid);
        res.status = 200;
        res.set_content(r->response_json, "application/json");
    });

    s.http.Delete(R"(/v1/responses/([^/]+))", [self, store](const httplib::Request& req, httplib::Response& res) {
        const std::string cid = correlation_id(req, res);
        const std::string id = req.matches[1];
        if (!store->erase(id, cache_scope_of(*self, req))) return send_error(res, 404, "NOT_FOUND", not_found(id), cid);
        send_json(res, 200, {{"id", id}, {"object", "response"}, {"deleted", true}});
    });
}

}  // namespace eh::http
