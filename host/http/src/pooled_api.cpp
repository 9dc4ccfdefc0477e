#include "pooled_api.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "eh/service/pooling.hpp"
#include "impl.hpp"
#include "parse/pooled_request.hpp"

namespace eh::http {

using service::JobEvent;

namespace {

// Every job's hidden state, in order; nullopt when the answer (an error, or
// nothing for a client that left) was already given.
std::optional<std::vector<std::vector<float>>> collect(service::Service& svc,
                                                       const std::vector<std::shared_ptr<service::Job>>& jobs,
                                                       httplib::Response& res, const std::string& cid) {
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < jobs.size(); ++i) {
        for (;;) {
            auto ev = wait_event(svc, *jobs[i], jobs);
            if (!ev) return std::nullopt;  // the client left; its jobs are cancelled
            if (ev->kind == JobEvent::Kind::Error) {
                for (size_t k = i + 1; k < jobs.size(); ++k)
                    svc.cancel(jobs[k]->request.job_id, service::CancelReason::Client, &jobs[k]->request.owner);
                set_retry_after(res, *ev);
                nlohmann::json body = error_body(code_name(ev->code), ev->message, cid, {{"retriable", ev->retriable}});
                body["error"]["type"] = ev->code == Code::Cancelled ? "cancelled" : "server_error";
                send_json(res, http_status_for(ev->code), body);
                return std::nullopt;
            }
            if (ev->kind == JobEvent::Kind::End) {
                out.push_back(std::move(ev->hidden));
                break;
            }
        }
    }
    return out;
}

}  // namespace

void install_pooled(Server::Impl& s) {
    auto handle = [&s](bool rerank, const httplib::Request& req, httplib::Response& res) {
        const char* endpoint = rerank ? "rerank" : "embeddings";
        const std::string cid = correlation_id(req, res);
        if (!accepting(s, res, cid)) {
            s.metrics->request(endpoint, s.state.load() == State::Stopping ? "rejected_shutdown" : "rejected_loading");
            return;
        }
        std::shared_ptr<service::Service> svc;
        std::vector<std::shared_ptr<service::Job>> jobs;
        EmbeddingsRequest er;
        RerankRequest rr;
        try {
            service::GenerationRequest meta;
            meta.job_id = fmt::format("{}-{}", rerank ? "rerank" : "embd", new_correlation_id());
            meta.correlation_id = cid;
            meta.cache_scope = cache_scope_of(s, req);
            meta.origin = endpoint;
            if (rerank) {
                rr = parse_rerank_request(req.body, s.options.limits);
                svc = service_for(s, rr.model);
                const std::string& tmpl = svc->pooling().rerank_template;
                std::vector<service::PooledInput> inputs;
                for (const auto& doc : rr.documents) {
                    service::PooledInput in;
                    in.text = service::render_rerank(tmpl, rr.query, doc, in.literal);
                    in.add_special = false;   // the template is the whole prompt
                    in.parse_special = true;  // its control tokens, never the query's or the document's
                    inputs.push_back(std::move(in));
                }
                jobs = svc->submit_pooled(meta, std::move(inputs), service::PoolingMode::Rerank, "documents");
            } else {
                er = parse_embeddings_request(req.body, s.options.limits);
                svc = service_for(s, er.model);
                jobs = svc->submit_pooled(meta, std::move(er.inputs), service::PoolingMode::Embedding, "input");
            }
            access::note_jobs(jobs);
        } catch (const std::exception& e) {
            s.metrics->request(endpoint, rejection_outcome(e));
            send_exception(res, e, cid);
            return;
        }
        auto states = collect(*svc, jobs, res, cid);
        if (!states) return;
        uint64_t prompt_tokens = 0;
        for (const auto& j : jobs) prompt_tokens += j->prompt_tokens.size();
        const nlohmann::json usage = {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}};
        const std::string model = (rerank ? rr.model : er.model).empty() ? s.get_info().model : (rerank ? rr.model : er.model);
        if (!rerank) {
            nlohmann::json data = nlohmann::json::array();
            for (size_t i = 0; i < states->size(); ++i) {
                const auto& h = (*states)[i];
                if (er.dimensions && *er.dimensions != h.size()) {
                    send_error(res, 400, "INVALID_REQUEST",
                               fmt::format("'dimensions' {} is not supported: this model's embeddings have {} "
                                           "dimensions (omit the field, or send {})",
                                           *er.dimensions, h.size(), h.size()),
                               cid, {}, "dimensions");
                    return;
                }
                const std::vector<float> v = service::l2_normalized(h);
                nlohmann::json item = {{"object", "embedding"}, {"index", i}};
                if (er.base64) item["embedding"] = service::base64_floats(v);
                else item["embedding"] = v;
                data.push_back(std::move(item));
            }
            send_json(res, 200, {{"object", "list"}, {"data", data}, {"model", model}, {"usage", usage}});
            return;
        }
        std::vector<std::pair<double, size_t>> scored;
        try {
            for (size_t i = 0; i < states->size(); ++i)
                scored.emplace_back(service::rerank_score(svc->pooling(), (*states)[i]), i);
        } catch (const std::exception& e) {
            send_exception(res, e, cid);
            return;
        }
        // Highest first; equal scores keep the documents' order.
        std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        if (rr.top_n && *rr.top_n < scored.size()) scored.resize(*rr.top_n);
        nlohmann::json results = nlohmann::json::array();
        for (const auto& [score, i] : scored) {
            nlohmann::json item = {{"index", i}, {"relevance_score", score}};
            if (rr.return_documents) item["document"] = {{"text", rr.documents[i]}};
            results.push_back(std::move(item));
        }
        send_json(res, 200, {{"id", jobs[0]->request.job_id.substr(0, jobs[0]->request.job_id.rfind('.'))},
                             {"object", "list"}, {"model", model}, {"results", results}, {"usage", usage}});
    };
    s.http.Post("/v1/embeddings", [handle](const httplib::Request& req, httplib::Response& res) { handle(false, req, res); });
    s.http.Post("/v1/rerank", [handle](const httplib::Request& req, httplib::Response& res) { handle(true, req, res); });
    s.http.Post("/rerank", [handle](const httplib::Request& req, httplib::Response& res) { handle(true, req, res); });
}

}  // namespace eh::http
