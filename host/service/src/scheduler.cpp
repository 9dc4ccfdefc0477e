#include "eh/service/scheduler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "eh/service/event_log.hpp"
#include "eh/service/request.hpp"
#include "eh/service/utf8.hpp"

namespace eh::service {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() { return Clock::now().time_since_epoch().count(); }

// How often an idle scheduler asks the engine whether its process still runs.
constexpr auto kIdleCheck = std::chrono::milliseconds(200);

// A restarted engine process takes a model load: clients wait this long.
constexpr uint32_t kEngineRetryAfterMs = 5000;

JobEvent error_event(Code code, std::string message, bool retriable) {
    JobEvent ev;
    ev.kind = JobEvent::Kind::Error;
    ev.code = code;
    ev.message = std::move(message);
    ev.retriable = retriable;
    if (code == Code::EngineCrashed && retriable) ev.retry_after_ms = kEngineRetryAfterMs;
    return ev;
}

// The tokens the prefix cache keys a job on: its own, except that an
// image's positions carry ids made from the image's digest and the position
// (negative, so never a vocabulary id): a cached prefix is reused through an
// image only by a prompt holding the same image there.
std::vector<int32_t> cache_key(const Job& job, std::span<const int32_t> tokens) {
    std::vector<int32_t> k(tokens.begin(), tokens.end());
    for (const auto& im : job.images)
        for (uint32_t j = 0; j < im->count && size_t(im->first) + j < k.size(); ++j) {
            uint64_t h = 1469598103934665603ull;  // FNV-1a over the digest, then the position
            for (char c : im->digest) h = (h ^ uint8_t(c)) * 1099511628211ull;
            for (int b = 0; b < 4; ++b) h = (h ^ ((j >> (8 * b)) & 0xff)) * 1099511628211ull;
            k[im->first + j] = int32_t(uint32_t(h ^ (h >> 32)) | 0x80000000u);
        }
    return k;
}

bool retriable_code(Code c) {
    return c == Code::QueueFull || c == Code::ShuttingDown || c == Code::VramOom || c == Code::InferenceTimeout ||
           c == Code::EngineCrashed;
}

const char* outcome_for(Code c) {
    switch (c) {
    case Code::Cancelled: return "cancelled";
    case Code::InferenceTimeout: return "timeout";
    case Code::ShuttingDown: return "rejected_shutdown";
    default: return "error";
    }
}

// The terminal event of a job that stopped early: why it was cancelled
// decides the code the client sees.
JobEvent stopped_event(const Job& job, const Error& e, std::chrono::milliseconds timeout) {
    if (e.code() != Code::Cancelled && !job.cancelled()) return error_event(e.code(), e.what(), retriable_code(e.code()));
    switch (job.cancel_reason()) {
    case CancelReason::Timeout:
        return error_event(Code::InferenceTimeout,
                           fmt::format("the job ran past the inference timeout of {} ms", timeout.count()), false);
    case CancelReason::Shutdown:
        return error_event(Code::ShuttingDown, "the server is shutting down; the job was cancelled", true);
    case CancelReason::Disconnect:
        return error_event(Code::Cancelled, "the client disconnected", false);
    default:
        return error_event(Code::Cancelled, "the job was cancelled by a cancel request", false);
    }
}

uint32_t blocks_for(uint64_t tokens, uint32_t block_tokens) {
    return uint32_t((tokens + block_tokens - 1) / block_tokens);
}

}  // namespace

const char* engine_state_name(EngineState s) {
    switch (s) {
    case EngineState::Ready: return "ready";
    case EngineState::Restarting: return "restarting";
    case EngineState::Failed: return "failed";
    }
    return "ready";
}

Scheduler::Scheduler(std::unique_ptr<SeqEngine> engine, std::shared_ptr<const TextCodec> codec,
                     std::shared_ptr<Metrics> metrics, SchedulerOptions options)
    : engine_(std::move(engine)), codec_(std::move(codec)), metrics_(std::move(metrics)), options_(options),
      limits_(engine_->limits()) {
    // Half the engine's sequences run; the other half may hold cached prefixes.
    const uint32_t seq_room = limits_.can_fork ? std::max(1u, limits_.max_seqs / 2) : limits_.max_seqs;
    max_running_ = std::max(1u, std::min({options_.max_running, seq_room, limits_.max_step_entries}));
    if (options_.prefix_cache && limits_.can_fork)
        cache_ = std::make_unique<PrefixCache>(
            *engine_, limits_.block_tokens, limits_.max_seqs - max_running_,
            options_.kv_events ? std::make_unique<KvBlockIndex>(options_.kv_events,
                                                                options_.kv_events_block_tokens ? options_.kv_events_block_tokens
                                                                                                : limits_.block_tokens,
                                                                options_.kv_events_hash_seed)
                               : nullptr,
            options_.kv_host_bytes, &stats_.host_tier);
    if (options_.kv_host_bytes && !(cache_ && engine_->can_park())) {
        host_tier_off_reason_ = !cache_ ? "the prefix cache is off"
                                        : "the engine does not park sequences in host memory (a plugin without ABI "
                                          "1.7 seq_park)";
        log_event(spdlog::level::warn, "host_tier_off",
                  {{"kv_host_bytes", options_.kv_host_bytes}, {"reason", host_tier_off_reason_}});
    } else if (options_.kv_host_bytes) {
        log_event(spdlog::level::info, "host_tier", {{"kv_host_bytes", options_.kv_host_bytes}});
    }
    stats_.kv_total_blocks = limits_.total_blocks;
    if (options_.spec.source != SpecSource::Off) {
        if (!limits_.max_draft_tokens) {
            spec_off_reason_ = "the plugin does not verify draft tokens (ABI 1.6 EH_STEP_VERIFY)";
            log_event(spdlog::level::warn, "speculation_off",
                      {{"source", spec_source_name(options_.spec.source)}, {"reason", spec_off_reason_}});
        } else {
            spec_ = std::make_unique<Speculator>(options_.spec, limits_.max_draft_tokens);
            log_event(spdlog::level::info, "speculation",
                      {{"source", spec_source_name(options_.spec.source)},
                       {"draft_max", std::min(options_.spec.draft_max, limits_.max_draft_tokens)},
                       {"max_batch", options_.spec.max_batch}, {"draft_model", options_.spec.draft_name}});
        }
    }
    // Only the scheduler thread steps, and it is the one polled here.
    engine_->set_interrupt([this] {
        const int64_t now = now_ns();
        bool stop = false;
        for (const auto& a : running_)
            if (a && must_stop(*a, now)) stop = true;
        return stop;
    });
    // Killing the engine's process ends every sequence in it, so only a job
    // past its deadline (or the shutdown grace, which cancels running jobs)
    // may cost that; a client's cancel waits for the step.
    engine_->set_overdue([this] {
        const int64_t now = now_ns();
        const auto overdue = [&](const Active& a) {
            return now > a.deadline_ns || (a.job->cancelled() && a.job->cancel_reason() == CancelReason::Shutdown);
        };
        if (admitting_ && overdue(*admitting_)) return true;
        for (const auto& a : running_)
            if (a && overdue(*a)) return true;
        return false;
    });
    publish();
    thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(); }

void Scheduler::publish() {
    stats_.engine_pid = engine_->process_id();
    stats_.running = uint32_t(running_.size());
    stats_.kv_free_blocks = engine_->free_blocks();
    stats_.kv_running_blocks = running_blocks();
    stats_.prefix_entries = cache_ ? uint32_t(cache_->size()) : 0;
    std::lock_guard lock(mu_);
    stats_.waiting = uint32_t(waiting_.size());
    uint64_t adapters = 0;
    for (const auto& w : waiting_)
        if (w && w->job->adapter && w->job->adapter <= 64) adapters |= uint64_t(1) << (w->job->adapter - 1);
    stats_.waiting_adapters = adapters;
}

uint32_t Scheduler::running_blocks() const {
    const uint32_t B = limits_.block_tokens;
    std::unordered_set<SeqId> running;
    for (const auto& a : running_)
        if (a && a->seq) running.insert(a->seq);
    uint64_t held = 0;
    std::unordered_map<SeqId, uint32_t> shared;  // source sequence -> full blocks shared with it
    for (const auto& a : running_) {
        if (!a || !a->seq) continue;
        // Every token it has (a prefill chunk or a chained step in flight
        // holds blocks past in_seq): from above, like the whole estimate.
        const uint32_t blocks = blocks_for(std::max<size_t>(a->tokens.size(), a->shared_tokens), B);
        const uint32_t full_shared = std::min(blocks, a->shared_tokens / B);
        held += blocks - full_shared;
        if (a->shared_from && full_shared) shared[a->shared_from] = std::max(shared[a->shared_from], full_shared);
    }
    for (const auto& [src, n] : shared)
        if (!running.count(src)) held += n;  // a running source counts its own blocks
    const uint32_t total = limits_.total_blocks, free = std::min(engine_->free_blocks(), total);
    return uint32_t(std::min<uint64_t>(held, total - free));
}

void Scheduler::enqueue_all(std::vector<std::shared_ptr<Job>> jobs) {
    {
        std::lock_guard lock(mu_);
        if (stopping_) throw Error(Code::ShuttingDown, "the server is shutting down; not accepting new jobs");
        if (!engine_failed_.empty()) throw Error(Code::EngineCrashed, engine_failed_);
        for (size_t i = 0; i < jobs.size(); ++i) {
            const std::string& id = jobs[i]->request.job_id;
            bool repeated = live_.count(live_key(jobs[i]->request.owner, id)) != 0;
            for (size_t k = 0; k < i; ++k) repeated = repeated || jobs[k]->request.job_id == id;
            if (repeated)
                throw RequestError("job_id", fmt::format("job_id '{}' is already queued or running", sanitize_utf8(id)));
        }
        const size_t queued = size_t(std::count_if(waiting_.begin(), waiting_.end(),
                                                   [](const ActivePtr& a) { return !a->job->same_request; }));
        const size_t adding = size_t(std::count_if(jobs.begin(), jobs.end(),
                                                   [](const std::shared_ptr<Job>& j) { return !j->same_request; }));
        if (queued + adding > options_.queue_capacity) {
            const uint32_t ra = uint32_t(std::clamp(1000.0 * double(waiting_.size()) / double(max_running_), 1000.0, 60000.0));
            throw QueueFullError(fmt::format("the queue is full ({} waiting, capacity {}); retry later", queued,
                                             options_.queue_capacity),
                                 ra);
        }
        for (auto& job : jobs) {
            auto a = std::make_unique<Active>();
            a->tokens = job->prompt_tokens;
            a->job = std::move(job);
            live_[live_key(a->job->request.owner, a->job->request.job_id)] = a->job;
            waiting_.push_back(std::move(a));
        }
        stats_.waiting = uint32_t(waiting_.size());
    }
    cv_.notify_all();
}

std::string Scheduler::cancel(const std::string& job_id, CancelReason why, const std::string* owner) {
    ActivePtr removed;
    std::shared_ptr<Job> job;
    {
        std::lock_guard lock(mu_);
        // Another submitter's job of the same id is another job: "unknown".
        const std::string key = live_key(owner ? *owner : std::string(), job_id);
        auto it = live_.find(key);
        if (it == live_.end())
            return std::find(recent_.begin(), recent_.end(), key) != recent_.end() ? "finished" : "unknown";
        job = it->second;
        if (job->terminated()) return "finished";
        auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](const ActivePtr& a) { return a->job == job; });
        if (w != waiting_.end()) {
            removed = std::move(*w);
            waiting_.erase(w);
            stats_.waiting = uint32_t(waiting_.size());
        }
    }
    job->cancel(why);
    if (removed) {
        // A preempted job still holds no sequence: nothing to release.
        finish(job, error_event(Code::Cancelled, fmt::format("cancelled while queued ({})", cancel_reason_name(why)), false));
        forget(*job);
        return "cancelled";
    }
    cv_.notify_all();
    return "cancelling";
}

void Scheduler::finish(const std::shared_ptr<Job>& job, const JobEvent& terminal) {
    const auto& r = job->request;
    const double e2e = std::chrono::duration<double>(Clock::now() - job->submitted_at).count();
    if (terminal.kind == JobEvent::Kind::End) {
        metrics_->request(r.origin, "completed");
        metrics_->request_latency(e2e);
        if (const int64_t q = job->queue_us.load(); q >= 0)  // admitted: the part of e2e the batch ran it
            metrics_->inference_duration(std::max(0.0, e2e - double(q) / 1e6));
        // A pooled request's inputs (up to 2,048 of them) log at debug; the
        // access log has the request.
        log_event(job->pooled ? spdlog::level::debug : spdlog::level::info, "execute_end",
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

const std::string& Scheduler::cache_scope(const Job& job) const {
    static const std::string shared;
    return options_.prefix_cache_shared ? shared : job.request.cache_scope;
}

std::string Scheduler::live_key(const std::string& owner, const std::string& job_id) {
    return owner + '\0' + job_id;
}

void Scheduler::forget(const Job& job) {
    const std::string key = live_key(job.request.owner, job.request.job_id);
    std::lock_guard lock(mu_);
    live_.erase(key);
    recent_.push_back(key);
    if (recent_.size() > 1024) recent_.pop_front();
}

void Scheduler::loop() {
    for (;;) {
        bool idle = false;
        {
            std::unique_lock lock(mu_);
            idle = !cv_.wait_for(lock, kIdleCheck, [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
            if (stopping_ && waiting_.empty() && running_.empty()) break;
        }
        if (idle) {
            // An engine process that died between requests is restarted now,
            // not when the next request finds it gone (a given-up engine stays down).
            std::optional<Error> lost;
            if (stats_.engine_state.load() == int(EngineState::Ready)) {
                try {
                    engine_->check_alive();
                } catch (const Error& e) {
                    if (e.code() == Code::EngineCrashed) lost = e;
                } catch (const std::exception&) {
                }
            }
            if (lost) engine_lost(*lost);
            continue;
        }
        try {
            reap();
            admit();
            if (!running_.empty()) run_step();
        } catch (const std::exception& e) {
            // A bug in the loop itself: end every running job rather than hang them.
            const Error err(Code::Internal, std::string("internal scheduler error: ") + e.what());
            for (auto& a : running_)
                if (a) fail(std::move(a), err);
            running_.clear();
        }
        stats_.steps.fetch_add(1);
        publish();
    }
    if (cache_) cache_->clear();
    publish();
}

bool Scheduler::must_stop(Active& a, int64_t now) {
    if (!a.job->cancelled() && now > a.deadline_ns) a.job->cancel(CancelReason::Timeout);
    return a.job->cancelled();
}

void Scheduler::reap() {
    const int64_t now = now_ns();
    for (auto& a : running_)
        if (must_stop(*a, now)) fail(std::move(a), Error(Code::Cancelled, "cancelled"));
    std::erase(running_, nullptr);
}

void Scheduler::admit() {
    // After a preemption nothing is admitted until a step has run: the
    // step that found the pool full is retried with one request fewer
    // before anyone can take the blocks that freed. Unless nothing is left
    // to retry (the others were cancelled meanwhile): then holding would
    // leave the preempted request waiting with no step to release it.
    if (hold_admission_ && !running_.empty()) return;
    hold_admission_ = false;
    for (;;) {
        ActivePtr a;
        {
            std::lock_guard lock(mu_);
            if (waiting_.empty() || running_.size() >= max_running_) return;
            a = std::move(waiting_.front());
            waiting_.pop_front();
            stats_.waiting = uint32_t(waiting_.size());
        }
        if (a->job->cancelled()) {
            fail(std::move(a), Error(Code::Cancelled, "cancelled"));
            continue;
        }
        bool admitted = false;
        try {
            admitted = try_admit(*a);
        } catch (const Error& e) {
            if (e.code() == Code::EngineCrashed) {
                // It had not started: it waits for the restarted engine.
                a->seq = 0;
                a->in_seq = 0;
                {
                    std::lock_guard lock(mu_);
                    waiting_.push_front(std::move(a));
                    stats_.waiting = uint32_t(waiting_.size());
                }
                engine_lost(e);
                return;
            }
            fail(std::move(a), e);
            continue;
        }
        if (!admitted) {
            std::lock_guard lock(mu_);
            waiting_.push_front(std::move(a));
            stats_.waiting = uint32_t(waiting_.size());
            return;
        }
        // Oldest first: build_step serves running_ in this order.
        auto at = std::upper_bound(running_.begin(), running_.end(), a->order,
                                   [](uint64_t o, const ActivePtr& r) { return o < r->order; });
        running_.insert(at, std::move(a));
    }
}

uint32_t Scheduler::owed_blocks() const {
    const uint32_t B = limits_.block_tokens;
    uint32_t owed = 0;
    for (const auto& r : running_) {
        if (!r) continue;
        // Its tokens not yet in the sequence and the next one; at least one
        // block each, so a decode crossing into a new block finds it.
        const uint32_t want = blocks_for(uint64_t(r->tokens.size()) + 1, B), have = blocks_for(r->in_seq, B);
        owed += std::max(1u, want > have ? want - have : 0u);
    }
    return owed;
}

// A request sharing a running request's prompt waits for it to be computed
// only while at most this many full steps of it are left.
constexpr uint32_t kMaxPrefixWaitSteps = 8;

namespace {

eh_sampling_params sampling_params(const Job& job, uint32_t repetition_window) {
    const Sampling& sampling = job.request.sampling;
    eh_sampling_params sp{};
    sp.struct_size = sizeof(sp);
    sp.temperature = float(sampling.temperature);
    sp.top_k = sampling.top_k;
    sp.top_p = float(sampling.top_p);
    sp.min_p = float(sampling.min_p);
    sp.repetition_penalty = float(sampling.repetition_penalty);
    sp.repetition_window = repetition_window;
    sp.presence_penalty = float(sampling.presence_penalty);
    sp.frequency_penalty = float(sampling.frequency_penalty);
    sp.seed = job.seed;
    return sp;
}

}  // namespace

// Requests that arrive together behind one system prompt: the cache holds
// only ended requests, so each would compute the prompt again. A running
// request whose tokens share a block or more with this one's is forked
// instead, once those tokens are in its sequence; until then this request
// waits at the head of the queue (a few steps of the other's prefill), as
// an n > 1 sibling does. The longest share wins.
std::optional<PrefixCache::Match> Scheduler::running_prefix(const Active& a, bool& wait) const {
    const uint32_t B = limits_.block_tokens;
    const size_t limit = a.tokens.size() - 1;
    const Active* best = nullptr;
    uint32_t best_n = 0;
    for (const auto& r : running_) {
        if (!r || !r->seq || !r->job->images.empty() || r->job->adapter != a.job->adapter ||
            cache_scope(*r->job) != cache_scope(*a.job))
            continue;
        const auto end = a.tokens.begin() + ptrdiff_t(std::min(limit, r->tokens.size()));
        const uint32_t n = uint32_t(std::mismatch(a.tokens.begin(), end, r->tokens.begin()).first - a.tokens.begin());
        if (n >= B && n > best_n) best = r.get(), best_n = n;
    }
    // (its last sampled token may not be in yet: this request computes
    // that one). The wait is bounded: past kMaxPrefixWaitSteps steps'
    // tokens still to compute, it takes what is in now (a block or more)
    // and computes the rest itself rather than hold the queue behind it.
    if (best && best->in_seq + 1 < best_n &&
        best_n - best->in_seq <= uint64_t(kMaxPrefixWaitSteps) * limits_.max_step_tokens) {
        wait = true;
        return std::nullopt;
    }
    const uint32_t ready = best ? std::min(best_n, best->in_seq) : 0;
    if (ready >= B) return PrefixCache::Match{best->seq, ready};
    return std::nullopt;
}

std::optional<PrefixCache::Match> Scheduler::admission_match(const Active& a, bool& wait) {
    wait = false;
    if (a.job->fork_of && limits_.can_fork && a.tokens.size() == a.job->prompt_tokens.size()) {
        // A sibling of an n > 1 request: share the first one's prompt once it
        // is in; wait while it is being computed.
        const uint32_t n = uint32_t(a.tokens.size() - 1);
        std::optional<PrefixCache::Match> sibling;
        for (const auto& r : running_)
            if (r && r->job == a.job->fork_of) {
                if (r->in_seq < n) {
                    wait = true;
                    return std::nullopt;
                }
                sibling = PrefixCache::Match{r->seq, n};
            }
        if (sibling) return sibling;
    }
    if (!cache_) return std::nullopt;
    std::optional<PrefixCache::Match> running_match;
    if (a.job->images.empty()) {
        running_match = running_prefix(a, wait);
        if (wait) return std::nullopt;
    }
    stats_.prefix_lookups.fetch_add(1);
    stats_.prefix_query_tokens.fetch_add(a.tokens.size());
    const std::vector<int32_t> key = a.job->images.empty() ? std::vector<int32_t>() : cache_key(*a.job, a.tokens);
    auto match = cache_->lookup(cache_scope(*a.job), a.job->adapter,
                                key.empty() ? std::span<const int32_t>(a.tokens) : key, uint32_t(a.tokens.size() - 1),
                                owed_blocks());
    // Never into the middle of an image: its tokens go into one step.
    for (const auto& im : a.job->images)
        if (match && match->n > im->first && match->n < im->first + im->count) match->n = im->first;
    if (match && match->n == 0) match.reset();
    if (running_match && (!match || running_match->n > match->n)) match = running_match;
    return match;
}

void Scheduler::first_admission(Active& a, uint32_t reuse) {
    const GenerationRequest& req = a.job->request;
    a.admitted = Clock::now();
    a.gen = std::make_unique<Generation>(*a.job, *codec_, *metrics_);
    if (a.job->constraint) a.matcher = std::make_unique<constrain::Matcher>(a.job->constraint);
    metrics_->queue_time(std::chrono::duration<double>(a.admitted - a.job->submitted_at).count());
    a.job->queue_us.store(std::chrono::duration_cast<std::chrono::microseconds>(a.admitted - a.job->submitted_at).count());
    JobEvent started;
    started.kind = JobEvent::Kind::Started;
    started.started_at = now_rfc3339();
    started.seed = a.job->seed;
    started.prompt_tokens = uint32_t(a.job->prompt_tokens.size());
    started.cached_tokens = reuse;
    a.job->push(started);
    metrics_->prompt_tokens(a.job->prompt_tokens.size());
    nlohmann::json fields = {{"job_id", req.job_id}, {"correlation_id", req.correlation_id},
                             {"prompt_tokens", a.job->prompt_tokens.size()}, {"max_tokens", a.job->max_tokens},
                             {"seed", a.job->seed}, {"endpoint", req.origin}, {"cached_tokens", reuse},
                             {"plugin", options_.plugin}, {"plugin_version", options_.plugin_version},
                             {"sampling", {{"temperature", req.sampling.temperature}, {"top_p", req.sampling.top_p},
                                           {"top_k", req.sampling.top_k}, {"min_p", req.sampling.min_p},
                                           {"repetition_penalty", req.sampling.repetition_penalty},
                                           {"presence_penalty", req.sampling.presence_penalty},
                                           {"frequency_penalty", req.sampling.frequency_penalty}}}};
    if (!req.output_mode.empty()) fields["output_mode"] = req.output_mode;
    if (log_settings().log_content) fields["prompt"] = sanitize_utf8(req.prompt);
    log_event(a.job->pooled ? spdlog::level::debug : spdlog::level::info, "execute_start", fields);
}

bool Scheduler::try_admit(Active& a) {
    bool wait = false;
    const std::optional<PrefixCache::Match> match = admission_match(a, wait);
    if (wait) return false;
    const uint32_t reuse = match ? match->n : 0;
    // Blocks for what is left to compute and one for a copied partial
    // block, on top of what the running requests are owed: blocks are taken
    // only when a step runs, so free_blocks() alone would promise the same
    // blocks to every request admitted before the next step.
    const uint32_t need = blocks_for(a.tokens.size() - reuse, limits_.block_tokens) + 1 + owed_blocks();
    // (Sequences never run out: max_running plus the cache's entries fit
    // the engine's max_seqs by construction.)
    const size_t keep = match ? 1 : 0;
    while (cache_ && cache_->size() > keep && engine_->free_blocks() < need) cache_->evict_one();
    if (engine_->free_blocks() < need && !running_.empty()) return false;  // wait for blocks to come back
    // Its timeout runs from here: an engine that hangs in the calls below
    // is abandoned at this deadline like one that hangs in a step.
    if (!a.gen) a.deadline_ns = (Clock::now() + options_.inference_timeout).time_since_epoch().count();
    admitting_ = &a;
    struct Clear {
        Active*& p;
        ~Clear() { p = nullptr; }
    } clear_admitting{admitting_};

    a.seq = match ? engine_->fork(match->seq, match->n) : engine_->create();
    a.in_seq = reuse;
    a.shared_from = match ? match->seq : 0;
    a.shared_tokens = reuse;
    if (match && !a.job->fork_of) {
        stats_.prefix_hits.fetch_add(1);
        stats_.prefix_hit_tokens.fetch_add(match->n);
    }
    try {
        // A fork (a cached prefix, an n > 1 sibling) has its source's
        // adapter, which is this job's: the cache is keyed by it.
        if (a.job->adapter && !match) engine_->set_adapter(a.seq, a.job->adapter);
        if (!a.job->pooled)  // a pooled job samples nothing
            engine_->set_sampling(a.seq, sampling_params(*a.job, options_.repetition_window));
    } catch (...) {
        engine_->release(a.seq);
        a.seq = 0;
        throw;
    }
    // Arrival order, kept through preemption: a request preempted and
    // admitted again is still older than everything admitted after it.
    if (!a.order) a.order = ++next_order_;
    if (!a.gen) first_admission(a, reuse);
    return true;
}

Scheduler::Step Scheduler::build_step() {
    Step st;
    std::vector<std::pair<Active*, Error>> broken;   // their mask could not be computed
    uint32_t budget = limits_.max_step_tokens;
    uint32_t used = 0;  // tokens in the step so far
    // Drafts are this step's only: speculate() fills them for the decoding
    // requests below, and nothing else may carry an older step's.
    for (auto& a : running_) a->spec.step.clear();
    auto add = [&](Active& a, uint32_t k) {
        StepItem it;
        it.seq = a.seq;
        it.tokens = std::span<const int32_t>(a.tokens).subspan(a.in_seq, k);
        it.sample = a.in_seq + k == a.tokens.size();
        if (k == 1 && it.sample && a.spec.step.size() > 1 && a.spec.step[0] == it.tokens[0]) {
            // its next token and the drafts after it
            it.tokens = a.spec.step;
            it.verify = true;
            k = uint32_t(a.spec.step.size());
        }
        if (a.job->pooled) {
            // Its last prompt token's hidden state is its whole output.
            it.hidden = it.sample;
            it.sample = false;
        }
        // The images this chunk holds (build_step keeps each whole), as rows.
        for (const auto& im : a.job->images) {
            const uint32_t s = a.in_seq, b = std::max(im->first, s), e = std::min(im->first + im->count, s + k);
            if (it.verify || b >= e) continue;
            if (im->rows.empty()) {
                try {
                    if (!options_.images) throw Error(Code::Internal, "a job has an image but the server no encoder");
                    im->rows = options_.images->encode(im->pixels, im->width, im->height);
                } catch (const Error& err) {
                    broken.emplace_back(&a, err);
                    return;
                }
                std::vector<float>().swap(im->pixels);
            }
            const uint32_t n_embd = options_.images->info().n_embd;
            // A grid span is the whole image (build_step keeps images whole).
            const bool grid = im->grid_width && b == im->first && e == im->first + im->count;
            const uint32_t flags = options_.images->info().span_flags & (grid ? ~0u : ~uint32_t(EH_SPAN_GRID));
            it.spans.push_back({b - s, e - b, flags, grid ? im->grid_width : 0,
                                im->rows.data() + size_t(b - im->first) * n_embd});
        }
        it.logits = it.sample && a.job->request.top_logprobs >= 0;
        if (it.sample && !a.job->request.sampling.logit_bias.empty()) it.bias = &a.job->request.sampling.logit_bias;
        if (it.sample && a.matcher) {
            const auto t0 = Clock::now();
            try {
                a.mask = a.matcher->mask();
            } catch (const Error& e) {
                stats_.constraint_ns.fetch_add(uint64_t((Clock::now() - t0).count()));
                broken.emplace_back(&a, e);
                return;
            }
            stats_.constraint_ns.fetch_add(uint64_t((Clock::now() - t0).count()));
            it.allowed = a.mask.get();
        }
        st.items.push_back(it);
        st.owners.push_back(&a);
        budget -= std::min(budget, k);
        used += k;
    };
    // Decoding requests first, so prefill never delays a token in flight.
    std::vector<Active*> decoding;
    for (auto& a : running_)
        if (a->gen->tokens_out() > 0 && a->tokens.size() - a->in_seq == 1 &&
            decoding.size() < std::min(budget, limits_.max_step_entries))
            decoding.push_back(a.get());
    speculate(decoding);
    for (Active* a : decoding) add(*a, 1);
    // A step's time grows with its prefill: while requests decode, each of
    // their tokens waits for at most prefill_chunk_tokens of it. The oldest
    // prompt still advances every step, by the whole chunk.
    if (!st.items.empty()) budget = std::min(budget, std::max(1u, options_.prefill_chunk_tokens));
    for (auto& a : running_) {
        if (budget == 0 || st.items.size() >= limits_.max_step_entries) break;
        if (std::find(st.owners.begin(), st.owners.end(), a.get()) != st.owners.end()) continue;
        const uint32_t left = uint32_t(a->tokens.size() - a->in_seq);
        if (left == 0) continue;
        uint32_t k = std::min(left, budget);
        // An image's tokens attend to each other: the chunk stops before an
        // image it cannot hold whole, or takes the whole image past the
        // chunk budget when the step has room for it.
        for (const auto& im : a->job->images) {
            const uint32_t s = a->in_seq, f = im->first, e = im->first + im->count;
            if (s + k <= f || s >= e || s + k >= e) continue;
            k = f > s ? f - s : (e - s <= limits_.max_step_tokens - used ? e - s : 0);
        }
        if (k == 0) continue;
        add(*a, k);
    }
    for (auto& [ptr, err] : broken)
        for (auto& a : running_)
            if (a.get() == ptr) fail(std::move(a), err);
    std::erase(running_, nullptr);
    return st;
}

void Scheduler::speculate(const std::vector<Active*>& decoding) {
    for (Active* a : decoding) a->spec.step.clear();
    if (!spec_ || decoding.empty()) return;
    if (!spec_->on_for(decoding.size())) {
        stats_.spec_off_steps.fetch_add(1);
        return;
    }
    // The step's budget, shared: every decoding request has its token, a
    // prompt being prefilled keeps room for its chunk (at most half of what
    // is left), and the drafts together stay within max_step_entries (ABI 1.6).
    const size_t n = decoding.size();
    const bool prefilling = running_.size() > n;
    const size_t reserve = prefilling ? std::min<size_t>(options_.prefill_chunk_tokens, (limits_.max_step_tokens - n) / 2) : 0;
    const uint32_t share = uint32_t(std::min((limits_.max_step_tokens - n - reserve) / n, limits_.max_step_entries / n));
    std::vector<Speculator::Ask> asks;
    for (Active* a : decoding) {
        // A grammar's mask and logprobs' logits are per position; neither rides a verify.
        if (a->matcher || a->job->pooled || a->job->request.top_logprobs >= 0) continue;
        // A verify emits up to k + 1 tokens and leaves the sequence at most
        // tokens.size() + k long.
        const uint64_t out_left = a->job->max_tokens > a->gen->tokens_out() ? a->job->max_tokens - a->gen->tokens_out() : 0;
        const uint64_t room = limits_.max_seq_tokens > a->tokens.size() ? limits_.max_seq_tokens - a->tokens.size() : 0;
        const uint32_t cap = uint32_t(std::min<uint64_t>({share, out_left > 0 ? out_left - 1 : 0, room}));
        if (cap) asks.push_back({&a->spec, a->tokens, cap});
    }
    const auto t0 = Clock::now();
    spec_->draft(asks);
    stats_.spec_draft_ns.fetch_add(uint64_t((Clock::now() - t0).count()));
}

bool Scheduler::drop_drafts(Step& st) {
    bool any = false;
    for (size_t i = 0; i < st.items.size(); ++i) {
        StepItem& it = st.items[i];
        if (!it.verify) continue;
        it.verify = false;
        it.tokens = it.tokens.first(1);
        st.owners[i]->spec.step.resize(1);
        any = true;
    }
    return any;
}

bool Scheduler::may_chain_after(const Step& st) {
    if (!options_.chained_steps || !engine_->can_chain() || st.owners.size() != running_.size()) return false;
    // Speculation needs each step's tokens before the next step's drafts,
    // while the next step would draft: its decoders (every item samples, see
    // below) are few enough and one of them may draft (not paused, no
    // grammar, no logprobs).
    if (spec_ && !spec_->off() && spec_->on_for(st.items.size()))
        for (const Active* a : st.owners)
            if (!a->spec.pause && !a->matcher && a->job->request.top_logprobs < 0 && !a->job->pooled) return false;
    {
        // A request that could be admitted now goes first.
        std::lock_guard lock(mu_);
        if (!waiting_.empty() && running_.size() < max_running_) return false;
    }
    const int64_t now = now_ns();
    for (size_t i = 0; i < st.items.size(); ++i) {
        const StepItem& it = st.items[i];
        Active& a = *st.owners[i];
        // The next step would append the token this one samples: every
        // request must still want one after it, need nothing the host
        // computes from that token (a grammar's mask) and no logits.
        if (!it.sample || it.logits || it.verify || a.matcher || a.gen->done() || must_stop(a, now)) return false;
        if (a.gen->tokens_out() + 1 >= a.job->max_tokens) return false;
        if (uint64_t(a.in_seq) + item_tokens(it) + 1 > limits_.max_seq_tokens) return false;
    }
    return true;
}

void Scheduler::run_step() {
    Step st = build_step();
    if (st.items.empty()) return;
    const std::vector<Active*> owners = st.owners;  // every later step of a chain runs a subset
    try {
        if (may_chain_after(st)) run_chain(st);
        else run_alone(st);
    } catch (const Error& e) {
        broken_.clear();
        if (e.code() == Code::EngineCrashed) {
            engine_lost(e);
            return;
        }
        // The step's sequences are unusable now; their requests end here.
        for (auto& a : running_)
            if (a && std::find(owners.begin(), owners.end(), a.get()) != owners.end()) fail(std::move(a), e);
        std::erase(running_, nullptr);
    }
}

void Scheduler::run_alone(Step& st) {
    // Out of blocks with drafts aboard: the same step without them first.
    if (!timed([&] { return engine_->step(st.items); }) &&
        !(drop_drafts(st) && timed([&] { return engine_->step(st.items); }))) {
        handle_kv_full();
        return;
    }
    accept_tokens(st);
    settle();
}

void Scheduler::run_chain(Step& st) {
    // Step N+1 starts before N's tokens are read: the engine takes each
    // token on its own, and the host streams N's tokens while N+1 runs.
    // A request that ends at N (EOS, a stop string) had its N+1 token
    // computed for nothing; its sequence is cut back after N+1 ends.
    if (!timed([&] { return engine_->begin_step(st.items); })) {
        handle_kv_full();
        return;
    }
    size_t flying = 1;  // steps begun and not ended
    auto end = [&](Step& x) {
        timed([&] {
            engine_->end_step(x.items);
            return true;
        });
        --flying;
        accept_tokens(x);
    };
    try {
        for (;;) {
            std::optional<Step> next;
            if (may_chain_after(st)) {
                next.emplace();
                for (Active* a : st.owners) {
                    if (a->spec.pause) --a->spec.pause;  // a chained step counts against its pause
                    StepItem it;
                    it.seq = a->seq;
                    it.chained = true;
                    it.sample = true;
                    if (!a->job->request.sampling.logit_bias.empty()) it.bias = &a->job->request.sampling.logit_bias;
                    next->items.push_back(it);
                    next->owners.push_back(a);
                }
                if (timed([&] { return engine_->begin_step(next->items); })) ++flying;
                else next.reset();  // KV full: the chain ends here
            }
            end(st);
            publish();  // a chain can run a whole answer: /health and /metrics follow it
            if (!next) break;
            // A request that ended here gets its answer now; its sequence is
            // settled once the step in flight is read.
            for (Active* a : next->owners)
                if (a->gen->done() && !a->answered) answer(*a);
            st = std::move(*next);
            bool ended = false;
            for (Active* a : st.owners) ended = ended || a->gen->done();
            if (ended) {
                end(st);
                break;
            }
        }
    } catch (...) {
        // The engine holds no step of ours afterwards (its sequences are
        // released next): end what is still in flight, whatever it says,
        // unless the engine itself is gone. Every step of a chain has one
        // item per running request.
        bool crashed = false;
        try {
            throw;
        } catch (const Error& e) {
            crashed = e.code() == Code::EngineCrashed;
        } catch (...) {
        }
        std::vector<StepItem> scratch(st.items.size());
        if (!crashed)
            for (; flying > 0; --flying) {
                try {
                    engine_->end_step(scratch);
                } catch (const std::exception&) {
                }
            }
        throw;
    }
    settle();
}

template <class F>
bool Scheduler::timed(F&& engine_call) {
    const auto t0 = Clock::now();
    const bool ok = engine_call();
    stats_.engine_step_ns.fetch_add(uint64_t((Clock::now() - t0).count()));
    return ok;
}

void Scheduler::accept_tokens(Step& st) {
    stats_.engine_steps.fetch_add(1);
    hold_admission_ = false;
    if (st.items.size() > 0 && st.items[0].chained) stats_.chained_steps.fetch_add(1);
    for (size_t i = 0; i < st.items.size(); ++i) {
        Active& a = *st.owners[i];
        if (st.items[i].chained && a.gen->done()) {
            // It ended at the step before: the token this one appended goes.
            engine_->truncate(a.seq, a.in_seq);
            continue;
        }
        if (st.items[i].verify) {
            accept_verified(a, st.items[i]);
            continue;
        }
        a.in_seq += item_tokens(st.items[i]);
        if (st.items[i].hidden) {
            const auto h = engine_->hidden(a.seq);
            if (h.empty()) {
                broken_.emplace_back(&a, Error(Code::Internal, "the engine kept no hidden state for the step that asked"));
                continue;
            }
            a.hidden.assign(h.begin(), h.end());
            a.gen->end("pooled");
            continue;
        }
        if (!st.items[i].sample) continue;
        const int32_t tok = st.items[i].token;
        bool complete_now = false;
        if (a.matcher) {
            const auto t0 = Clock::now();
            struct Timed {
                std::atomic<uint64_t>& ns;
                Clock::time_point t0;
                ~Timed() { ns.fetch_add(uint64_t((Clock::now() - t0).count())); }
            } timed{stats_.constraint_ns, t0};
            try {
                if (!a.matcher->accept(tok)) {
                    broken_.emplace_back(&a, Error(Code::Internal, "the engine sampled a token outside the allowed-token mask"));
                    continue;
                }
                complete_now = a.matcher->complete();
            } catch (const Error& e) {
                broken_.emplace_back(&a, e);
                continue;
            }
        }
        const auto lg = st.items[i].logits ? engine_->logits(a.seq) : std::span<const float>();
        if (!a.gen->accept(tok, lg)) {
            a.tokens.push_back(tok);
            if (complete_now) a.gen->end("grammar");
        }
    }
}

void Scheduler::accept_verified(Active& a, const StepItem& it) {
    const uint32_t m = it.n_accepted;
    stats_.spec_drafts.fetch_add(1);
    stats_.spec_draft_tokens.fetch_add(it.tokens.size() - 1);
    spec_->verified(a.spec, m);
    a.in_seq += 1;  // t; the engine kept d1..dm after it
    for (uint32_t j = 1; j <= m; ++j) {
        // Counted as the request takes them: drafts after its end are not output.
        stats_.spec_accepted_tokens.fetch_add(1);
        if (a.gen->accept(it.tokens[j], {})) {
            // It ended at an accepted draft (a stop, max_tokens): the
            // drafts after that one leave its sequence.
            engine_->truncate(a.seq, a.in_seq);
            return;
        }
        a.tokens.push_back(it.tokens[j]);
        ++a.in_seq;
    }
    if (!a.gen->accept(it.token, {})) a.tokens.push_back(it.token);
}

void Scheduler::settle() {
    for (auto& [ptr, err] : broken_)
        for (auto& a : running_)
            if (a.get() == ptr) fail(std::move(a), err);
    broken_.clear();
    for (auto& a : running_)
        if (a && a->gen->done()) complete(std::move(a));
    std::erase(running_, nullptr);
}

void Scheduler::handle_kv_full() {
    if (cache_ && cache_->evict_one()) return;
    // The newest request gives its blocks back and is recomputed later.
    auto newest = std::max_element(running_.begin(), running_.end(),
                                   [](const ActivePtr& x, const ActivePtr& y) { return x->order < y->order; });
    if (running_.size() <= 1) {
        // By construction one sequence of the full context fits the pool.
        fail(std::move(*newest), Error(Code::VramOom, "the KV cache cannot hold this request's sequence"));
        std::erase(running_, nullptr);
        return;
    }
    ActivePtr a = std::move(*newest);
    std::erase(running_, nullptr);
    hold_admission_ = true;
    a->spec.step.clear();
    engine_->release(a->seq);
    a->seq = 0;
    a->in_seq = 0;
    stats_.preemptions.fetch_add(1);
    log_event(spdlog::level::info, "preempted", {{"job_id", a->job->request.job_id},
                                                {"correlation_id", a->job->request.correlation_id},
                                                {"recompute_tokens", a->tokens.size()}});
    std::lock_guard lock(mu_);
    waiting_.push_front(std::move(a));
    stats_.waiting = uint32_t(waiting_.size());
}

bool Scheduler::stopping() const {
    std::lock_guard lock(mu_);
    return stopping_;
}

void Scheduler::engine_lost(const Error& why) {
    // Before any request hears of the crash: a client that asks /health
    // next sees the restart.
    stats_.engine_state = int(EngineState::Restarting);
    const int64_t now = now_ns();
    for (auto& a : running_) {
        if (!a) continue;
        must_stop(*a, now);  // one past its deadline (why a hung engine was killed) ends as a timeout
        a->seq = 0;  // died with the engine: nothing to release
        fail(std::move(a), why);
    }
    running_.clear();
    if (cache_) cache_->forget_all();
    publish();
    try {
        engine_->restart([this] { return stopping(); });
        publish();  // the new process's id before /health says ready
        stats_.engine_restarts.fetch_add(1);
        stats_.engine_state = int(EngineState::Ready);
        return;
    } catch (const Error& e) {
        if (stopping()) return;  // shutdown() ends the waiting jobs
        stats_.engine_state = int(EngineState::Failed);
        log_event(spdlog::level::critical, "engine_failed", {{"code", code_name(Code::EngineCrashed)}, {"message", e.what()}});
        std::deque<ActivePtr> waiting;
        {
            std::lock_guard lock(mu_);
            engine_failed_ = e.what();
            waiting.swap(waiting_);
            stats_.waiting = 0;
        }
        for (auto& a : waiting) {
            finish(a->job, error_event(Code::EngineCrashed, e.what(), false));
            forget(*a->job);
        }
    }
}

void Scheduler::complete(ActivePtr a) {
    if (spec_) spec_->forget(a->spec);
    const SeqId seq = std::exchange(a->seq, 0);
    if (cache_)
        cache_->insert(cache_scope(*a->job), a->job->adapter, seq,
                       cache_key(*a->job, std::span<const int32_t>(a->tokens).first(a->in_seq)));
    else engine_->release(seq);
    if (!a->answered) answer(*a);
}

void Scheduler::answer(Active& a) {
    JobEvent end = a.gen->end_event(a.admitted);
    end.hidden = std::move(a.hidden);
    finish(a.job, end);
    forget(*a.job);
    a.answered = true;
}

void Scheduler::fail(ActivePtr a, const Error& e) {
    if (spec_) spec_->forget(a->spec);
    if (a->seq) engine_->release(std::exchange(a->seq, 0));
    if (a->answered) return;  // its answer went out whole before this
    finish(a->job, stopped_event(*a->job, e, options_.inference_timeout));
    forget(*a->job);
}

void Scheduler::shutdown() {
    std::call_once(shutdown_once_, [&] {
        std::deque<ActivePtr> waiting;
        {
            std::lock_guard lock(mu_);
            stopping_ = true;
            waiting.swap(waiting_);
            stats_.waiting = 0;
        }
        cv_.notify_all();
        for (auto& a : waiting) {
            a->job->cancel(CancelReason::Shutdown);
            finish(a->job, error_event(Code::ShuttingDown, "the server is shutting down; the job was not started", true));
            forget(*a->job);
        }
        // Running jobs get the grace period, then are cancelled.
        std::vector<std::shared_ptr<Job>> running;
        {
            std::lock_guard lock(mu_);
            for (auto& [id, job] : live_) running.push_back(job);
        }
        const auto until = Clock::now() + options_.shutdown_grace;
        for (auto& j : running)
            while (!j->terminated() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        for (auto& j : running)
            if (!j->terminated()) j->cancel(CancelReason::Shutdown);
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    });
}

}  // namespace eh::service
