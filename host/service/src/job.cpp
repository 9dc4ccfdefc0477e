#include "eh/service/job.hpp"

#include "eh/service/event_log.hpp"

namespace eh::service {

const char* cancel_reason_name(CancelReason r) {
    switch (r) {
    case CancelReason::None: return "none";
    case CancelReason::Client: return "cancel_request";
    case CancelReason::Disconnect: return "client_disconnected";
    case CancelReason::Shutdown: return "shutdown";
    case CancelReason::Timeout: return "timeout";
    }
    return "none";
}

void Job::push(JobEvent ev) {
    {
        std::lock_guard lock(mu_);
        if (terminated_) return;  // exactly one terminal event, nothing after it
        const bool terminal = ev.kind == JobEvent::Kind::End || ev.kind == JobEvent::Kind::Error;
        if (terminal && !started_) {
            JobEvent started;
            started.kind = JobEvent::Kind::Started;
            started.started_at = now_rfc3339();
            started.seed = seed;
            started.prompt_tokens = uint32_t(prompt_tokens.size());
            events_.push_back(std::move(started));
        }
        started_ |= ev.kind == JobEvent::Kind::Started;
        terminated_ |= terminal;
        events_.push_back(std::move(ev));
    }
    cv_.notify_all();
}

std::optional<JobEvent> Job::pop(std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return !events_.empty(); })) return std::nullopt;
    JobEvent ev = std::move(events_.front());
    events_.pop_front();
    return ev;
}

void Job::cancel(CancelReason why) {
    int none = 0;
    cancel_.compare_exchange_strong(none, int(why));
}

bool Job::terminated() const {
    std::lock_guard lock(mu_);
    return terminated_;
}

}  // namespace eh::service
