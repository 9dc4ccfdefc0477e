// The service loop: one model, one worker thread, jobs run one at a time in
// arrival order from a bounded queue. The HTTP layer submits requests and
// reads each job's events; cancel and the status accessors never wait for
// the running job.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "eh/loader/engine.hpp"
#include "eh/service/job.hpp"
#include "eh/service/metrics.hpp"
#include "eh/service/request.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::service {

struct ServiceOptions {
    uint32_t n_ctx = 0;                 // 0: the model's context length
    size_t queue_capacity = 16;         // jobs waiting (the running one not counted)
    std::chrono::milliseconds inference_timeout{300000};
    std::chrono::milliseconds shutdown_grace{5000};
    RequestLimits limits;
    std::string model_name;
    int repetition_window = 64;
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

class Service {
public:
    Service(std::shared_ptr<EngineModel> model, std::shared_ptr<const TextCodec> codec, ServiceOptions options,
            std::shared_ptr<Metrics> metrics = nullptr);
    ~Service();
    Service(const Service&) = delete;
    Service& operator=(const Service&) = delete;

    // Tokenizes, checks the context budget and queues the job. Throws
    // RequestError (400), QueueFullError or Error(ShuttingDown) (503).
    std::shared_ptr<Job> submit(GenerationRequest request);

    // "cancelling" (running), "cancelled" (was queued), "finished",
    // "unknown". Never blocks on the running job.
    std::string cancel(const std::string& job_id, CancelReason why = CancelReason::Client);

    // Stops accepting, fails queued jobs with SHUTTING_DOWN, lets the running
    // job finish within the grace period (then cancels it) and joins the
    // worker. Idempotent.
    void shutdown();
    bool shutting_down() const { return stopping_.load(); }

    size_t queue_depth() const;
    size_t active_jobs() const { return active_.load(); }
    uint32_t n_ctx() const { return n_ctx_; }
    // Device memory, as the plugin counts it. Refreshed by the worker after
    // each session is made or freed, so reading it never calls the plugin.
    uint64_t device_bytes_used() const { return device_bytes_.load(); }
    uint64_t model_device_bytes() const { return model_device_bytes_; }  // before any session
    uint64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }  // 0: the plugin does not say
    const TextCodec& codec() const { return *codec_; }
    const ServiceOptions& options() const { return options_; }
    const std::shared_ptr<EngineModel>& model() const { return model_; }
    Metrics& metrics() { return *metrics_; }

private:
    void worker_loop();
    void run(const std::shared_ptr<Job>& job);
    void finish(const std::shared_ptr<Job>& job, const JobEvent& terminal);
    std::unique_ptr<EngineSession> make_session(uint32_t n_ctx);
    void refresh_device_bytes();
    uint32_t retry_after_ms() const;

    std::shared_ptr<EngineModel> model_;
    std::shared_ptr<const TextCodec> codec_;
    ServiceOptions options_;
    std::shared_ptr<Metrics> metrics_;
    uint32_t n_ctx_ = 0;
    uint32_t trained_ctx_ = 0;
    uint64_t model_device_bytes_ = 0;
    uint64_t kv_bytes_per_token_ = 0;
    std::atomic<uint64_t> device_bytes_{0};
    std::unique_ptr<EngineSession> session_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    std::unordered_map<std::string, std::shared_ptr<Job>> live_;  // queued or running, by job_id
    std::deque<std::string> recent_;                              // finished ids, for idempotent cancel
    std::shared_ptr<Job> current_;
    std::atomic<Job*> running_{nullptr};
    std::atomic<int64_t> deadline_ns_{0};
    std::atomic<size_t> active_{0};
    std::atomic<bool> stopping_{false};
    std::atomic<double> avg_job_ms_{1000};
    std::once_flag shutdown_once_;
    std::thread worker_;
};

}  // namespace eh::service
