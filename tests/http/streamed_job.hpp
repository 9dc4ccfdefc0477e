// A long /execute (400 tokens) streamed on a thread of its own, for tests
// that act on a request while it runs: the constructor gives it 300 ms to
// start, `terminal` gets its last event (error or end), the destructor waits
// for it.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "raw_http.hpp"

namespace eh::test {

struct StreamedJob {
    std::string terminal;
    std::thread t;
    StreamedJob(int port, const std::string& id, std::map<std::string, std::string> headers = {}) {
        const std::string body = R"({"job_id":")" + id + R"(","prompt":"Once upon a time","max_tokens":400})";
        t = std::thread([this, port, body, headers] {
            sse_stream(
                port, "/execute", body,
                [&](const SseEvent& e) {
                    if (e.event == "error" || e.event == "end") terminal = e.event + " " + e.data;
                    return true;
                },
                headers);
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // started
    }
    ~StreamedJob() {
        if (t.joinable()) t.join();
    }
    StreamedJob(const StreamedJob&) = delete;
    StreamedJob& operator=(const StreamedJob&) = delete;
};

}  // namespace eh::test
