// What runs beside a serving server: the latch shutdown waits on (set by a
// signal, POST /shutdown or a fatal error) and the periodic weights
// residency check.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "eh/http/server.hpp"
#include "eh/service/remote_engine.hpp"

namespace eh::cli {

// Set once; the first reason given wins.
class ShutdownLatch {
public:
    void trigger(const std::string& why);
    std::string wait();
    bool fired();

private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool fired_ = false;
    std::string why_;
};

// Blocks SIGTERM and SIGINT in this thread (and so in every thread started
// after it) and starts one thread that waits for them and triggers the
// latch, so shutdown runs as ordinary code. SIGPIPE is ignored.
std::shared_ptr<ShutdownLatch> take_shutdown_signals();

// Checks the engine's weights residency every `every_sec` seconds (0 = 30)
// and tells the server; never on a request's path. Stops when destroyed.
class ResidencyWatch {
public:
    ResidencyWatch() = default;
    ResidencyWatch(const ResidencyWatch&) = delete;
    ResidencyWatch& operator=(const ResidencyWatch&) = delete;
    ~ResidencyWatch() { stop(); }
    void start(std::shared_ptr<service::EngineSource> engine, http::Server& server, uint32_t every_sec);
    void stop();

private:
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
};

}  // namespace eh::cli
