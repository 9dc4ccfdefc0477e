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

// GET /v1/models: every model served, loaded or not, its aliases after it;
// with one model, its aliases and LoRA adapters.
void list_models(Server::Impl& s, const httplib::Request& req, httplib::Response& res) {
    correlation_id(req, res);
    nlohmann::json data = nlohmann::json::array();
    if (const auto pool = s.get_pool()) {
        const nlohmann::json st = pool->status();
        for (size_t i = 0; i < pool->models().size(); ++i) {
            const PoolModelSpec& m = pool->models()[i];
            nlohmann::json entry = {{"id", m.name}, {"object", "model"}, {"created", s.started_unix},
                                    {"owned_by", "engine-host"}, {"status", st[i]["state"]}};
            if (st[i].contains("context_length")) entry["context_length"] = st[i]["context_length"];
            data.push_back(entry);
            for (const auto& alias : m.aliases) {
                entry["id"] = alias;
                entry["root"] = m.name;
                data.push_back(entry);
            }
        }
    } else if (s.state.load() != State::Loading) {
        NodeInfo ni = s.get_info();
        data.push_back({{"id", ni.model}, {"object", "model"}, {"created", s.started_unix}, {"owned_by", "engine-host"},
                        {"context_length", ni.context_length}});
        for (const auto& alias : ni.model_aliases)
            data.push_back({{"id", alias}, {"object", "model"}, {"created", s.started_unix},
                            {"owned_by", "engine-host"}, {"context_length", ni.context_length}, {"root", ni.model}});
        // LoRA adapters (--lora), as the `model` that picks each.
        if (const auto svc = s.get_service())
            for (const auto& name : svc->options().adapters)
                data.push_back({{"id", ni.model + ":" + name}, {"object", "model"}, {"created", s.started_unix},
                                {"owned_by", "engine-host"}, {"context_length", ni.context_length},
                                {"root", ni.model}, {"parent", ni.model}, {"lora", name}});
    }
    send_json(res, 200, {{"object", "list"}, {"data", data}});
}

// A /v1/completions or /v1/chat/completions request once its jobs (n of
// them, one a choice) are submitted: what every chunk or the answer names.
struct Reply {
    bool chat = false;
    OpenAIRequest r;
    std::string cid, id, model;
    int64_t created = 0;
    uint32_t prompt_tokens = 0;
    uint32_t cached = 0;  // from the first choice's started event
    std::shared_ptr<service::Service> svc;
    std::vector<std::shared_ptr<service::Job>> jobs;
    // Chat: each choice's output split into reasoning, content and tool calls.
    std::vector<ChatChoiceOutput> outputs;
    const char* object() const { return chat ? "chat.completion.chunk" : "text_completion"; }
};

// Parses the request and submits its jobs; nullptr when it was refused
// (the response is written then).
std::shared_ptr<Reply> submit(Server::Impl& s, bool chat, const httplib::Request& req, httplib::Response& res) {
    const char* endpoint = chat ? "chat" : "completions";
    auto reply = std::make_shared<Reply>();
    Reply& o = *reply;
    o.chat = chat;
    o.cid = correlation_id(req, res);
    if (!accepting(s, res, o.cid)) {
        s.metrics->request(endpoint,
                           s.state.load() == State::Stopping ? "rejected_shutdown" : "rejected_loading");
        return nullptr;
    }
    try {
        o.r = parse_openai_request(req.body, chat, s.options.limits);
        std::string base = o.r.model;
        split_model_adapter(s, base, o.r.gen.adapter);
        o.svc = service_for(s, base);
        if (chat) render_chat_cancellable(s, *o.svc, o.r);
        o.r.gen.correlation_id = o.cid;
        o.r.gen.cache_scope = cache_scope_of(s, req);
        o.jobs = o.svc->submit_n(o.r.gen, o.r.n);
        access::note_jobs(o.jobs);
    } catch (const std::exception& e) {
        auto* ee = dynamic_cast<const Error*>(&e);
        s.metrics->request(endpoint, !ee ? (dynamic_cast<const ModelStillLoading*>(&e) ? "rejected_loading" : "error")
                                     : ee->code() == Code::QueueFull ? "rejected_queue_full"
                                     : ee->code() == Code::ShuttingDown ? "rejected_shutdown"
                                     : ee->code() == Code::Cancelled ? "cancelled"  // left during its template
                                     : "rejected_invalid");
        send_exception(res, e, o.cid);
        return nullptr;
    }
    const service::Job& job = *o.jobs[0];
    o.model = o.r.model.empty() ? s.get_info().model : o.r.model;
    o.id = job.request.job_id;
    o.created = unix_now();
    o.prompt_tokens = uint32_t(job.prompt_tokens.size());
    res.set_header("X-Job-Id", o.id);
    if (chat) {
        service::ChatParseOptions po{o.r.tools.enabled(), o.r.tools.parallel, {}};
        for (const auto& t : o.r.tools.tools) po.names.push_back(t.name);
        for (size_t i = 0; i < o.jobs.size(); ++i)
            o.outputs.emplace_back(o.svc->codec().tool_format(), po, o.r.tools.prefill);
    }
    return reply;
}

// A streamed reply's chunks, one choice's event at a time.
class ChunkWriter {
public:
    explicit ChunkWriter(std::shared_ptr<Reply> reply) : o_(std::move(reply)), lp_(o_->jobs.size()) {}

    std::string operator()(size_t index, const JobEvent& ev) {
        switch (ev.kind) {
        case JobEvent::Kind::Started:
            if (index == 0) o_->cached = ev.cached_tokens;
            if (!o_->chat) return {};
            return sse_data(chunk({{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr}, {"finish_reason", nullptr}}));
        case JobEvent::Kind::Token: return token(index, ev);
        case JobEvent::Kind::End: return end(index, ev);
        case JobEvent::Kind::Error: return sse_data(stream_error(ev, o_->cid));
        }
        return {};
    }

private:
    nlohmann::json chunk(nlohmann::json choice) const {
        nlohmann::json c = {{"id", o_->id}, {"object", o_->object()}, {"created", o_->created}, {"model", o_->model},
                            {"choices", {choice}}};
        if (o_->r.include_usage) c["usage"] = nullptr;
        return c;
    }

    std::string token(size_t index, const JobEvent& ev) {
        const bool want_lp = o_->r.logprobs;
        nlohmann::json choice = {{"index", index}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
        if (o_->chat) {
            auto deltas = o_->outputs[index].deltas(ev.text);
            // Logprobs ride on the first chunk (an empty one when the parser
            // holds the text back).
            if (deltas.empty() && want_lp) deltas.push_back({{"content", ""}});
            std::string out;
            for (size_t k = 0; k < deltas.size(); ++k) {
                choice["delta"] = std::move(deltas[k]);
                choice["logprobs"] = want_lp && k == 0 ? chat_logprobs(ev.logprobs) : nlohmann::json(nullptr);
                out += sse_data(chunk(choice));
            }
            return out;
        }
        choice["text"] = ev.text;
        if (want_lp) {
            CompletionLogprobs one;
            one.offset = lp_[index].offset;
            one.add(ev.logprobs);
            lp_[index].offset = one.offset;
            choice["logprobs"] = one.json();
        }
        return sse_data(chunk(choice));
    }

    // The choice's last chunks; usage after the last choice ended.
    std::string end(size_t index, const JobEvent& ev) {
        std::string out;
        nlohmann::json choice = {{"index", index}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
        if (o_->chat) {
            for (auto& d : o_->outputs[index].finish_deltas()) {
                choice["delta"] = std::move(d);
                out += sse_data(chunk(choice));
            }
            choice["finish_reason"] = o_->outputs[index].finish_reason(ev.stop_reason);
            choice["delta"] = nlohmann::json::object();
        } else {
            choice["finish_reason"] = finish_reason(ev.stop_reason);
            choice["text"] = "";
        }
        out += sse_data(chunk(choice));
        ++ended_;
        completion_tokens_ += ev.tokens_out;
        if (o_->r.include_usage && ended_ == o_->jobs.size()) {
            nlohmann::json u = {{"id", o_->id}, {"object", o_->object()}, {"created", o_->created},
                                {"model", o_->model}, {"choices", nlohmann::json::array()},
                                {"usage", usage_json(o_->prompt_tokens, completion_tokens_, o_->cached)}};
            out += sse_data(u);
        }
        return out;
    }

    std::shared_ptr<Reply> o_;
    std::vector<CompletionLogprobs> lp_;  // completions: each choice's text offset
    size_t ended_ = 0;
    uint32_t completion_tokens_ = 0;
};

// Not streaming: collect every choice. A client that goes away (its
// connection closed) cancels them at once: its sequences' KV blocks go
// back to the pool, not when the answer would be written.
void send_reply(httplib::Response& res, Reply& o) {
    const bool want_lp = o.r.logprobs;
    const size_t n_choices = o.jobs.size();
    nlohmann::json choices = nlohmann::json::array();
    uint32_t completion_tokens = 0;
    for (size_t index = 0; index < n_choices; ++index) {
        std::string text;
        nlohmann::json chat_lp = nlohmann::json::array();
        CompletionLogprobs comp_lp;
        for (;;) {
            auto ev = wait_event(*o.svc, *o.jobs[index], o.jobs);
            if (!ev) return;  // the client left
            if (ev->kind == JobEvent::Kind::Started && index == 0) o.cached = ev->cached_tokens;
            if (ev->kind == JobEvent::Kind::Token) {
                if (o.chat) o.outputs[index].add(ev->text);
                else text += ev->text;
                if (want_lp) {
                    if (o.chat) {
                        nlohmann::json part = chat_logprobs(ev->logprobs);
                        for (auto& c : part["content"]) chat_lp.push_back(c);
                    } else {
                        comp_lp.add(ev->logprobs);
                    }
                }
            } else if (ev->kind == JobEvent::Kind::Error) {
                for (size_t k = index + 1; k < n_choices; ++k)
                    o.svc->cancel(o.jobs[k]->request.job_id, service::CancelReason::Client, &o.jobs[k]->request.owner);
                set_retry_after(res, *ev);
                send_json(res, http_status_for(ev->code), stream_error(*ev, o.cid));
                return;
            } else if (ev->kind == JobEvent::Kind::End) {
                nlohmann::json choice = {{"index", index}, {"finish_reason", finish_reason(ev->stop_reason)}};
                if (o.chat) {
                    auto& output = o.outputs[index];
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
    nlohmann::json body = {{"id", o.id}, {"object", o.chat ? "chat.completion" : "text_completion"},
                           {"created", o.created}, {"model", o.model}, {"choices", choices},
                           {"usage", usage_json(o.prompt_tokens, completion_tokens, o.cached)},
                           {"system_fingerprint", nullptr}};
    send_json(res, 200, body);
}

}  // namespace

void Server::Impl::install_openai() {
    http.Get("/v1/models",
             [this](const httplib::Request& req, httplib::Response& res) { list_models(*this, req, res); });
    auto handle = [this](bool chat, const httplib::Request& req, httplib::Response& res) {
        const auto reply = submit(*this, chat, req, res);
        if (!reply) return;
        if (!reply->r.stream) return send_reply(res, *reply);
        // An OpenAI stream always ends with [DONE], after an error event too:
        // clients stop reading there.
        auto writer = std::make_shared<ChunkWriter>(reply);
        stream_jobs(*this, res, reply->svc, reply->jobs,
                    [writer](size_t index, const JobEvent& ev) { return (*writer)(index, ev); }, "data: [DONE]\n\n",
                    true);
    };
    http.Post("/v1/completions", [handle](const httplib::Request& req, httplib::Response& res) { handle(false, req, res); });
    http.Post("/v1/chat/completions", [handle](const httplib::Request& req, httplib::Response& res) { handle(true, req, res); });
}

}  // namespace eh::http
