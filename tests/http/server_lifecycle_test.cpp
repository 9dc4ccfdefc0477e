// Issue 26 item 4 in process: Server::stop() racing Server::run(). Before the
// fix a stop() that came before httplib had started listening did nothing,
// and run() then sat in accept() for ever (engine-host hung 1 in 40 runs).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "eh/http/server.hpp"

namespace eh::http {
namespace {

// run() on a helper thread must return within 5 s of stop().
void expect_run_returns(Server& s, const std::function<void()>& between) {
    auto done = std::async(std::launch::async, [&] { s.run(); });
    between();
    s.stop();
    if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
        ADD_FAILURE() << "run() did not return after stop()";
        std::_Exit(1);  // the thread is stuck in accept()
    }
}

ServerOptions any_port() {
    ServerOptions o;
    o.port = 0;
    return o;
}

TEST(ServerLifecycle, StopBeforeRunMeansRunNeverListens) {
    Server s(any_port(), nullptr);
    s.bind();
    s.stop();
    auto done = std::async(std::launch::async, [&] { s.run(); });
    ASSERT_EQ(done.wait_for(std::chrono::seconds(5)), std::future_status::ready);
}

TEST(ServerLifecycle, StopRacingTheStartOfRunAlwaysEndsIt) {
    for (int i = 0; i < 200; ++i) {
        SCOPED_TRACE(i);
        Server s(any_port(), nullptr);
        s.bind();
        // No pause, a yield, or a short sleep: stop() lands before, during
        // and after listen() begins.
        expect_run_returns(s, [i] {
            if (i % 3 == 1) std::this_thread::yield();
            if (i % 3 == 2) std::this_thread::sleep_for(std::chrono::microseconds(200));
        });
    }
}

}  // namespace
}  // namespace eh::http
