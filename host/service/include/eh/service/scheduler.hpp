// Continuous batching. One thread owns the engine and, every step:
//   1. ends requests that were cancelled or ran past their deadline;
//   2. admits waiting requests in arrival order while sequences and KV
//      blocks allow (forking a cached prefix when one matches): a request
//      needs the blocks of what it has left to compute on top of the blocks
//      the running requests are owed (see owed_blocks());
//   3. builds one step under the token budget: every decoding request's
//      next token first, then prefill chunks, oldest request first; while
//      any request decodes, at most prefill_chunk_tokens of prefill (so a
//      decode step waits behind a bounded chunk, never a whole budget of
//      prompt), with none decoding the whole budget;
//   4. runs it; on KV_FULL evicts cached prefixes, then preempts the newest
//      request (its blocks are freed and it is recomputed later), and tries
//      again, admitting nobody until a step has run; otherwise hands each
//      sampled token to its request.
// Progress: the oldest running request is in every step and is never
// preempted while a younger one runs (a preempted request keeps its arrival
// order), and a step that finds the pool full is retried with fewer
// requests before any is admitted, so every step that runs gives the
// oldest request a token or a prefill chunk. One sequence of the full
// context always fits the pool (kv_init grants that), so the retries end.
// When the engine reports Error(EngineCrashed) (its process died or hung),
// every sequence is gone: each running request ends with that error, the
// prefix cache is emptied without releasing anything, and the engine is
// restarted while waiting requests stay queued (engine_lost()). While it has
// nothing to run it asks the engine every 200 ms whether its process still
// runs (check_alive()), so a death between requests is restarted at once.
// A request with an output constraint samples under its matcher's
// allowed-token mask, advances the matcher with each token, and ends
// ("grammar") as soon as its output is complete.
// A request joins or leaves the batch between any two steps.
// Speculative decoding (speculation.hpp), where configured and the engine
// verifies: while at most --spec-max-batch requests decode, each decoding
// request's item carries its drafts ([t, d1..dk], verified in the step);
// the accepted drafts and the token after them are its output, in order.
// Steps are not chained while it drafts (the next drafts need this step's
// tokens), but are while every decoding request's drafting is paused. A
// step that finds the pool full is first retried without drafts.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "eh/service/generation.hpp"
#include "eh/service/image_encoder.hpp"
#include "eh/service/job.hpp"
#include "eh/service/kv_events.hpp"
#include "eh/service/metrics.hpp"
#include "eh/service/prefix_cache.hpp"
#include "eh/service/seq_engine.hpp"
#include "eh/service/speculation.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::service {

struct SchedulerOptions {
    uint32_t max_running = 64;          // sequences decoding at once (--parallel)
    size_t queue_capacity = 256;        // requests waiting to start
    bool prefix_cache = true;
    // Reuse prefixes across API keys (single tenant); by default a request
    // reuses only what requests of its own cache_scope computed.
    bool prefix_cache_shared = false;
    bool chained_steps = true;          // begin step N+1 before reading N where the engine can
    // Prefill tokens a step may hold while requests decode (--prefill-chunk-tokens);
    // with none decoding, prefill may fill the step. At least 1.
    uint32_t prefill_chunk_tokens = 512;
    std::chrono::milliseconds inference_timeout{300000};
    std::chrono::milliseconds shutdown_grace{5000};
    int repetition_window = 64;
    std::string plugin, plugin_version;  // the engine's, for each job's execute_start log line
    // KV events of the prefix cache (kv_events.hpp): where they go (none:
    // off), the tokens per announced block (0: the engine's block) and the
    // hash chain's seed.
    std::shared_ptr<KvEventSink> kv_events;
    uint32_t kv_events_block_tokens = 0;
    std::string kv_events_hash_seed;
    // Speculative decoding (source Off: none).
    SpecOptions spec;
    // Images in: the encoder that turns a job's images into rows.
    std::shared_ptr<const ImageEncoder> images;
    // The prefix cache's host tier (--kv-host-bytes; 0: off): bytes of host
    // memory evicted prefixes may be parked in (prefix_cache.hpp).
    uint64_t kv_host_bytes = 0;
};

enum class EngineState : int {
    Ready,        // serving
    Restarting,   // its process died; being started again, requests queue
    Failed,       // it crashed too often; not restarted, requests refused
};
const char* engine_state_name(EngineState s);

// Read by /health and /metrics from any thread.
struct SchedulerStats {
    std::atomic<int> engine_state{int(EngineState::Ready)};
    std::atomic<uint32_t> engine_restarts{0};
    std::atomic<int64_t> engine_pid{0};     // 0: in this process
    std::atomic<uint32_t> running{0}, waiting{0};
    std::atomic<uint32_t> kv_total_blocks{0}, kv_free_blocks{0}, prefix_entries{0};
    // Blocks the running requests hold (running_blocks()).
    std::atomic<uint32_t> kv_running_blocks{0};
    std::atomic<uint64_t> prefix_lookups{0}, prefix_hits{0}, prefix_query_tokens{0}, prefix_hit_tokens{0};
    std::atomic<uint64_t> preemptions{0}, steps{0};
    // Where a step's time goes: the engine's step call, and the host's
    // output-constraint work (token masks and matcher updates) around it.
    std::atomic<uint64_t> engine_steps{0}, engine_step_ns{0}, constraint_ns{0};
    // Steps begun before the step ahead of them was read (ABI 1.3 halves).
    std::atomic<uint64_t> chained_steps{0};
    // Speculative decoding: verify items, the drafts they carried and those
    // accepted; steps it sat out because more than --spec-max-batch decoded;
    // time spent drafting (a draft model's steps).
    std::atomic<uint64_t> spec_drafts{0}, spec_draft_tokens{0}, spec_accepted_tokens{0}, spec_off_steps{0};
    std::atomic<uint64_t> spec_draft_ns{0};
    // LoRA adapters (1-based id i is bit i - 1; kMaxAdapters is 64) of the
    // waiting requests, as of the last loop.
    std::atomic<uint64_t> waiting_adapters{0};
    // The prefix cache's host tier (budget 0: off).
    HostTierStats host_tier;
};

// The queue is full: 503 with Retry-After.
class QueueFullError : public Error {
public:
    QueueFullError(const std::string& msg, uint32_t retry_after_ms)
        : Error(Code::QueueFull, msg), retry_after_ms_(retry_after_ms) {}
    uint32_t retry_after_ms() const { return retry_after_ms_; }

private:
    uint32_t retry_after_ms_;
};

class Scheduler {
public:
    Scheduler(std::unique_ptr<SeqEngine> engine, std::shared_ptr<const TextCodec> codec,
              std::shared_ptr<Metrics> metrics, SchedulerOptions options);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Queues a validated job. Throws QueueFullError, Error(ShuttingDown) or
    // RequestError (a job_id already queued or running).
    void enqueue(std::shared_ptr<Job> job) { enqueue_all({std::move(job)}); }
    // Several jobs at once (n > 1 samples): all are queued, adjacent and
    // before the scheduler looks at any of them, or none is.
    // The queue's capacity counts requests: a job marked same_request
    // counts with the one before it (the inputs of one embeddings request).
    void enqueue_all(std::vector<std::shared_ptr<Job>> jobs);
    // "cancelling" (running), "cancelled" (was waiting), "finished", "unknown".
    // The job of that id submitted by `owner` (NULL: by the owner ""; the
    // HTTP layer's OpenAI and Anthropic jobs and the CLI's); anyone else's is
    // "unknown" and untouched.
    std::string cancel(const std::string& job_id, CancelReason why, const std::string* owner = nullptr);
    // Fails waiting jobs with SHUTTING_DOWN, gives running ones the grace
    // period, then cancels them, and joins the thread. Idempotent.
    void shutdown();

    const SchedulerStats& stats() const { return stats_; }
    const SeqLimits& limits() const { return limits_; }
    uint32_t max_running() const { return max_running_; }
    // Speculative decoding as it runs: its source ("off", "ngram",
    // "draft_model") and, when off although asked for, why.
    // Why --kv-host-bytes was given and the host tier is off ("": it is on, or was not asked).
    const std::string& host_tier_off_reason() const { return host_tier_off_reason_; }
    const char* speculation() const { return spec_ && !spec_->off() ? spec_source_name(spec_->source()) : "off"; }
    const std::string& speculation_off_reason() const {
        return spec_ && spec_->off() ? spec_->off_reason() : spec_off_reason_;
    }

private:
    struct Active {
        std::shared_ptr<Job> job;
        SeqId seq = 0;                  // 0: holds no sequence (waiting)
        std::vector<int32_t> tokens;    // prompt, then every sampled token
        uint32_t in_seq = 0;            // tokens[0, in_seq) are in the sequence
        // The sequence it was forked from at admission and the tokens it
        // shares with it (0, 0: created empty).
        SeqId shared_from = 0;
        uint32_t shared_tokens = 0;
        std::unique_ptr<Generation> gen;
        std::chrono::steady_clock::time_point admitted;
        int64_t deadline_ns = 0;
        uint64_t order = 0;             // first admission's order, kept when preempted; the newest is preempted first
        // Constrained output: the request's place in its grammar, and the
        // allowed-token mask of the step in flight (kept alive here).
        std::unique_ptr<constrain::Matcher> matcher;
        std::shared_ptr<const constrain::Mask> mask;
        // Its terminal event went out while a chained step still held its
        // sequence (settled after that step).
        bool answered = false;
        // A pooled job's hidden state, once its last prompt token is in.
        std::vector<float> hidden;
        SpecState spec;                 // its drafts (speculative decoding)
    };
    using ActivePtr = std::unique_ptr<Active>;

    void loop();
    // Cancelled, or past its deadline (then cancelled here as a timeout).
    static bool must_stop(Active& a, int64_t now_ns);
    void reap();
    void admit();
    bool try_admit(Active& a);
    // try_admit's steps. The prefix `a` forks from: an n > 1 sibling's
    // prompt, a running request's shared prefix or the prefix cache's
    // entry, the longest; nothing, with `wait` set, while a running request
    // is still computing it.
    std::optional<PrefixCache::Match> admission_match(const Active& a, bool& wait);
    // A running request (same scope and adapter, no images) whose tokens
    // share a block or more with a's, as far as they are in its sequence.
    std::optional<PrefixCache::Match> running_prefix(const Active& a, bool& wait) const;
    // A's first admission (a preempted job keeps its output state): its
    // timing, its Started event and its execute_start log line.
    void first_admission(Active& a, uint32_t reuse);
    // One step's items and the request of each.
    struct Step {
        std::vector<StepItem> items;
        std::vector<Active*> owners;
    };
    // Blocks the running requests will take before their next token is
    // sampled (at least one each), which admission keeps free for them.
    uint32_t owed_blocks() const;
    void run_step();
    // Every decoding request's next token, then prefill chunks (at most
    // prefill_chunk_tokens of them when the step holds a decode).
    Step build_step();
    // Drafts for the decoding requests that may take them (a->spec.step).
    void speculate(const std::vector<Active*>& decoding);
    // A step's KV was full: its verify items lose their drafts. False when it had none.
    static bool drop_drafts(Step& st);
    // A verify item's accepted drafts and its token, to its request.
    void accept_verified(Active& a, const StepItem& it);
    // Whether the next step may start before this one's tokens are read: the
    // engine can, the step holds every running request, each samples and
    // will want another token, none has a grammar or asks logits, and no
    // waiting request could be admitted.
    bool may_chain_after(const Step& st);
    static uint32_t item_tokens(const StepItem& it) { return it.chained ? 1u : uint32_t(it.tokens.size()); }
    void run_alone(Step& st);
    // Steps in two halves, each begun before the one before it is read,
    // for as long as may_chain_after() holds.
    void run_chain(Step& st);
    // The engine call, its time added to stats_.engine_step_ns.
    template <class F>
    bool timed(F&& engine_call);
    // A finished step's tokens to their requests (a chained item of a
    // request that already ended cuts its sequence back instead).
    void accept_tokens(Step& st);
    // Ends the requests that failed or finished.
    void settle();
    void handle_kv_full();
    // Every sequence died with the engine: end the running requests with
    // `why`, forget the cached prefixes, restart it (or give up).
    void engine_lost(const Error& why);
    bool stopping() const;
    void complete(ActivePtr a);
    // The terminal event of a request whose output is complete.
    void answer(Active& a);
    void fail(ActivePtr a, const Error& e);
    void finish(const std::shared_ptr<Job>& job, const JobEvent& terminal);
    void forget(const Job& job);
    // The prefix-cache scope a job's sequences are looked up and kept in.
    const std::string& cache_scope(const Job& job) const;
    // Job ids are the submitter's own: the same id from two submitters is
    // two jobs, and neither learns of the other's (a collision's 400, a
    // cancel's answer).
    static std::string live_key(const std::string& owner, const std::string& job_id);
    void publish();
    // Blocks the running requests hold: each one's own blocks, plus once per
    // cached sequence they were forked from the full blocks they share with
    // it. An estimate from above (cached sequences that share blocks with
    // each other count them twice), capped at the blocks in use.
    uint32_t running_blocks() const;

    std::unique_ptr<SeqEngine> engine_;
    std::shared_ptr<const TextCodec> codec_;
    std::shared_ptr<Metrics> metrics_;
    SchedulerOptions options_;
    SeqLimits limits_;
    uint32_t max_running_;
    std::unique_ptr<PrefixCache> cache_;
    std::unique_ptr<Speculator> spec_;
    std::string spec_off_reason_;
    std::string host_tier_off_reason_;
    SchedulerStats stats_;

    // The scheduler thread's own.
    std::vector<ActivePtr> running_;
    std::vector<std::pair<Active*, Error>> broken_;   // failed while their step was accepted
    uint64_t next_order_ = 0;
    bool hold_admission_ = false;     // a preemption since the last step that ran
    Active* admitting_ = nullptr;     // in try_admit's engine calls (the overdue check sees it)

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<ActivePtr> waiting_;
    std::unordered_map<std::string, std::shared_ptr<Job>> live_;  // waiting or running, by live_key
    std::deque<std::string> recent_;                              // ended live_keys, for idempotent cancel
    bool stopping_ = false;
    std::string engine_failed_;   // why the engine stays down (EngineState::Failed)
    std::once_flag shutdown_once_;
    std::thread thread_;
};

}  // namespace eh::service
