// The OpenAI-compatible API: /v1/models, /v1/completions and
// /v1/chat/completions, streaming (SSE `data:` frames ending with
// `data: [DONE]`) and not.
#include <fmt/format.h>

#include "eh/service/utf8.hpp"
#include "impl.hpp"
#include "openai_chat_output.hpp"
#include "parse/openai_request.hpp"
#include "stream.hpp"

namespace eh::http {

using service::JobEvent;

namespace {

const char* finish_reason(const std::string& stop_reason) {
    return stop_reason == "length" ? "length" : "stop";
}

nlohmann::json bytes_of(const std::string& s) {
    nlohmann::json b = nlohmann::json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
}

// Chat logprobs: {"content":[{token, logprob, bytes, top_logprobs}]}
nlohmann::json chat_logprobs(const std::vector<service::TokenLogprob>& lps) {
    nlohmann::json content = nlohmann::json::array();
    for (const auto& lp : lps) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& t : lp.top) top.push_back({{"token", t.text}, {"logprob", t.logprob}, {"bytes", bytes_of(t.bytes)}});
        content.push_back({{"token", lp.text}, {"logprob", lp.logprob}, {"bytes", bytes_of(lp.bytes)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
}

// Legacy completions logprobs: parallel arrays. text_offset counts code
// points of the output text (as OpenAI's and vLLM's Python strings do); a
// token that starts inside a character (byte fallback) gets that
// character's offset.
struct CompletionLogprobs {
    nlohmann::json tokens = nlohmann::json::array(), token_logprobs = nlohmann::json::array(),
                   top = nlohmann::json::array(), offsets = nlohmann::json::array();
    size_t offset = 0;      // code points of complete characters so far
    std::string partial;    // bytes of a character not complete yet
    void add(const std::vector<service::TokenLogprob>& lps) {
        for (const auto& lp : lps) {
            tokens.push_back(lp.text);
            token_logprobs.push_back(lp.logprob);
            nlohmann::json t = nlohmann::json::object();
            for (const auto& x : lp.top) t[x.text] = x.logprob;
            top.push_back(t);
            offsets.push_back(offset);
            partial += lp.bytes;
            const size_t done = service::complete_utf8_prefix(partial);
            offset += service::utf8_length(std::string_view(partial).substr(0, done));
            partial.erase(0, done);
        }
    }
    nlohmann::json json() const {
        return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
    }
};

nlohmann::json usage_json(uint32_t prompt, uint32_t completion, uint32_t cached) {
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

nlohmann::json stream_error(const JobEvent& ev, const std::string& cid) {
    nlohmann::json body = error_body(code_name(ev.code), ev.message, cid,
                                     {{"retriable", ev.retriable}});
    body["error"]["type"] = ev.code == Code::Cancelled ? "cancelled" : "server_error";
    return body;
}

}  // namespace

void Server::Impl::install_openai() {
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
        correlation_id(req, res);
        nlohmann::json data = nlohmann::json::array();
        if (const auto pool = get_pool()) {
            // Every model served, loaded or not; its aliases after it.
            const nlohmann::json st = pool->status();
            for (size_t i = 0; i < pool->models().size(); ++i) {
                const PoolModelSpec& m = pool->models()[i];
                nlohmann::json entry = {{"id", m.name}, {"object", "model"}, {"created", started_unix},
                                        {"owned_by", "engine-host"}, {"status", st[i]["state"]}};
                if (st[i].contains("context_length")) entry["context_length"] = st[i]["context_length"];
                data.push_back(entry);
                for (const auto& alias : m.aliases) {
                    entry["id"] = alias;
                    entry["root"] = m.name;
                    data.push_back(entry);
                }
            }
        } else if (state.load() != State::Loading) {
            NodeInfo ni = get_info();
            data.push_back({{"id", ni.model}, {"object", "model"}, {"created", started_unix}, {"owned_by", "engine-host"},
                            {"context_length", ni.context_length}});
            for (const auto& alias : ni.model_aliases)
                data.push_back({{"id", alias}, {"object", "model"}, {"created", started_unix}, {"owned_by", "engine-host"},
                                {"context_length", ni.context_length}, {"root", ni.model}});
            // LoRA adapters (--lora), as the `model` that picks each.
            if (const auto svc = get_service())
                for (const auto& name : svc->options().adapters)
                    data.push_back({{"id", ni.model + ":" + name}, {"object", "model"}, {"created", started_unix},
                                    {"owned_by", "engine-host"}, {"context_length", ni.context_length},
                                    {"root", ni.model}, {"parent", ni.model}, {"lora", name}});
        }
        send_json(res, 200, {{"object", "list"}, {"data", data}});
    });

    auto handle = [this](bool chat, const httplib::Request& req, httplib::Response& res) {
        const char* endpoint = chat ? "chat" : "completions";
        std::string cid = correlation_id(req, res);
        std::shared_ptr<service::Service> svc;
        if (!accepting(*this, res, cid)) {
            metrics->request(endpoint, state.load() == State::Stopping ? "rejected_shutdown" : "rejected_loading");
            return;
        }
        std::shared_ptr<service::Job> job;
        std::vector<std::shared_ptr<service::Job>> jobs;  // n of them; job == jobs[0]
        OpenAIRequest r;
        try {
            r = parse_openai_request(req.body, chat, options.limits);
            std::string base = r.model;
            split_model_adapter(*this, base, r.gen.adapter);
            svc = service_for(*this, base);
            if (chat) render_chat_cancellable(*this, *svc, r);
            r.gen.correlation_id = cid;
            r.gen.cache_scope = cache_scope_of(*this, req);
            jobs = svc->submit_n(r.gen, r.n);
            job = jobs[0];
            access::note_jobs(jobs);
        } catch (const std::exception& e) {
            auto* ee = dynamic_cast<const Error*>(&e);
            metrics->request(endpoint, !ee ? (dynamic_cast<const ModelStillLoading*>(&e) ? "rejected_loading" : "error")
                                       : ee->code() == Code::QueueFull ? "rejected_queue_full"
                                       : ee->code() == Code::ShuttingDown ? "rejected_shutdown"
                                       : ee->code() == Code::Cancelled ? "cancelled"  // left during its template
                                       : "rejected_invalid");
            send_exception(res, e, cid);
            return;
        }
        const std::string model = r.model.empty() ? get_info().model : r.model;
        const std::string id = job->request.job_id;
        const int64_t created = unix_now();
        const bool want_lp = r.logprobs;
        const uint32_t prompt_tokens = uint32_t(job->prompt_tokens.size());
        res.set_header("X-Job-Id", id);

        auto cached = std::make_shared<uint32_t>(0);  // from the started event
        const size_t n_choices = jobs.size();
        // Chat: each choice's output split into reasoning, content and tool calls.
        auto outputs = std::make_shared<std::vector<ChatChoiceOutput>>();
        if (chat) {
            service::ChatParseOptions po{r.tools.enabled(), r.tools.parallel, {}};
            for (const auto& t : r.tools.tools) po.names.push_back(t.name);
            for (size_t i = 0; i < n_choices; ++i) outputs->emplace_back(svc->codec().tool_format(), po, r.tools.prefill);
        }
        // Usage once the last choice ended: (choices ended, completion tokens).
        auto totals = std::make_shared<std::pair<size_t, uint32_t>>(0, 0);
        if (r.stream) {
            auto first = std::make_shared<bool>(true);
            auto lp_states = std::make_shared<std::vector<CompletionLogprobs>>(n_choices);
            auto render = [=](size_t index, const JobEvent& ev) -> std::string {
                CompletionLogprobs* lp_state = &(*lp_states)[index];
                auto chunk = [&](nlohmann::json choice) {
                    nlohmann::json c = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
                                        {"created", created}, {"model", model}, {"choices", {choice}}};
                    if (r.include_usage) c["usage"] = nullptr;
                    return c;
                };
                switch (ev.kind) {
                case JobEvent::Kind::Started:
                    if (index == 0) *cached = ev.cached_tokens;
                    if (chat) {
                        *first = false;
                        return sse_data(chunk({{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                               {"logprobs", nullptr}, {"finish_reason", nullptr}}));
                    }
                    return {};
                case JobEvent::Kind::Token: {
                    nlohmann::json choice = {{"index", index}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
                    if (chat) {
                        auto deltas = (*outputs)[index].deltas(ev.text);
                        // Logprobs ride on the first chunk (an empty one when
                        // the parser holds the text back).
                        if (deltas.empty() && want_lp) deltas.push_back({{"content", ""}});
                        std::string out;
                        for (size_t k = 0; k < deltas.size(); ++k) {
                            choice["delta"] = std::move(deltas[k]);
                            choice["logprobs"] = want_lp && k == 0 ? chat_logprobs(ev.logprobs) : nlohmann::json(nullptr);
                            out += sse_data(chunk(choice));
                        }
                        return out;
                    } else {
                        choice["text"] = ev.text;
                        if (want_lp) {
                            CompletionLogprobs one;
                            one.offset = lp_state->offset;
                            one.add(ev.logprobs);
                            lp_state->offset = one.offset;
                            choice["logprobs"] = one.json();
                        }
                    }
                    return sse_data(chunk(choice));
                }
                case JobEvent::Kind::End: {
                    std::string out;
                    nlohmann::json choice = {{"index", index}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
                    if (chat) {
                        for (auto& d : (*outputs)[index].finish_deltas()) {
                            choice["delta"] = std::move(d);
                            out += sse_data(chunk(choice));
                        }
                        choice["finish_reason"] = (*outputs)[index].finish_reason(ev.stop_reason);
                        choice["delta"] = nlohmann::json::object();
                    } else {
                        choice["finish_reason"] = finish_reason(ev.stop_reason);
                        choice["text"] = "";
                    }
                    out += sse_data(chunk(choice));
                    totals->first += 1;
                    totals->second += ev.tokens_out;
                    if (r.include_usage && totals->first == n_choices) {
                        nlohmann::json u = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
                                            {"created", created}, {"model", model}, {"choices", nlohmann::json::array()},
                                            {"usage", usage_json(prompt_tokens, totals->second, *cached)}};
                        out += sse_data(u);
                    }
                    return out;
                }
                case JobEvent::Kind::Error:
                    return sse_data(stream_error(ev, cid));
                }
                return {};
            };
            // An OpenAI stream always ends with [DONE], after an error event too:
            // clients stop reading there.
            stream_jobs(*this, res, svc, jobs, render, "data: [DONE]\n\n", true);
            return;
        }

        // Not streaming: collect every choice. A client that goes away
        // (its connection closed) cancels them at once: its sequences' KV
        // blocks go back to the pool, not when the answer would be written.
        nlohmann::json choices = nlohmann::json::array();
        uint32_t completion_tokens = 0;
        for (size_t index = 0; index < n_choices; ++index) {
            std::string text;
            nlohmann::json chat_lp = nlohmann::json::array();
            CompletionLogprobs comp_lp;
            for (;;) {
                auto ev = wait_event(*svc, *jobs[index], jobs);
                if (!ev) return;  // the client left
                if (ev->kind == JobEvent::Kind::Started && index == 0) *cached = ev->cached_tokens;
                if (ev->kind == JobEvent::Kind::Token) {
                    if (chat) (*outputs)[index].add(ev->text);
                    else text += ev->text;
                    if (want_lp) {
                        if (chat) {
                            nlohmann::json part = chat_logprobs(ev->logprobs);
                            for (auto& c : part["content"]) chat_lp.push_back(c);
                        } else {
                            comp_lp.add(ev->logprobs);
                        }
                    }
                } else if (ev->kind == JobEvent::Kind::Error) {
                    for (size_t k = index + 1; k < n_choices; ++k)
                        svc->cancel(jobs[k]->request.job_id, service::CancelReason::Client, &jobs[k]->request.owner);
                    set_retry_after(res, *ev);
                    send_json(res, http_status_for(ev->code), stream_error(*ev, cid));
                    return;
                } else if (ev->kind == JobEvent::Kind::End) {
                    nlohmann::json choice = {{"index", index}, {"finish_reason", finish_reason(ev->stop_reason)}};
                    if (chat) {
                        auto& output = (*outputs)[index];
                        output.finish();
                        choice["message"] = output.message();
                        choice["finish_reason"] = output.finish_reason(ev->stop_reason);
                        choice["logprobs"] = want_lp ? nlohmann::json{{"content", chat_lp}} : nlohmann::json(nullptr);
                    } else {
                        choice["text"] = text;
                        choice["logprobs"] = want_lp ? comp_lp.json() : nlohmann::json(nullptr);
                    }
                    choices.push_back(choice);
                    completion_tokens += ev->tokens_out;
                    break;
                }
            }
        }
        nlohmann::json body = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"},
                               {"created", created}, {"model", model}, {"choices", choices},
                               {"usage", usage_json(prompt_tokens, completion_tokens, *cached)},
                               {"system_fingerprint", nullptr}};
        send_json(res, 200, body);
    };
    http.Post("/v1/completions", [handle](const httplib::Request& req, httplib::Response& res) { handle(false, req, res); });
    http.Post("/v1/chat/completions", [handle](const httplib::Request& req, httplib::Response& res) { handle(true, req, res); });
}

}  // namespace eh::http
