// A generation job and the events it produces. The worker thread pushes
// events; the HTTP thread that owns the client connection pops them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "eh/constrain/automaton.hpp"
#include "eh/error.hpp"
#include "eh/service/request.hpp"

namespace eh::service {

struct TopLogprob {
    int32_t id = 0;
    std::string text;
    double logprob = 0;
    std::string bytes;
};

struct TokenLogprob {
    int32_t id = 0;
    // The exact bytes this token adds to the output (TextCodec::token_bytes):
    // may be part of a character. `text` is them as valid UTF-8, a partial
    // character replaced by U+FFFD.
    std::string bytes;
    std::string text;
    double logprob = 0;
    std::vector<TopLogprob> top;
};

struct JobEvent {
    enum class Kind { Started, Token, End, Error };
    Kind kind = Kind::Token;
    // Started
    std::string started_at;            // RFC 3339, UTC
    uint64_t seed = 0;
    uint32_t prompt_tokens = 0;
    uint32_t cached_tokens = 0;        // prompt tokens reused from the prefix cache
    // Token: a chunk of text, completed by token number `index` (0-based)
    std::string text;
    uint32_t index = 0;
    std::vector<TokenLogprob> logprobs;  // one per token in the chunk, when asked for
    // End
    std::string stop_sequence;         // with stop_reason "stop": the stop string that matched
    uint32_t tokens_out = 0;
    double decode_time_ms = 0;
    double time_to_first_token_ms = 0;
    std::string stop_reason;           // "eos", "stop", "length", "grammar" (the output completed its constraint), "pooled"
    // A pooled job's result: its last prompt token's final hidden state.
    std::vector<float> hidden;
    // Error
    Code code = Code::Internal;
    std::string message;
    bool retriable = false;
    std::optional<uint32_t> retry_after_ms;
};

enum class CancelReason : int { None = 0, Client = 1, Disconnect = 2, Shutdown = 3, Timeout = 4 };
const char* cancel_reason_name(CancelReason r);

class Job {
public:
    GenerationRequest request;
    std::vector<int32_t> prompt_tokens;
    uint32_t max_tokens = 0;
    uint32_t n_ctx = 0;        // the context it runs in (the server's)
    uint64_t seed = 0;
    // request.adapter as the engine numbers it (1-based; 0: the base model).
    uint32_t adapter = 0;
    // Its output is the final hidden state of its last prompt token, not
    // text (embeddings, rerank): nothing is sampled.
    bool pooled = false;
    // Queued as part of the request of the job before it (a pooled
    // request's inputs after the first): the queue's capacity counts
    // requests, so one request of 1,000 inputs is one waiting request.
    bool same_request = false;
    // For the 2nd..nth sample of one prompt (`n` > 1): the first one's job.
    // The scheduler forks that job's sequence once its prompt is in, so the
    // prompt's KV is computed once.
    std::shared_ptr<Job> fork_of;
    // Its images (ABI 1.6): prompt positions first .. first + count - 1 hold
    // the image's tokens, whose embeddings the encoder's rows replace. The
    // scheduler encodes `pixels` into `rows` when the image's span first
    // goes into a step; `digest` keys the image in the prefix cache.
    struct Image {
        std::string digest;
        std::vector<float> pixels;     // 3 planes of height x width
        std::vector<float> rows;
        uint32_t first = 0, count = 0;
        uint32_t width = 0, height = 0;
        uint32_t grid_width = 0;       // its tokens per row, for an EH_SPAN_GRID span (ABI 1.8); else 0
    };
    std::vector<std::shared_ptr<Image>> images;
    // The compiled output constraint (request.constraint), shared by every
    // job with the same one; each running job walks it with its own Matcher.
    std::shared_ptr<constrain::Automaton> constraint;
    std::chrono::steady_clock::time_point submitted_at = std::chrono::steady_clock::now();
    // Microseconds from submission to admission into the batch; -1 until
    // the scheduler admits it (the access log reads it).
    std::atomic<int64_t> queue_us{-1};

    // Queues an event. A terminal event for a job that never started (it was
    // cancelled, timed out or shut down while queued) is preceded by a
    // `started` event, so every stream opens with one.
    void push(JobEvent ev);
    // Next event, or nullopt when none arrived within `wait`.
    std::optional<JobEvent> pop(std::chrono::milliseconds wait);
    // Requests cancellation; the first reason wins.
    void cancel(CancelReason why);
    CancelReason cancel_reason() const { return CancelReason(cancel_.load()); }
    bool cancelled() const { return cancel_.load() != 0; }
    bool terminated() const;   // a terminal event was pushed

private:
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<JobEvent> events_;
    bool terminated_ = false;
    bool started_ = false;
    std::atomic<int> cancel_{0};
};

}  // namespace eh::service
