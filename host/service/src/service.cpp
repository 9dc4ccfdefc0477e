#include "eh/service/service.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "eh/service/image_prompt.hpp"
#include "eh/service/kv_cache_type.hpp"
#include "eh/service/lora.hpp"
#include "eh/service/utf8.hpp"

namespace eh::service {
namespace {

uint64_t random_seed() {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}()};
    std::lock_guard lock(mu);
    return rng();
}

}  // namespace

Service::Service(std::shared_ptr<EngineSource> source, std::shared_ptr<const TextCodec> codec, ServiceOptions options,
                 std::shared_ptr<Metrics> metrics)
    : engine_(std::move(source)), codec_(std::move(codec)), options_(std::move(options)),
      metrics_(metrics ? std::move(metrics) : std::make_shared<Metrics>()) {
    const EngineFacts facts = engine_->facts();
    const eh_model_info& mi = facts.info;
    trained_ctx_ = mi.context_length;
    model_device_bytes_ = mi.device_bytes_used;
    kv_bytes_per_token_ = mi.kv_bytes_per_token;
    n_ctx_ = options_.n_ctx ? options_.n_ctx : trained_ctx_;
    if (n_ctx_ == 0) throw Error(Code::ModelLoadFailed, "the model reports a context length of 0; pass --ctx-size");

    KvBudget kb;
    kb.max_seqs = std::max(1u, options_.max_running);
    kb.max_step_tokens = std::max(1u, options_.max_step_tokens);
    kb.max_seq_tokens = n_ctx_;
    kb.budget_bytes = options_.kv_budget_bytes;
    kb.memory_fraction = options_.kv_memory_fraction;
    kb.kv_type = options_.kv_type;
    std::unique_ptr<SeqEngine> engine;
    try {
        engine = engine_->make_engine(kb);
    } catch (const Error& e) {
        // A cache type the plugin cannot hold fails the start, by name: no
        // silent fallback to the default.
        if (kb.kv_type == 0) throw;
        throw Error(e.code(), fmt::format("plugin {} cannot start with --kv-cache-type {}: {}", facts.plugin_name,
                                          kv_cache_type_name(kb.kv_type), e.what()));
    }
    // A plugin may grant a shorter context (GPT-2's learned positions), and
    // one sequence must fit the whole KV pool: the scheduler's progress rests
    // on it, and a request that could never fit is refused up front (400)
    // by the context checks in prepare() instead of waiting forever.
    const SeqLimits& granted = engine->limits();
    n_ctx_ = uint32_t(std::min<uint64_t>({n_ctx_, granted.max_seq_tokens,
                                          uint64_t(granted.total_blocks) * granted.block_tokens}));
    has_logits_ = engine->has_logits();
    if (options_.pooling.mode != PoolingMode::None && !engine->has_hidden())
        throw Error(Code::ModelLoadFailed,
                    fmt::format("plugin {} cannot serve {}: {}", facts.plugin_name,
                                options_.pooling.mode == PoolingMode::Rerank ? "rerank scores (--rerank)"
                                                                              : "embeddings (--embedding)",
                                engine->process_id() != 0
                                    ? "the engine process does not carry hidden states (serve it without "
                                      "--engine-process)"
                                    : "it hands out no final hidden states (ABI 1.5 seq_hidden)"));
    device_bytes_ = engine_->facts().info.device_bytes_used;

    SchedulerOptions so;
    so.max_running = options_.max_running;
    so.queue_capacity = options_.queue_capacity;
    so.prefix_cache = options_.prefix_cache;
    so.prefix_cache_shared = options_.prefix_cache_shared;
    so.kv_host_bytes = options_.kv_host_bytes;
    so.chained_steps = options_.chained_steps;
    so.prefill_chunk_tokens = options_.prefill_chunk_tokens;
    so.inference_timeout = options_.inference_timeout;
    so.shutdown_grace = options_.shutdown_grace;
    so.repetition_window = options_.repetition_window;
    so.kv_events = options_.kv_events;
    so.kv_events_block_tokens = options_.kv_events_block_tokens;
    so.kv_events_hash_seed = options_.kv_events_hash_seed;
    so.plugin = facts.plugin_name;
    so.plugin_version = facts.plugin_version;
    so.spec = options_.spec;
    so.images = options_.images;
    // (A target that does not verify serves without speculation: the
    // scheduler says why, and no draft cache is allocated for nothing.)
    if (so.spec.source == SpecSource::DraftModel && granted.max_draft_tokens) {
        if (!options_.draft) throw Error(Code::Internal, "speculative decoding from a draft model without one");
        const EngineFacts df = options_.draft->facts();
        if (df.info.vocab_size != mi.vocab_size)
            throw Error(Code::ModelLoadFailed,
                        fmt::format("--draft-model: its vocabulary has {} tokens and the served model's {}; a draft "
                                    "model must share the served model's vocabulary",
                                    df.info.vocab_size, mi.vocab_size));
        // The draft's cache holds the tokens the served model's holds, at the
        // draft's own cost a token (the target's budget where it states none).
        KvBudget db = kb;
        db.kv_type = 0;
        db.max_seq_tokens = n_ctx_;
        if (df.info.kv_bytes_per_token)
            db.budget_bytes = uint64_t(granted.total_blocks) * granted.block_tokens * df.info.kv_bytes_per_token;
        so.spec.draft = options_.draft->make_engine(db);
        device_bytes_ += options_.draft->facts().info.device_bytes_used;
    }
    scheduler_ = std::make_unique<Scheduler>(std::move(engine), codec_, metrics_, so);
    constraints_ = std::make_unique<ConstraintCache>(codec_, mi.vocab_size);
}

Service::~Service() { shutdown(); }

uint64_t Service::kv_cache_bytes() const {
    const SeqLimits& l = scheduler_->limits();
    if (l.block_bytes) return uint64_t(l.total_blocks) * l.block_bytes;
    return uint64_t(n_ctx_) * kv_bytes_per_token_;  // the one session's cache
}

void Service::fill_gauges(Gauges& g) const {
    const SchedulerStats& s = scheduler_->stats();
    const SeqLimits& l = scheduler_->limits();
    g.queue_depth = double(s.waiting.load());
    g.active_jobs = double(s.running.load());
    const double total = double(l.total_blocks);
    g.kv_blocks_total = total;
    g.kv_cache_usage = total > 0 ? (total - double(s.kv_free_blocks.load())) / total : 0.0;
    g.kv_running_usage = total > 0 ? double(s.kv_running_blocks.load()) / total : 0.0;
    g.kv_block_tokens = double(l.block_tokens);
    g.prefix_caching = options_.prefix_cache && l.can_fork;
    g.kv_cache_type = l.kv_type == kKvTypeUnknown ? "auto" : kv_cache_type_name(l.kv_type);
    g.model_name = options_.model_name;
    g.prefix_cache_entries = double(s.prefix_entries.load());
    g.prefix_lookups = double(s.prefix_lookups.load());
    g.prefix_hits = double(s.prefix_hits.load());
    g.prefix_query_tokens = double(s.prefix_query_tokens.load());
    g.prefix_hit_tokens = double(s.prefix_hit_tokens.load());
    g.host_tier_budget = double(s.host_tier.budget_bytes.load());
    g.host_tier_used = double(s.host_tier.used_bytes.load());
    g.host_tier_entries = double(s.host_tier.entries.load());
    g.host_tier_parks = double(s.host_tier.parks.load());
    g.host_tier_park_bytes = double(s.host_tier.park_bytes.load());
    g.host_tier_restores = double(s.host_tier.restores.load());
    g.host_tier_restore_bytes = double(s.host_tier.restore_bytes.load());
    g.host_tier_dropped = double(s.host_tier.dropped.load());
    g.preemptions = double(s.preemptions.load());
    g.engine_restarts = double(s.engine_restarts.load());
    g.engine_steps = double(s.engine_steps.load());
    g.engine_step_seconds = double(s.engine_step_ns.load()) * 1e-9;
    g.engine_chained_steps = double(s.chained_steps.load());
    g.constraint_seconds = double(s.constraint_ns.load()) * 1e-9;
    g.spec_on = std::string(scheduler_->speculation()) != "off";
    g.lora_loaded = options_.adapters;
    const uint64_t waiting_adapters = s.waiting_adapters.load();
    for (size_t i = 0; i < options_.adapters.size() && i < 64; ++i)
        if (waiting_adapters >> i & 1) g.lora_waiting.push_back(options_.adapters[i]);
    g.spec_drafts = double(s.spec_drafts.load());
    g.spec_draft_tokens = double(s.spec_draft_tokens.load());
    g.spec_accepted_tokens = double(s.spec_accepted_tokens.load());
    g.spec_off_steps = double(s.spec_off_steps.load());
    g.spec_draft_seconds = double(s.spec_draft_ns.load()) * 1e-9;
}

std::vector<int32_t> Service::prompt_tokens(const GenerationRequest& req) const {
    if (req.images.empty()) return codec_->encode(req.prompt, req.add_special, req.parse_special, req.literal);
    Job job;
    place_images(req, options_.images.get(), *codec_, scheduler_->limits().max_step_tokens, job);
    return std::move(job.prompt_tokens);
}

std::shared_ptr<Job> Service::submit(GenerationRequest req) {
    auto job = prepare(std::move(req));
    scheduler_->enqueue(job);
    return job;
}

std::vector<std::shared_ptr<Job>> Service::submit_n(GenerationRequest req, uint32_t n) {
    if (n < 1 || n > kMaxN) throw RequestError("n", fmt::format("'n' must be between 1 and {}; got {}", kMaxN, n));
    std::vector<std::shared_ptr<Job>> jobs;
    jobs.push_back(prepare(req));
    for (uint32_t i = 1; i < n; ++i) {
        auto j = std::make_shared<Job>();  // the same prompt, limits and request
        j->request = jobs[0]->request;
        j->prompt_tokens = jobs[0]->prompt_tokens;
        j->images = jobs[0]->images;  // shared: an image is encoded once for all the choices
        j->max_tokens = jobs[0]->max_tokens;
        j->n_ctx = jobs[0]->n_ctx;
        j->submitted_at = jobs[0]->submitted_at;
        j->request.job_id = fmt::format("{}.{}", jobs[0]->request.job_id, i);
        j->seed = jobs[0]->seed + i;
        j->fork_of = jobs[0];
        j->constraint = jobs[0]->constraint;
        jobs.push_back(std::move(j));
    }
    scheduler_->enqueue_all(jobs);
    return jobs;
}

std::vector<std::shared_ptr<Job>> Service::submit_pooled(const GenerationRequest& meta, std::vector<PooledInput> inputs,
                                                         PoolingMode mode, const std::string& field) {
    if (stopping_) throw Error(Code::ShuttingDown, "the server is shutting down; not accepting new jobs");
    const PoolingMode served = options_.pooling.mode;
    if (mode != served) {
        const char* route = mode == PoolingMode::Rerank ? "/v1/rerank" : "/v1/embeddings";
        if (served == PoolingMode::None)
            throw RequestError("", fmt::format("{} is not served: this server generates text; start it with {} and "
                                               "{} model",
                                               route, mode == PoolingMode::Rerank ? "--rerank" : "--embedding",
                                               mode == PoolingMode::Rerank ? "a reranker" : "an embedding"));
        throw RequestError("", fmt::format("{} is not served: this server runs in {} mode ({})", route,
                                           pooling_mode_name(served),
                                           served == PoolingMode::Rerank ? "/v1/rerank" : "/v1/embeddings"));
    }
    if (inputs.empty()) throw RequestError(field, fmt::format("'{}' must hold at least one input", field));
    if (inputs.size() > kMaxPooledInputs)
        throw RequestError(field, fmt::format("'{}' holds {} inputs; the limit is {} per request", field, inputs.size(),
                                              kMaxPooledInputs));
    std::vector<std::shared_ptr<Job>> jobs;
    uint64_t total = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
        PooledInput& in = inputs[i];
        auto job = std::make_shared<Job>();
        if (in.is_tokens) {
            for (int32_t t : in.tokens)
                if (t < 0 || uint32_t(t) >= codec_->vocab_size())
                    throw RequestError(field, fmt::format("'{}[{}]' holds token id {}, outside the vocabulary (0..{})",
                                                          field, i, t, codec_->vocab_size() - 1));
            job->prompt_tokens = std::move(in.tokens);
        } else {
            job->prompt_tokens = codec_->encode(in.text, in.add_special, in.parse_special, in.literal);
        }
        const size_t np = job->prompt_tokens.size();
        if (np == 0) throw RequestError(field, fmt::format("'{}[{}]' is empty (zero tokens)", field, i));
        if (np > n_ctx_)
            throw RequestError(field, fmt::format("'{}[{}]' is {} tokens; the context holds {} (start the server with a "
                                                  "larger --ctx-size)",
                                                  field, i, np, n_ctx_));
        total += np;
        if (total > kMaxPooledTokens)
            throw RequestError(field, fmt::format("'{}' totals more than {} tokens; the limit is {} per request", field,
                                                  kMaxPooledTokens, kMaxPooledTokens));
        job->n_ctx = n_ctx_;
        job->max_tokens = 0;
        job->pooled = true;
        job->same_request = !jobs.empty();
        job->request = meta;
        job->request.prompt.clear();  // the tokens are the input; keep no second copy of the text
        job->request.job_id = fmt::format("{}.{}", meta.job_id, i);
        job->submitted_at = jobs.empty() ? job->submitted_at : jobs[0]->submitted_at;
        jobs.push_back(std::move(job));
    }
    scheduler_->enqueue_all(jobs);
    return jobs;
}

std::shared_ptr<Job> Service::prepare(GenerationRequest req) {
    if (stopping_) throw Error(Code::ShuttingDown, "the server is shutting down; not accepting new jobs");
    if (options_.pooling.mode != PoolingMode::None)
        throw RequestError("", fmt::format("this server serves {} (started with --{}): it generates no text; use {}",
                                           options_.pooling.mode == PoolingMode::Rerank ? "rerank scores" : "embeddings",
                                           pooling_mode_name(options_.pooling.mode),
                                           options_.pooling.mode == PoolingMode::Rerank ? "/v1/rerank" : "/v1/embeddings"));
    auto job = std::make_shared<Job>();
    if (!req.adapter.empty()) {
        const auto& names = options_.adapters;
        const auto it = std::find(names.begin(), names.end(), req.adapter);
        if (it == names.end()) throw AdapterNotFound(req.adapter, names);
        job->adapter = uint32_t(it - names.begin()) + 1;
    }
    if (req.n_ctx && *req.n_ctx > n_ctx_) {
        if (trained_ctx_ && *req.n_ctx > trained_ctx_)
            throw RequestError("n_ctx", fmt::format("'n_ctx' {} exceeds the model's trained context length {}",
                                                    *req.n_ctx, trained_ctx_));
        throw RequestError("n_ctx", fmt::format("'n_ctx' {} exceeds the server's context of {} tokens per sequence "
                                                "(all sequences share one KV-cache pool; start the server with a "
                                                "larger --ctx-size)",
                                                *req.n_ctx, n_ctx_));
    }
    if (req.images.empty())
        job->prompt_tokens = codec_->encode(req.prompt, req.add_special, req.parse_special, req.literal);
    else
        place_images(req, options_.images.get(), *codec_, scheduler_->limits().max_step_tokens, *job);
    req.images.clear();  // the job holds what the encoder takes; the decoded images go now
    job->n_ctx = n_ctx_;
    const uint32_t ctx = n_ctx_;
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
    if (req.sampling.needs_batched_engine() && !scheduler_->limits().batched) {
        const char* field = !req.sampling.logit_bias.empty() ? "logit_bias"
                            : req.sampling.presence_penalty != 0.0 ? "presence_penalty"
                                                                    : "frequency_penalty";
        throw RequestError(field, fmt::format("'{}' is not available: the engine plugin runs no batched steps "
                                              "(ABI 1.2), where the sampler takes it", field));
    }
    for (auto [id, bias] : req.sampling.logit_bias)
        if (id < 0 || uint32_t(id) >= codec_->vocab_size())
            throw RequestError("logit_bias", fmt::format("'logit_bias' token id {} is outside the vocabulary (0..{})", id,
                                                         codec_->vocab_size() - 1));
    if (req.constraint.active()) {
        const std::string& f = req.constraint.field;
        if (!scheduler_->limits().batched)
            throw RequestError(f, fmt::format("'{}' is not available: the engine plugin runs no batched steps (ABI 1.2), "
                                              "where the sampler takes the allowed-token mask", f));
        job->constraint = constraints_->get(req.constraint);
    }
    if (req.top_logprobs >= 0 && !has_logits_)
        throw RequestError("logprobs", "logprobs are not available: the engine plugin does not expose logits");
    job->seed = req.sampling.seed ? *req.sampling.seed : random_seed();
    job->request = std::move(req);
    return job;
}

std::string Service::cancel(const std::string& job_id, CancelReason why, const std::string* owner) {
    return scheduler_->cancel(job_id, why, owner);
}

void Service::shutdown() {
    stopping_ = true;
    if (scheduler_) scheduler_->shutdown();
}

}  // namespace eh::service
