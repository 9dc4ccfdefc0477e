#include "eh/service/service.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "eh/service/event_log.hpp"
#include "eh/service/stop_matcher.hpp"
#include "eh/service/text_stream.hpp"
#include "eh/service/utf8.hpp"

namespace eh::service {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() { return Clock::now().time_since_epoch().count(); }

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string rfc3339_now() {
    auto now = std::chrono::system_clock::now();
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
    std::time_t t = std::time_t(ms / 1000);
    std::tm tm{};
    gmtime_r(&t, &tm);
    return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                       tm.tm_hour, tm.tm_min, tm.tm_sec, int(ms % 1000));
}

uint64_t random_seed() {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}()};
    std::lock_guard lock(mu);
    return rng();
}

JobEvent error_event(Code code, std::string message, bool retriable, std::optional<uint32_t> retry_after = {}) {
    JobEvent ev;
    ev.kind = JobEvent::Kind::Error;
    ev.code = code;
    ev.message = std::move(message);
    ev.retriable = retriable;
    ev.retry_after_ms = retry_after;
    return ev;
}

bool retriable_code(Code c) {
    return c == Code::QueueFull || c == Code::ShuttingDown || c == Code::VramOom || c == Code::InferenceTimeout;
}

const char* outcome_for(Code c) {
    switch (c) {
    case Code::Cancelled: return "cancelled";
    case Code::InferenceTimeout: return "timeout";
    case Code::ShuttingDown: return "rejected_shutdown";
    default: return "error";
    }
}

}  // namespace

Service::Service(std::shared_ptr<EngineModel> model, std::shared_ptr<const TextCodec> codec, ServiceOptions options,
                 std::shared_ptr<Metrics> metrics)
    : model_(std::move(model)), codec_(std::move(codec)), options_(std::move(options)),
      metrics_(metrics ? std::move(metrics) : std::make_shared<Metrics>()) {
    const eh_model_info mi = model_->info();
    trained_ctx_ = mi.context_length;
    model_device_bytes_ = mi.device_bytes_used;
    kv_bytes_per_token_ = mi.kv_bytes_per_token;
    n_ctx_ = options_.n_ctx ? options_.n_ctx : trained_ctx_;
    if (n_ctx_ == 0) throw Error(Code::ModelLoadFailed, "the model reports a context length of 0; pass --ctx-size");
    session_ = make_session(n_ctx_);
    refresh_device_bytes();
    worker_ = std::thread([this] { worker_loop(); });
}

Service::~Service() { shutdown(); }

// The cancel callback is polled by the plugin inside prefill/decode, so a
// long prefill stops too. It reads only atomics.
std::unique_ptr<EngineSession> Service::make_session(uint32_t n_ctx) {
    return model_->create_session(n_ctx, [this] {
        Job* j = running_.load();
        if (!j) return false;
        if (j->cancelled()) return true;
        if (now_ns() > deadline_ns_.load()) {
            j->cancel(CancelReason::Timeout);
            return true;
        }
        return false;
    });
}

// Only the constructor and the worker call this: never concurrently with
// a session being made or freed.
void Service::refresh_device_bytes() {
    try {
        device_bytes_.store(model_->info().device_bytes_used);
    } catch (const std::exception&) {
        // keep the last value: /health must not fail because of this
    }
}

size_t Service::queue_depth() const {
    std::lock_guard lock(mu_);
    return queue_.size();
}

uint32_t Service::retry_after_ms() const {
    double est = avg_job_ms_.load() * double(queue_depth() + 1);
    return uint32_t(std::clamp(est, 1000.0, 60000.0));
}

std::shared_ptr<Job> Service::submit(GenerationRequest req) {
    if (stopping_) throw Error(Code::ShuttingDown, "the server is shutting down; not accepting new jobs");
    auto job = std::make_shared<Job>();
    job->prompt_tokens = codec_->encode(req.prompt, req.add_special, req.parse_special);
    job->n_ctx = n_ctx_;
    if (req.n_ctx) {
        if (trained_ctx_ && *req.n_ctx > trained_ctx_)
            throw RequestError("n_ctx", fmt::format("'n_ctx' {} exceeds the model's trained context length {}",
                                                    *req.n_ctx, trained_ctx_));
        job->n_ctx = std::max(n_ctx_, *req.n_ctx);  // a smaller one runs in the server's session
    }
    const uint32_t ctx = job->n_ctx;
    const size_t np = job->prompt_tokens.size();
    if (np == 0) throw RequestError("prompt", "the prompt encodes to zero tokens");
    if (np >= ctx)
        throw RequestError("prompt", fmt::format("the prompt is {} tokens but the context holds {} tokens in all "
                                                 "(prompt + output); shorten the prompt to at most {} tokens",
                                                 np, ctx, ctx - 1));
    const uint32_t room = uint32_t(ctx - np);
    if (req.max_tokens) {
        if (*req.max_tokens > room)
            throw RequestError("max_tokens", fmt::format("prompt ({} tokens) + max_tokens ({}) = {} exceeds the context "
                                                         "length {}; lower max_tokens to at most {} or shorten the prompt",
                                                         np, *req.max_tokens, np + *req.max_tokens, ctx, room));
        job->max_tokens = *req.max_tokens;
    } else {
        job->max_tokens = std::min(room, options_.limits.max_tokens);
    }
    if (req.top_logprobs >= 0 && !model_->api().session_logits)
        throw RequestError("logprobs", "logprobs are not available: the engine plugin does not expose logits");
    job->seed = req.sampling.seed ? *req.sampling.seed : random_seed();
    job->request = std::move(req);
    {
        std::lock_guard lock(mu_);
        if (stopping_) throw Error(Code::ShuttingDown, "the server is shutting down; not accepting new jobs");
        if (live_.count(job->request.job_id))
            throw RequestError("job_id", fmt::format("job_id '{}' is already queued or running",
                                                     sanitize_utf8(job->request.job_id)));
        size_t in_system = queue_.size() + (current_ ? 1 : 0);
        if (in_system >= options_.queue_capacity + 1) {
            uint32_t ra = uint32_t(std::clamp(avg_job_ms_.load() * double(queue_.size() + 1), 1000.0, 60000.0));
            throw QueueFullError(fmt::format("the queue is full ({} waiting, capacity {}); retry later", queue_.size(),
                                             options_.queue_capacity), ra);
        }
        queue_.push_back(job);
        live_[job->request.job_id] = job;
    }
    cv_.notify_all();
    return job;
}

std::string Service::cancel(const std::string& job_id, CancelReason why) {
    std::shared_ptr<Job> job;
    bool was_queued = false;
    {
        std::lock_guard lock(mu_);
        auto it = live_.find(job_id);
        if (it == live_.end()) {
            return std::find(recent_.begin(), recent_.end(), job_id) != recent_.end() ? "finished" : "unknown";
        }
        job = it->second;
        if (job->terminated()) return "finished";  // ended, worker not yet done with it
        auto q = std::find(queue_.begin(), queue_.end(), job);
        if (q != queue_.end()) {
            queue_.erase(q);
            live_.erase(it);
            recent_.push_back(job_id);
            if (recent_.size() > 1024) recent_.pop_front();
            was_queued = true;
        }
    }
    job->cancel(why);
    if (was_queued) {
        finish(job, error_event(Code::Cancelled, fmt::format("cancelled while queued ({})", cancel_reason_name(why)), false));
        return "cancelled";
    }
    return "cancelling";
}

void Service::finish(const std::shared_ptr<Job>& job, const JobEvent& terminal) {
    const auto& r = job->request;
    if (terminal.kind == JobEvent::Kind::End) {
        metrics_->request(r.origin, "completed");
        log_event(spdlog::level::info, "execute_end",
                  {{"job_id", r.job_id}, {"correlation_id", r.correlation_id}, {"tokens_out", terminal.tokens_out},
                   {"stop_reason", terminal.stop_reason}, {"decode_time_ms", terminal.decode_time_ms},
                   {"time_to_first_token_ms", terminal.time_to_first_token_ms}});
    } else {
        metrics_->request(r.origin, outcome_for(terminal.code));
        log_event(terminal.code == Code::Cancelled ? spdlog::level::info : spdlog::level::warn, "error",
                  {{"job_id", r.job_id}, {"correlation_id", r.correlation_id}, {"code", code_name(terminal.code)},
                   {"message", terminal.message}});
    }
    job->push(terminal);
}

void Service::worker_loop() {
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;
            job = queue_.front();
            queue_.pop_front();
            current_ = job;
        }
        auto t0 = Clock::now();
        run(job);
        double ms = ms_between(t0, Clock::now());
        avg_job_ms_.store(0.8 * avg_job_ms_.load() + 0.2 * ms);
        {
            std::lock_guard lock(mu_);
            current_.reset();
            live_.erase(job->request.job_id);
            recent_.push_back(job->request.job_id);
            if (recent_.size() > 1024) recent_.pop_front();
        }
        cv_.notify_all();
    }
}

void Service::run(const std::shared_ptr<Job>& job) {
    const GenerationRequest& req = job->request;
    const auto t0 = Clock::now();
    deadline_ns_.store((t0 + options_.inference_timeout).time_since_epoch().count());
    running_.store(job.get());
    active_.store(1);
    struct Reset {
        Service* s;
        ~Reset() {
            s->running_.store(nullptr);
            s->active_.store(0);
        }
    } reset{this};

    JobEvent started;
    started.kind = JobEvent::Kind::Started;
    started.started_at = rfc3339_now();
    started.seed = job->seed;
    started.prompt_tokens = uint32_t(job->prompt_tokens.size());
    job->push(started);
    metrics_->prompt_tokens(job->prompt_tokens.size());
    nlohmann::json start_fields = {{"job_id", req.job_id}, {"correlation_id", req.correlation_id},
                                   {"prompt_tokens", job->prompt_tokens.size()}, {"max_tokens", job->max_tokens},
                                   {"seed", job->seed}, {"endpoint", req.origin}};
    if (log_settings().log_content) start_fields["prompt"] = sanitize_utf8(req.prompt);
    log_event(spdlog::level::info, "execute_start", start_fields);

    auto check = [&] {
        if (job->cancelled() || now_ns() > deadline_ns_.load()) {
            if (!job->cancelled()) job->cancel(CancelReason::Timeout);
            throw Error(Code::Cancelled, "cancelled");
        }
    };
    // A job with a larger n_ctx of its own gets a session (and KV cache) for
    // its duration; failing to allocate it ends this job alone.
    std::unique_ptr<EngineSession> own;
    EngineSession* cur = session_.get();
    const bool want_lp = req.top_logprobs >= 0;
    auto logprob_of = [&](int32_t tok) {
        TokenLogprob lp;
        lp.id = tok;
        lp.text = sanitize_utf8(codec_->decode(std::span<const int32_t>(&tok, 1)));
        auto lg = cur->logits();
        if (lg.empty() || tok < 0 || size_t(tok) >= lg.size()) return lp;
        float mx = *std::max_element(lg.begin(), lg.end());
        double sum = 0;
        for (float v : lg) sum += std::exp(double(v) - mx);
        double lse = mx + std::log(sum);
        lp.logprob = double(lg[size_t(tok)]) - lse;
        if (req.top_logprobs > 0) {
            std::vector<int32_t> idx(lg.size());
            std::iota(idx.begin(), idx.end(), 0);
            size_t k = std::min(size_t(req.top_logprobs), idx.size());
            std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                              [&](int32_t a, int32_t b) { return lg[size_t(a)] > lg[size_t(b)]; });
            for (size_t i = 0; i < k; ++i) {
                int32_t id = idx[i];
                lp.top.push_back({id, sanitize_utf8(codec_->decode(std::span<const int32_t>(&id, 1))),
                                  double(lg[size_t(id)]) - lse});
            }
        }
        return lp;
    };

    std::string output;  // only kept for --log-content
    // It is freed before the terminal event, so a client that reads /health
    // after its stream ended sees the memory back.
    auto drop_own = [&] {
        if (!own) return;
        cur = session_.get();
        own.reset();
        refresh_device_bytes();
    };
    try {
        if (job->n_ctx > n_ctx_) {
            try {
                own = make_session(job->n_ctx);
            } catch (const Error& e) {
                if (e.code() != Code::VramOom) throw;
                throw Error(Code::VramOom,
                            fmt::format("n_ctx {} needs a KV cache of {} that does not fit in free device memory "
                                        "(this job only; the server's context of {} still serves requests): {}",
                                        job->n_ctx, kv_bytes_per_token_
                                            ? fmt::format("{} bytes", uint64_t(job->n_ctx) * kv_bytes_per_token_)
                                            : std::string("unstated size"),
                                        n_ctx_, e.what()));
            }
            cur = own.get();
            refresh_device_bytes();
        }
        EngineSession& session = *cur;
        session.reset();
        eh_sampling_params sp{};
        sp.struct_size = sizeof(sp);
        sp.temperature = float(req.sampling.temperature);
        sp.top_k = req.sampling.top_k;
        sp.top_p = float(req.sampling.top_p);
        sp.min_p = float(req.sampling.min_p);
        sp.repetition_penalty = float(req.sampling.repetition_penalty);
        sp.repetition_window = options_.repetition_window;
        sp.seed = job->seed;
        session.set_sampling(sp);
        check();
        session.prefill(job->prompt_tokens);
        check();
        int32_t tok = session.sample();
        const auto t_first = Clock::now();
        auto t_prev = t_first;

        const size_t ctx_n = std::min<size_t>(job->prompt_tokens.size(), 4);
        TextStream text(*codec_, std::span<const int32_t>(job->prompt_tokens).last(ctx_n));
        StopMatcher stops(req.stop);
        std::vector<TokenLogprob> pending_lp;
        uint32_t n_out = 0;
        std::string reason;
        auto emit = [&](std::string chunk) {
            if (chunk.empty() && pending_lp.empty()) return;
            if (log_settings().log_content) output += chunk;
            JobEvent ev;
            ev.kind = JobEvent::Kind::Token;
            ev.text = std::move(chunk);
            ev.index = n_out ? n_out - 1 : 0;
            ev.logprobs = std::move(pending_lp);
            pending_lp.clear();
            job->push(std::move(ev));
        };
        for (;;) {
            check();
            if (codec_->is_eog(tok)) {
                reason = "eos";
                break;
            }
            auto now = Clock::now();
            if (n_out == 0) metrics_->time_to_first_token(std::chrono::duration<double>(now - t0).count());
            else metrics_->inter_token_latency(std::chrono::duration<double>(now - t_prev).count());
            t_prev = now;
            ++n_out;
            if (want_lp) pending_lp.push_back(logprob_of(tok));
            auto r = stops.feed(text.push(tok));
            emit(std::move(r.emit));
            if (r.stopped) {
                reason = "stop";
                break;
            }
            if (n_out >= job->max_tokens) {
                reason = "length";
                break;
            }
            tok = session.decode(tok);
        }
        if (reason != "stop") {
            auto r = stops.feed(text.finish());
            if (r.stopped) {
                reason = "stop";
                emit(std::move(r.emit));
            } else {
                emit(r.emit + stops.flush());
            }
        }
        metrics_->tokens_generated(n_out);
        JobEvent end;
        end.kind = JobEvent::Kind::End;
        end.tokens_out = n_out;
        end.stop_reason = reason;
        end.decode_time_ms = ms_between(t_first, Clock::now());
        end.time_to_first_token_ms = ms_between(t0, t_first);
        if (log_settings().log_content)
            log_event(spdlog::level::info, "execute_output", {{"job_id", req.job_id}, {"correlation_id", req.correlation_id}, {"text", output}});
        drop_own();
        finish(job, end);
    } catch (const Error& e) {
        Code code = e.code();
        std::string msg = e.what();
        bool retriable = retriable_code(code);
        if (code == Code::Cancelled || job->cancelled()) {
            switch (job->cancel_reason()) {
            case CancelReason::Timeout:
                code = Code::InferenceTimeout;
                msg = fmt::format("the job ran past the inference timeout of {} ms", options_.inference_timeout.count());
                retriable = false;
                break;
            case CancelReason::Shutdown:
                code = Code::ShuttingDown;
                msg = "the server is shutting down; the job was cancelled";
                retriable = true;
                break;
            case CancelReason::Disconnect:
                code = Code::Cancelled;
                msg = "the client disconnected";
                retriable = false;
                break;
            default:
                code = Code::Cancelled;
                msg = "the job was cancelled by a cancel request";
                retriable = false;
                break;
            }
        }
        drop_own();
        finish(job, error_event(code, msg, retriable));
    } catch (const std::exception& e) {
        drop_own();
        finish(job, error_event(Code::Internal, std::string("internal error: ") + e.what(), false));
    }
}

void Service::shutdown() {
    std::call_once(shutdown_once_, [&] {
        std::vector<std::shared_ptr<Job>> queued;
        std::shared_ptr<Job> running;
        {
            std::lock_guard lock(mu_);
            stopping_ = true;
            queued.assign(queue_.begin(), queue_.end());
            queue_.clear();
            for (auto& j : queued) live_.erase(j->request.job_id);
            running = current_;
        }
        cv_.notify_all();
        for (auto& j : queued)
            finish(j, error_event(Code::ShuttingDown, "the server is shutting down; the job was not started", true));
        if (running) {
            // Let it finish within the grace period, then cancel it.
            auto until = Clock::now() + options_.shutdown_grace;
            while (!running->terminated() && Clock::now() < until)
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            if (!running->terminated()) running->cancel(CancelReason::Shutdown);
        }
        if (worker_.joinable()) worker_.join();
        session_.reset();
    });
}

}  // namespace eh::service
