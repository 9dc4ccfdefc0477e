#include "serve_runtime.hpp"

#include <chrono>
#include <csignal>

#include "eh/service/event_log.hpp"

namespace eh::cli {

void ShutdownLatch::trigger(const std::string& why) {
    {
        std::lock_guard lock(mu_);
        if (fired_) return;
        fired_ = true;
        why_ = why;
    }
    cv_.notify_all();
}

std::string ShutdownLatch::wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return fired_; });
    return why_;
}

bool ShutdownLatch::fired() {
    std::lock_guard lock(mu_);
    return fired_;
}

std::shared_ptr<ShutdownLatch> take_shutdown_signals() {
    // Signals go to one thread; everyone else (HTTP, worker) has them blocked.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
    auto latch = std::make_shared<ShutdownLatch>();
    std::thread([sigs, latch] {
        int sig = 0;
        sigwait(&sigs, &sig);
        latch->trigger(sig == SIGINT ? "SIGINT" : "SIGTERM");
    }).detach();
    return latch;
}

void ResidencyWatch::start(std::shared_ptr<service::EngineSource> engine, http::Server& server, uint32_t every_sec) {
    thread_ = std::thread([this, engine = std::move(engine), &server, every_sec] {
        std::unique_lock lock(mu_);
        while (!cv_.wait_for(lock, std::chrono::seconds(every_sec ? every_sec : 30), [&] { return stop_; })) {
            lock.unlock();
            std::string w;
            bool ok = engine->check_residency(&w);
            server.set_resident(ok, w);
            if (!ok)
                service::log_event(spdlog::level::err, "error", {{"code", "RESIDENCY_CHECK_FAILED"}, {"message", w}});
            lock.lock();
        }
    });
}

void ResidencyWatch::stop() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

}  // namespace eh::cli
