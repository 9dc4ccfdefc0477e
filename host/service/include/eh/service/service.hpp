// The service: one model behind a continuous-batching scheduler. The HTTP
// layer submits validated requests and reads each job's events; cancel and
// the status accessors never wait for the engine.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "eh/loader/engine.hpp"
#include "eh/service/constraint_cache.hpp"
#include "eh/service/engine_source.hpp"
#include "eh/service/image_encoder.hpp"
#include "eh/service/job.hpp"
#include "eh/service/metrics.hpp"
#include "eh/service/pooling.hpp"
#include "eh/service/request.hpp"
#include "eh/service/scheduler.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::service {

struct ServiceOptions {
    uint32_t n_ctx = 0;                 // tokens per sequence; 0: the model's context length
    size_t queue_capacity = 256;        // requests waiting to start (running ones not counted)
    uint32_t max_running = 64;          // sequences in the batch at once (--parallel)
    uint32_t max_step_tokens = 2048;    // tokens per forward step: decodes plus prefill chunks
    uint32_t prefill_chunk_tokens = 512;  // SchedulerOptions::prefill_chunk_tokens
    uint64_t kv_budget_bytes = 0;       // KV-cache pool; 0: kv_memory_fraction
    float kv_memory_fraction = 0;       // of free memory after the weights; 0: the plugin's default
    uint32_t kv_type = 0;               // KvBudget::kv_type: 0 the plugin's default, else an eh_tensor_type
    bool prefix_cache = true;
    bool prefix_cache_shared = false;  // SchedulerOptions::prefix_cache_shared
    uint64_t kv_host_bytes = 0;         // SchedulerOptions::kv_host_bytes (--kv-host-bytes)
    bool chained_steps = true;          // step N+1 begun before N is read, where the engine can
    std::chrono::milliseconds inference_timeout{300000};
    std::chrono::milliseconds shutdown_grace{5000};
    RequestLimits limits;
    std::string model_name;
    int repetition_window = 64;
    // SchedulerOptions::kv_events and its settings.
    std::shared_ptr<KvEventSink> kv_events;
    uint32_t kv_events_block_tokens = 0;
    std::string kv_events_hash_seed;
    // Embedding or rerank serving: the only jobs it runs are pooled ones
    // (submit_pooled), and the engine must hand out hidden states.
    PoolingSpec pooling;
    // The LoRA adapters' names, in the order the engine was given them: a
    // request's `adapter` picks one (AdapterNotFound otherwise).
    std::vector<std::string> adapters;
    // Speculative decoding (source Off: none); with DraftModel, `draft` is
    // the draft model (the same vocabulary as the served one), whose own KV
    // cache is sized here like the served model's.
    SpecOptions spec;
    std::shared_ptr<EngineSource> draft;
    // Images in (--mmproj): the model's loaded image encoder, or none.
    std::shared_ptr<const ImageEncoder> images;
};


class Service {
public:
    // Sizes the KV cache (kv_init for batched plugins) and starts the
    // scheduler. Throws eh::Error (e.g. INSUFFICIENT_VRAM).
    Service(std::shared_ptr<EngineSource> engine, std::shared_ptr<const TextCodec> codec, ServiceOptions options,
            std::shared_ptr<Metrics> metrics = nullptr);
    // A model loaded in this process.
    Service(std::shared_ptr<EngineModel> model, std::shared_ptr<const TextCodec> codec, ServiceOptions options,
            std::shared_ptr<Metrics> metrics = nullptr)
        : Service(local_engine(std::move(model)), std::move(codec), std::move(options), std::move(metrics)) {}
    ~Service();
    Service(const Service&) = delete;
    Service& operator=(const Service&) = delete;

    // Tokenizes, checks the request against the context and queues it.
    // Throws RequestError (400), QueueFullError or Error(ShuttingDown) (503).
    std::shared_ptr<Job> submit(GenerationRequest request);
    // `n` samples of one prompt (OpenAI's `n`): jobs "<job_id>", "<job_id>.1",
    // ..., seeds seed, seed+1, ...; the prompt's KV is computed once where the
    // engine can fork sequences. All are queued or none is. 1 <= n <= kMaxN.
    static constexpr uint32_t kMaxN = 16;
    std::vector<std::shared_ptr<Job>> submit_n(GenerationRequest request, uint32_t n);
    // Inputs of one embeddings or rerank request (`mode`, which must be the
    // server's), each a pooled job "<meta.job_id>.<i>" with meta's ids and
    // labels; all are queued, adjacent and as one request against the
    // queue's capacity, or none is. RequestError naming `field` (400) for a
    // request over the limits (kMaxPooledInputs, kMaxPooledTokens, the
    // context) or to a server in another mode.
    std::vector<std::shared_ptr<Job>> submit_pooled(const GenerationRequest& meta, std::vector<PooledInput> inputs,
                                                    PoolingMode mode, const std::string& field);
    const PoolingSpec& pooling() const { return options_.pooling; }

    // "cancelling" (running), "cancelled" (was waiting), "finished",
    // "unknown". Takes effect within one step. With `owner`, only a job
    // whose request.owner is the same is touched; a live job of anyone else
    // is "unknown" (a client cannot end, or see running, another's job; an
    // id that has ended answers "finished" to anyone).
    std::string cancel(const std::string& job_id, CancelReason why = CancelReason::Client,
                       const std::string* owner = nullptr);

    // Stops accepting, fails waiting jobs with SHUTTING_DOWN, lets running
    // jobs finish within the grace period (then cancels them). Idempotent.
    void shutdown();
    bool shutting_down() const { return stopping_.load(); }

    size_t queue_depth() const { return scheduler_->stats().waiting.load(); }
    size_t active_jobs() const { return scheduler_->stats().running.load(); }
    uint32_t n_ctx() const { return n_ctx_; }
    uint64_t device_bytes_used() const { return device_bytes_; }
    uint64_t model_device_bytes() const { return model_device_bytes_; }  // before the KV cache
    uint64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }  // 0: the plugin does not say
    uint64_t kv_cache_bytes() const;
    bool batched() const { return scheduler_->limits().batched; }
    uint32_t max_running() const { return scheduler_->max_running(); }
    uint32_t prefill_chunk_tokens() const { return options_.prefill_chunk_tokens; }
    const SeqLimits& kv_limits() const { return scheduler_->limits(); }
    const SchedulerStats& stats() const { return scheduler_->stats(); }
    // Speculative decoding as it runs ("off", "ngram", "draft_model") and,
    // when off although asked for, why.
    const char* speculation() const { return scheduler_->speculation(); }
    const std::string& speculation_off_reason() const { return scheduler_->speculation_off_reason(); }
    const std::string& host_tier_off_reason() const { return scheduler_->host_tier_off_reason(); }
    // The scheduler's gauges and counters for /metrics.
    void fill_gauges(Gauges& g) const;
    const TextCodec& codec() const { return *codec_; }
    // The prompt's tokens as a job would hold them (its images expanded into
    // the model's image tokens); RequestError as submit() would throw.
    std::vector<int32_t> prompt_tokens(const GenerationRequest& req) const;
    const ServiceOptions& options() const { return options_; }
    const std::shared_ptr<EngineSource>& engine() const { return engine_; }
    // Ready, or restarting / failed after its process died (remote_engine.hpp).
    EngineState engine_state() const { return EngineState(scheduler_->stats().engine_state.load()); }
    Metrics& metrics() { return *metrics_; }

private:
    std::shared_ptr<Job> prepare(GenerationRequest request);

    std::shared_ptr<EngineSource> engine_;
    std::shared_ptr<const TextCodec> codec_;
    ServiceOptions options_;
    std::shared_ptr<Metrics> metrics_;
    uint32_t n_ctx_ = 0;
    uint32_t trained_ctx_ = 0;
    uint64_t model_device_bytes_ = 0;
    uint64_t device_bytes_ = 0;
    uint64_t kv_bytes_per_token_ = 0;
    bool has_logits_ = false;
    std::unique_ptr<Scheduler> scheduler_;
    std::unique_ptr<ConstraintCache> constraints_;
    std::atomic<bool> stopping_{false};
};

}  // namespace eh::service
