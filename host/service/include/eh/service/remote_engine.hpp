// The engine in a child process (serve --engine-process). The child (the
// same executable, `engine-worker`) loads the plugin and the model and runs
// make_seq_engine; this process drives it over a socketpair with the
// protocol in src/engine_wire.hpp. A plugin that crashes or hangs then ends
// only the child: the running requests end with ENGINE_CRASHED (or
// INFERENCE_TIMEOUT), waiting ones stay queued, and the child is started
// again under RestartPolicy.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "eh/service/engine_source.hpp"

namespace eh::service {

struct RestartPolicy {
    // More than max_restarts crashes within `window`: the engine stays down
    // (EngineState::Failed, /health unhealthy).
    uint32_t max_restarts = 3;
    std::chrono::seconds window{60};
    // The wait before the n-th restart in the window: first * 2^(n-1), at most max.
    std::chrono::milliseconds backoff_first{250};
    std::chrono::milliseconds backoff_max{4000};
};

struct EngineProcessOptions {
    // The child's command line; argv[0] is the executable. The socket is its
    // file descriptor 3, and `--parent-pid PID` is appended.
    std::vector<std::string> argv;
    RestartPolicy restart;
    // The first load's progress and cancel (restarts report in the log).
    std::function<void(float, const std::string&)> progress;
    std::function<bool()> cancel;
};

// Starts the child and waits for its model load. Throws eh::Error with the
// child's code and message when the load fails (or Error(EngineCrashed) with
// the signal when the child dies while loading).
std::shared_ptr<EngineSource> start_engine_process(EngineProcessOptions options);

// The engine-worker side: answers the parent's requests on `fd` until the
// parent closes it (or dies: `parent_pid` is polled). Returns the exit code.
// `adapters`: the LoRA adapters loaded into `model` (serve --lora), which
// SetAdapter picks from.
int serve_engine_requests(int fd, std::shared_ptr<EngineModel> model, int64_t parent_pid,
                          std::vector<std::shared_ptr<EngineAdapter>> adapters = {});
// The engine-worker's messages before serve_engine_requests: load progress,
// then its facts (Ready) or why the load failed.
void send_load_progress(int fd, float fraction, const std::string& stage);
void send_ready(int fd, const EngineFacts& facts);
void send_load_failed(int fd, const Error& e);

}  // namespace eh::service
