// The native API: /execute (SSE), /cancel, /tokenize, /detokenize.
#include <algorithm>
#include <chrono>

#include <simdjson.h>

#include "eh/service/event_log.hpp"
#include "eh/service/utf8.hpp"
#include "impl.hpp"
#include "parse/native_request.hpp"
#include "stream.hpp"

namespace eh::http {

using service::JobEvent;

namespace {

// A native request's `model` ("" when absent, not a string, or the body is
// not JSON: its parser reports that). With many models it picks one; a
// one-model server ignores it.
std::string native_model(const std::string& body) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    std::string_view model;
    if (parser.parse(body).get(doc) == simdjson::SUCCESS && doc.is_object() &&
        doc["model"].get(model) == simdjson::SUCCESS)
        return std::string(model);
    return "";
}

// The service a native request runs on. Throws as service_for().
std::shared_ptr<service::Service> native_service(Server::Impl& s, const std::string& body) {
    const auto pool = s.get_pool();
    if (!pool) return s.get_service();
    return pool->acquire(native_model(body));
}

struct PumpState {
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
    bool finished = false;
};

constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr auto kHeartbeat = std::chrono::milliseconds(500);

nlohmann::json logprobs_json(const std::vector<service::TokenLogprob>& lps) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& lp : lps) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& t : lp.top) top.push_back({{"id", t.id}, {"text", t.text}, {"logprob", t.logprob}});
        arr.push_back({{"id", lp.id}, {"text", lp.text}, {"logprob", lp.logprob}, {"top", top}});
    }
    return arr;
}

// Collects a native job's SSE frames and writes its artifact record (see
// artifacts.hpp) at its terminal event, or when the stream closes without
// one (the client went away): exactly once.
class ArtifactRecorder {
public:
    ArtifactRecorder(Server::Impl& s, std::shared_ptr<service::Job> job, const std::string& body, std::string cid)
        : store_(*s.artifacts), job_(std::move(job)), cid_(std::move(cid)) {
        const NodeInfo ni = s.get_info();
        record_ = {{"record_version", 1},
                   {"job_id", job_->request.job_id},
                   {"correlation_id", cid_},
                   {"submitted_at", service::now_rfc3339()},
                   {"request", nlohmann::json::parse(body, nullptr, false)},
                   {"max_tokens", job_->max_tokens},
                   {"ctx", job_->n_ctx},
                   {"seed", job_->seed},
                   {"engine", ni.engine},
                   {"engine_version", ni.plugin_version},
                   {"plugin", ni.plugin_name},
                   {"sampler_profile_version", "1"},
                   {"model", ni.model},
                   {"model_ref", s.options.model_ref}};
        digest_ = s.model_digest.get();
    }
    // The frame as written, kept for the transcript.
    std::string frame(const JobEvent& ev, std::string bytes) {
        std::lock_guard lock(mu_);
        if (transcript_.size() + bytes.size() <= store_.max_transcript_bytes()) transcript_ += bytes;
        else truncated_ = true;
        if (ev.kind == JobEvent::Kind::End) {
            record_["status"] = "completed";
            record_["tokens_out"] = ev.tokens_out;
            record_["decode_time_ms"] = ev.decode_time_ms;
            record_["stop_reason"] = ev.stop_reason;
            write_locked();
        } else if (ev.kind == JobEvent::Kind::Error) {
            fail_locked(code_name(ev.code), ev.message, ev.retriable, ev.retry_after_ms);
        }
        return bytes;
    }
    void close() {
        std::lock_guard lock(mu_);
        if (!written_) fail_locked("CANCELLED", "the client closed the stream before the job ended", false, std::nullopt);
    }

private:
    void fail_locked(const std::string& code, const std::string& message, bool retriable,
                     std::optional<uint32_t> retry_after_ms) {
        record_["status"] = "failed";
        record_["code"] = code;
        record_["message"] = message;
        record_["retriable"] = retriable;
        record_["retry_after_ms"] = retry_after_ms ? nlohmann::json(*retry_after_ms) : nlohmann::json(nullptr);
        write_locked();
    }
    void write_locked() {
        if (written_) return;
        written_ = true;
        record_["finished_at"] = service::now_rfc3339();
        const std::string sha = digest_ ? digest_->get() : "";
        record_["model_sha256"] = sha.empty() ? nlohmann::json(nullptr) : nlohmann::json(sha);
        record_["transcript"] = transcript_;
        record_["transcript_truncated"] = truncated_;
        store_.write(job_->request.job_id, record_);
    }

    ArtifactStore& store_;
    std::shared_ptr<service::Job> job_;
    std::string cid_;
    const FileDigest* digest_ = nullptr;
    std::mutex mu_;
    nlohmann::json record_;
    std::string transcript_;
    bool truncated_ = false, written_ = false;
};

}  // namespace

void stream_job(Server::Impl& s, httplib::Response& res, std::shared_ptr<service::Service> svc,
                std::shared_ptr<service::Job> job, std::function<std::string(const JobEvent&)> render,
                std::string trailer, bool trailer_after_error, std::function<void()> on_close) {
    stream_jobs(s, res, std::move(svc), {std::move(job)},
                [render = std::move(render)](size_t, const JobEvent& ev) { return render(ev); }, std::move(trailer),
                trailer_after_error, std::move(on_close));
}

void stream_jobs(Server::Impl& s, httplib::Response& res, std::shared_ptr<service::Service> svc,
                 std::vector<std::shared_ptr<service::Job>> jobs,
                 std::function<std::string(size_t, const JobEvent&)> render, std::string trailer,
                 bool trailer_after_error, std::function<void()> on_close) {
    access::note_jobs(jobs);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    auto guard = std::make_shared<StreamGuard>(s.open_streams);
    auto st = std::make_shared<PumpState>();
    auto ended = std::make_shared<std::vector<bool>>(jobs.size(), false);
    auto cancel_all = [svc, jobs](service::CancelReason why) {
        for (const auto& j : jobs) {
            if (j->terminated()) continue;
            j->cancel(why);
            svc->cancel(j->request.job_id, why, &j->request.owner);
        }
    };
    res.set_chunked_content_provider(
        "text/event-stream",
        [jobs, st, ended, render, trailer, trailer_after_error, cancel_all](size_t, httplib::DataSink& sink) {
            if (st->finished) {
                sink.done();
                return true;
            }
            // One poll interval shared by the jobs still running.
            size_t live = 0;
            for (bool e : *ended) live += !e;
            const auto wait = std::max(std::chrono::milliseconds(1), kPoll / int64_t(std::max<size_t>(live, 1)));
            std::string out;
            bool error = false;
            for (size_t i = 0; i < jobs.size() && !error; ++i) {
                if ((*ended)[i]) continue;
                while (auto ev = jobs[i]->pop(out.empty() ? wait : std::chrono::milliseconds(0))) {
                    out += render(i, *ev);
                    if (ev->kind == JobEvent::Kind::End) (*ended)[i] = true;
                    if (ev->kind == JobEvent::Kind::Error) error = true;
                    if ((*ended)[i] || error) break;
                }
            }
            const bool all_ended = std::all_of(ended->begin(), ended->end(), [](bool e) { return e; });
            if (all_ended || (error && trailer_after_error)) out += trailer;
            auto now = std::chrono::steady_clock::now();
            if (out.empty() && now - st->last_write >= kHeartbeat) out = ": keep-alive\n\n";
            if (!out.empty()) {
                if (!sink.write(out.data(), out.size())) {
                    cancel_all(service::CancelReason::Disconnect);
                    return false;
                }
                st->last_write = now;
            }
            if (all_ended || error) {
                if (error) cancel_all(service::CancelReason::Client);
                st->finished = true;
                sink.done();
            }
            return true;
        },
        [guard, cancel_all, on_close](bool) {
            cancel_all(service::CancelReason::Disconnect);
            if (on_close) on_close();
        });
}

void Server::Impl::install_native() {
    http.Post("/execute", [this](const httplib::Request& req, httplib::Response& res) {
        std::string cid = correlation_id(req, res);
        if (!accepting(*this, res, cid)) {
            metrics->request("execute", state.load() == State::Stopping ? "rejected_shutdown" : "rejected_loading");
            return;
        }
        std::shared_ptr<service::Service> svc;
        std::shared_ptr<service::Job> job;
        std::string model = get_info().model;
        try {
            service::GenerationRequest r = parse_execute_request(req.body, options.limits);
            std::string named = native_model(req.body);
            split_model_adapter(*this, named, r.adapter);
            svc = native_service(*this, req.body);
            if (const auto pool = get_pool()) model = pool->find(native_model(req.body))->name;
            r.correlation_id = cid;
            r.owner = submitter(req);
            r.cache_scope = cache_scope_of(*this, req);
            job = svc->submit(std::move(r));
        } catch (const std::exception& e) {
            metrics->request("execute", rejection_outcome(e));
            send_exception(res, e, cid);
            return;
        }
        // Every frame carries the correlation id (the worker contract).
        auto render = [job, cid, model](const JobEvent& ev) -> std::string {
            switch (ev.kind) {
            case JobEvent::Kind::Started:
                // tokens_used / tokens_remaining: the context at the start
                // (the prompt), and what is left of it for the output.
                return sse_event("started", {{"job_id", job->request.job_id}, {"model", model},
                                             {"started_at", ev.started_at}, {"seed", ev.seed},
                                             {"prompt_tokens", ev.prompt_tokens}, {"cached_tokens", ev.cached_tokens},
                                             {"max_tokens", job->max_tokens},
                                             {"tokens_used", ev.prompt_tokens},
                                             {"tokens_remaining", job->n_ctx > ev.prompt_tokens ? job->n_ctx - ev.prompt_tokens : 0},
                                             {"correlation_id", cid}});
            case JobEvent::Kind::Token: {
                nlohmann::json j = {{"t", ev.text}, {"i", ev.index}};
                if (job->request.top_logprobs >= 0) j["logprobs"] = logprobs_json(ev.logprobs);
                j["correlation_id"] = cid;
                return sse_event("token", j);
            }
            case JobEvent::Kind::End:
                return sse_event("end", {{"tokens_out", ev.tokens_out}, {"decode_time_ms", ev.decode_time_ms},
                                         {"time_to_first_token_ms", ev.time_to_first_token_ms},
                                         {"stop_reason", ev.stop_reason}, {"correlation_id", cid}});
            case JobEvent::Kind::Error: {
                nlohmann::json j = {{"code", code_name(ev.code)}, {"message", ev.message}, {"retriable", ev.retriable}};
                if (ev.retry_after_ms) j["retry_after_ms"] = *ev.retry_after_ms;
                j["correlation_id"] = cid;
                return sse_event("error", j);
            }
            }
            return {};
        };
        if (!artifacts) {
            stream_job(*this, res, svc, job, render);
            return;
        }
        auto rec = std::make_shared<ArtifactRecorder>(*this, job, req.body, cid);
        stream_job(
            *this, res, svc, job, [rec, render](const JobEvent& ev) { return rec->frame(ev, render(ev)); }, "", false,
            [rec] { rec->close(); });
    });

    http.Post("/cancel", [this](const httplib::Request& req, httplib::Response& res) {
        std::string cid = correlation_id(req, res);
        auto svc = get_service();
        try {
            std::string id = parse_cancel_request(req.body, options.limits);
            const std::string owner = submitter(req);
            std::string status = svc ? svc->cancel(id, service::CancelReason::Client, &owner) : "unknown";
            if (const auto pool = get_pool())  // the job may run on any model's service
                for (const auto& m : pool->services())
                    if (status == "unknown") status = m->cancel(id, service::CancelReason::Client, &owner);
            send_json(res, 202, {{"job_id", id}, {"status", status}});
        } catch (const std::exception& e) {
            send_exception(res, e, cid);
        }
    });

    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
        std::string cid = correlation_id(req, res);
        if (!accepting(*this, res, cid)) return;
        try {
            auto r = parse_tokenize_request(req.body, options.limits);
            auto svc = native_service(*this, req.body);
            auto tokens = svc->codec().encode(r.text, r.add_special, r.parse_special);
            send_json(res, 200, {{"tokens", tokens}, {"count", tokens.size()}});
        } catch (const std::exception& e) {
            send_exception(res, e, cid);
        }
    });

    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
        std::string cid = correlation_id(req, res);
        if (!accepting(*this, res, cid)) return;
        try {
            auto svc = native_service(*this, req.body);
            auto tokens = parse_detokenize_request(req.body, svc->codec().vocab_size(), options.limits);
            send_json(res, 200, {{"text", service::sanitize_utf8(svc->codec().decode(tokens))}});
        } catch (const std::exception& e) {
            send_exception(res, e, cid);
        }
    });
}

}  // namespace eh::http
