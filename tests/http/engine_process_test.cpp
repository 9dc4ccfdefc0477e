// serve --engine-process against the real engine-host: the test engine
// crashing (EH_TEST_ENGINE_CRASH_AFTER) or hanging (EH_TEST_ENGINE_HANG_AFTER)
// in its child process ends only the running request, with exactly one
// terminal event; the server stays up and restarts the engine; a waiting
// request runs after the restart; repeated crashes leave it unhealthy; a
// crash while loading is serve's startup error; no engine process outlives
// serve; and the CPU reference engine's output is the same in a child as
// in this process, logprobs included.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "engine_host_process.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

const std::string kModel = EH_DEFAULT_MODEL;
const std::string kTestEngine = std::string(EH_TEST_PLUGIN_DIR) + "/good";

EngineHost engine_process(std::map<std::string, std::string> env, std::vector<std::string> args = {}) {
    args.push_back("--engine-process");
    return EngineHost(std::move(args), std::move(env), true, kTestEngine, kModel);
}

std::string exec_body(const std::string& id, int max_tokens) {
    return R"({"job_id":")" + id + R"(","prompt":"Once upon a time","temperature":0,"max_tokens":)" +
           std::to_string(max_tokens) + "}";
}

struct Stream {
    std::vector<SseEvent> events;
    size_t terminals = 0;
    json terminal;
    std::string text;
    std::string last_event;
};

Stream execute(int port, const std::string& id, int max_tokens) {
    Stream s;
    sse_stream(port, "/execute", exec_body(id, max_tokens), [&](const SseEvent& e) {
        s.events.push_back(e);
        if (e.event == "token") s.text += json::parse(e.data).value("t", "");
        if (e.event == "error" || e.event == "end") {
            ++s.terminals;
            s.terminal = json::parse(e.data, nullptr, false);
            s.last_event = e.event;
        }
        return true;
    });
    return s;
}

json health(EngineHost& h) {
    HttpResponse r = h.get("/health");
    json j = json::parse(r.body, nullptr, false);
    return j.is_object() ? j : json::object();
}

// Waits until /health's status is not "loading" (the engine restarting).
json settled_health(EngineHost& h, int timeout_ms = 15000) {
    json j;
    for (auto until = Clock::now() + std::chrono::milliseconds(timeout_ms); Clock::now() < until;) {
        j = health(h);
        if (j.value("status", "") != "loading") return j;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return j;
}

int64_t engine_pid(const json& health) {
    const json& p = health["engine"]["process"];
    return p.is_number() ? p.get<int64_t>() : 0;
}

// Gone, or a zombie nobody reaps (a container's init may not).
bool process_gone(int64_t pid) {
    if (kill(pid_t(pid), 0) != 0) return true;
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    return close == std::string::npos || stat.substr(close + 2, 1) == "Z";
}

bool wait_gone(int64_t pid, int timeout_ms = 5000) {
    for (int i = 0; i < timeout_ms / 10; ++i) {
        if (process_gone(pid)) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return process_gone(pid);
}

}  // namespace

TEST(EngineProcess, ACrashEndsTheRunningRequestOnceAndTheEngineComesBack) {
    EngineHost h = engine_process({{"EH_TEST_ENGINE_CRASH_AFTER", "3"}, {"EH_TEST_ENGINE_DELAY_MS", "10"}});
    ASSERT_TRUE(h.running()) << h.log();
    const json before = health(h);
    EXPECT_EQ(before.value("status", ""), "healthy") << before.dump();
    const int64_t first = engine_pid(before);
    ASSERT_GT(first, 0) << before.dump();
    EXPECT_NE(first, h.pid());
    const Stream reference = execute(h.port(), "short-before", 3);  // under the crash's step
    ASSERT_EQ(reference.last_event, "end") << h.log();

    const Stream crashed = execute(h.port(), "dies", 20);
    EXPECT_EQ(crashed.terminals, 1u);
    EXPECT_EQ(crashed.last_event, "error");
    EXPECT_EQ(crashed.events.back().event, "error");
    EXPECT_EQ(crashed.terminal.value("code", ""), "ENGINE_CRASHED") << crashed.terminal.dump();
    EXPECT_TRUE(crashed.terminal.value("retriable", false));
    EXPECT_EQ(crashed.terminal.value("retry_after_ms", 0), 5000);
    EXPECT_NE(crashed.terminal.value("message", "").find("SIGSEGV"), std::string::npos) << crashed.terminal.dump();

    EXPECT_TRUE(h.running()) << h.log();
    EXPECT_TRUE(wait_gone(first));
    const json after = settled_health(h);
    EXPECT_EQ(after.value("status", ""), "healthy") << after.dump();
    EXPECT_EQ(after["engine"].value("state", ""), "ready");
    EXPECT_EQ(after["engine"].value("restarts", 0), 1);
    EXPECT_GT(engine_pid(after), 0);
    EXPECT_NE(engine_pid(after), first);
    EXPECT_NE(h.get("/metrics").body.find("\neh_engine_restarts_total 1\n"), std::string::npos);

    const Stream next = execute(h.port(), "short-after", 3);
    EXPECT_EQ(next.last_event, "end") << h.log();
    EXPECT_EQ(next.terminals, 1u);
    EXPECT_EQ(next.terminal.value("tokens_out", 0), 3);
    EXPECT_EQ(next.text, reference.text);  // greedy: the same text as before the crash

    bool logged = false;
    for (const json& j : h.log_events())
        if (j.value("event", "") == "engine_crashed" && j.value("message", "").find("SIGSEGV") != std::string::npos)
            logged = true;
    EXPECT_TRUE(logged) << h.log();
}

TEST(EngineProcess, ANonStreamRequestOnACrashingEngineGetsA503WithRetryAfter) {
    EngineHost h = engine_process({{"EH_TEST_ENGINE_CRASH_AFTER", "2"}});
    ASSERT_TRUE(h.running()) << h.log();
    HttpResponse r = h.post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":10})");
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.header("retry-after"), "5");
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j["error"].value("code", ""), "ENGINE_CRASHED") << r.body;
    EXPECT_TRUE(h.running());
    const json after = settled_health(h);
    EXPECT_EQ(after.value("status", ""), "healthy") << after.dump();
    EXPECT_EQ(after["engine"].value("restarts", 0), 1);
}

TEST(EngineProcess, ARequestWaitingDuringTheCrashRunsAfterTheRestart) {
    EngineHost h = engine_process({{"EH_TEST_ENGINE_CRASH_AFTER", "5"}, {"EH_TEST_ENGINE_DELAY_MS", "40"}},
                                  {"--parallel", "1"});
    ASSERT_TRUE(h.running()) << h.log();
    Stream crashed, waited;
    std::thread a([&] { crashed = execute(h.port(), "running", 30); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(health(h).value("queue_depth", -1), 0);
    std::thread b([&] { waited = execute(h.port(), "waiting", 3); });
    // b waits behind a: one sequence at a time.
    bool queued = false;
    for (int i = 0; i < 100 && !queued; ++i) {
        queued = health(h).value("queue_depth", 0) == 1;
        if (!queued) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    a.join();
    b.join();
    EXPECT_TRUE(queued) << "the second request never waited";
    EXPECT_EQ(crashed.terminal.value("code", ""), "ENGINE_CRASHED") << crashed.terminal.dump();
    EXPECT_EQ(crashed.terminals, 1u);
    EXPECT_EQ(waited.last_event, "end") << waited.terminal.dump() << h.log();
    EXPECT_EQ(waited.terminals, 1u);
    EXPECT_EQ(waited.terminal.value("tokens_out", 0), 3);
    EXPECT_EQ(health(h)["engine"].value("restarts", 0), 1);
}

// A child that dies while no request runs is noticed by the idle scheduler
// and restarted at once: /health counts the restart with no request sent,
// and the next request is served by the new child.
TEST(EngineProcess, AChildThatDiesWhileIdleIsRestartedBeforeTheNextRequest) {
    EngineHost h = engine_process({});
    ASSERT_TRUE(h.running()) << h.log();
    const int64_t first = engine_pid(health(h));
    ASSERT_GT(first, 0);
    ASSERT_EQ(kill(pid_t(first), SIGKILL), 0);
    json st;
    for (auto until = Clock::now() + std::chrono::seconds(15); Clock::now() < until;) {
        st = health(h);
        if (st["engine"].value("restarts", 0) == 1 && st.value("status", "") == "healthy") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(st["engine"].value("restarts", 0), 1) << st.dump() << h.log();
    EXPECT_EQ(st.value("status", ""), "healthy") << st.dump();
    const int64_t second = engine_pid(st);
    EXPECT_GT(second, 0) << st.dump();
    EXPECT_NE(second, first);
    EXPECT_TRUE(wait_gone(first));
    const Stream s = execute(h.port(), "after-idle-death", 4);
    EXPECT_EQ(s.terminals, 1u);
    EXPECT_EQ(s.last_event, "end") << s.terminal.dump();
}

// The policy: more than 3 crashes within 60 s and the engine stays down.
TEST(EngineProcess, RepeatedCrashesLeaveTheServerUnhealthyAfterTheFourth) {
    EngineHost h = engine_process({{"EH_TEST_ENGINE_CRASH_AFTER", "0"}});
    ASSERT_TRUE(h.running()) << h.log();
    for (int i = 1; i <= 4; ++i) {
        const Stream s = execute(h.port(), "crash" + std::to_string(i), 5);
        EXPECT_EQ(s.terminals, 1u);
        EXPECT_EQ(s.terminal.value("code", ""), "ENGINE_CRASHED") << i << ": " << s.terminal.dump();
        const json st = settled_health(h);
        if (i < 4) {
            EXPECT_EQ(st.value("status", ""), "healthy") << i << ": " << st.dump();
            EXPECT_EQ(st["engine"].value("restarts", 0), i);
        } else {
            EXPECT_EQ(st.value("status", ""), "unhealthy") << st.dump();
            EXPECT_EQ(st["engine"].value("state", ""), "failed");
            EXPECT_EQ(st["engine"].value("restarts", 0), 3);
            EXPECT_TRUE(st["engine"]["process"].is_null()) << st.dump();
        }
    }
    HttpResponse refused = h.post("/execute", exec_body("after", 2));
    EXPECT_EQ(refused.status, 503) << refused.body;
    EXPECT_NE(refused.body.find("ENGINE_CRASHED"), std::string::npos) << refused.body;
    EXPECT_NE(refused.body.find("not restarted again"), std::string::npos) << refused.body;
    EXPECT_EQ(h.get("/health").status, 503);
    EXPECT_TRUE(h.running());
    EXPECT_EQ(h.stop(), 0) << h.log();
}

TEST(EngineProcess, AHungStepEndsAtTheInferenceTimeoutAndTheEngineIsReplaced) {
    EngineHost h = engine_process({{"EH_TEST_ENGINE_HANG_AFTER", "2"}}, {"--inference-timeout-sec", "1"});
    ASSERT_TRUE(h.running()) << h.log();
    const int64_t first = engine_pid(health(h));
    ASSERT_GT(first, 0);
    const auto t0 = Clock::now();
    const Stream hung = execute(h.port(), "hangs", 20);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    EXPECT_EQ(hung.terminals, 1u);
    EXPECT_EQ(hung.terminal.value("code", ""), "INFERENCE_TIMEOUT") << hung.terminal.dump();
    EXPECT_GE(ms, 900);
    EXPECT_LT(ms, 5000);
    EXPECT_TRUE(wait_gone(first)) << "the hung engine process was not killed";
    const json after = settled_health(h);
    EXPECT_EQ(after.value("status", ""), "healthy") << after.dump();
    EXPECT_EQ(after["engine"].value("restarts", 0), 1);
    EXPECT_NE(engine_pid(after), first);
    const Stream next = execute(h.port(), "short", 2);
    EXPECT_EQ(next.last_event, "end") << next.terminal.dump();
    EXPECT_EQ(next.terminal.value("tokens_out", 0), 2);
}

TEST(EngineProcess, ACrashWhileLoadingIsAStartupErrorNotARestartLoop) {
    EngineHost h({"--engine-process"}, {{"EH_TEST_ENGINE_CRASH_AT_LOAD", "1"}}, false, kTestEngine, kModel);
    EXPECT_EQ(h.wait_exit(10000), 1) << h.log();
    const std::string log = h.log();
    EXPECT_NE(log.find("SIGILL"), std::string::npos) << log;
    EXPECT_NE(log.find("while loading the model"), std::string::npos) << log;
    EXPECT_NE(log.find("ENGINE_CRASHED"), std::string::npos) << log;
    EXPECT_EQ(log.find("engine_restart"), std::string::npos) << log;
}

TEST(EngineProcess, NoEngineProcessOutlivesServe) {
    {
        EngineHost h = engine_process({});
        const int64_t child = engine_pid(health(h));
        ASSERT_GT(child, 0);
        EXPECT_EQ(h.stop(SIGTERM), 0) << h.log();
        EXPECT_TRUE(wait_gone(child, 2000)) << "SIGTERM left the engine process";
    }
    {
        EngineHost h = engine_process({});
        const int64_t child = engine_pid(health(h));
        ASSERT_GT(child, 0);
        EXPECT_EQ(h.stop(SIGKILL), 128 + SIGKILL);
        EXPECT_TRUE(wait_gone(child, 5000)) << "the engine process outlived a killed serve";
    }
}

// ---- the CPU reference engine: the same output in a child process ------------

namespace {

EngineHost cpu_reference(bool in_child) {
    std::vector<std::string> args = {"--device", "cpu"};
    if (in_child) args.push_back("--engine-process");
    return EngineHost(args, {}, true, EH_PLUGIN_DIR, stories_model());
}

json completion(EngineHost& h, const std::string& body) {
    HttpResponse r = h.post("/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    if (!j.is_object()) return json::object();
    return {{"choices", j["choices"]}, {"usage", j["usage"]}};
}

}  // namespace

TEST(EngineProcess, CpuReferenceOutputIsTheSameAsInProcess) {
    const std::vector<std::string> bodies = {
        R"({"prompt":"Once upon a time","max_tokens":24,"temperature":0,"seed":7,"logprobs":3})",
        R"({"prompt":"The little dog","max_tokens":24,"temperature":0.9,"top_p":0.95,"seed":42,"logprobs":2})",
        R"({"prompt":"Lily went","max_tokens":16,"temperature":0.8,"seed":5,"n":2,"logit_bias":{"100":2.5}})",
    };
    std::vector<json> local, child;
    {
        EngineHost h = cpu_reference(false);
        ASSERT_TRUE(h.running()) << h.log();
        for (const auto& b : bodies) local.push_back(completion(h, b));
    }
    {
        EngineHost h = cpu_reference(true);
        ASSERT_TRUE(h.running()) << h.log();
        EXPECT_GT(engine_pid(health(h)), 0);
        for (const auto& b : bodies) child.push_back(completion(h, b));
    }
    for (size_t i = 0; i < bodies.size(); ++i) {
        ASSERT_FALSE(local[i]["choices"].empty()) << local[i].dump();
        EXPECT_EQ(child[i].dump(), local[i].dump()) << bodies[i];
    }
    // The logprobs are there to compare.
    EXPECT_FALSE(local[0]["choices"][0]["logprobs"]["top_logprobs"].empty()) << local[0].dump();
}

// A child stopped (SIGSTOP) while nothing runs: the idle scheduler's ping
// finds it within 2 s, kills it and starts another, so the next request is
// answered, and a request that arrives first is bounded by its own
// inference timeout from admission (issue 52, item 2: it got a 200 head and
// no event for over a minute while /health said healthy).
TEST(EngineProcess, AChildStoppedWhileIdleIsReplacedAndTheNextRequestIsAnswered) {
    EngineHost h = engine_process({}, {"--inference-timeout-sec", "4"});
    ASSERT_TRUE(h.running()) << h.log();
    const int64_t first = engine_pid(health(h));
    ASSERT_GT(first, 0);
    ASSERT_EQ(kill(pid_t(first), SIGSTOP), 0);
    const auto t0 = Clock::now();
    const Stream s = execute(h.port(), "after-stop", 3);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    EXPECT_EQ(s.terminals, 1u);
    EXPECT_EQ(s.last_event, "end") << s.terminal.dump();
    EXPECT_LT(ms, 12000);
    EXPECT_TRUE(wait_gone(first)) << "the stopped engine process was not killed";
    const json after = settled_health(h);
    EXPECT_EQ(after.value("status", ""), "healthy") << after.dump();
    EXPECT_NE(engine_pid(after), first);

    // Stopped again, and nothing sent: /health stops saying healthy with
    // the old process within the ping's bound.
    const int64_t second = engine_pid(after);
    ASSERT_GT(second, 0);
    ASSERT_EQ(kill(pid_t(second), SIGSTOP), 0);
    EXPECT_TRUE(wait_gone(second, 6000)) << "an idle stopped engine process went unnoticed";
    // Gone is not yet replaced: /health names the new process once the
    // scheduler has started it (a loaded machine may take a few seconds).
    json now = settled_health(h);
    for (auto until = Clock::now() + std::chrono::seconds(10); engine_pid(now) == second && Clock::now() < until;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        now = settled_health(h);
    }
    EXPECT_NE(engine_pid(now), second) << now.dump();
    EXPECT_EQ(h.stop(), 0) << h.log();
}

// A non-streamed request whose client closes its connection is cancelled
// at once: its sequence leaves the batch (and its KV blocks the pool)
// within the 200 ms poll, not when the answer would have been written.
TEST(EngineProcess, ANonStreamedRequestWhoseClientLeavesIsCancelledAtOnce) {
    for (bool child : {false, true}) {
        std::vector<std::string> args;
        if (child) args.push_back("--engine-process");
        EngineHost h(args, {{"EH_TEST_ENGINE_DELAY_MS", "20"}}, true, kTestEngine, kModel);
        ASSERT_TRUE(h.running()) << h.log();
        const int fd = connect_local(h.port());
        ASSERT_GE(fd, 0);
        ASSERT_TRUE(send_all(fd, build_request("POST", "/v1/completions",
                                               R"({"prompt":"Once upon a time","max_tokens":400})")));
        bool ran = false;
        for (int i = 0; i < 500 && !ran; ++i) {
            ran = health(h)["scheduler"].value("running", 0) == 1;
            if (!ran) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        ASSERT_TRUE(ran) << health(h).dump();
        close(fd);
        const auto t0 = Clock::now();
        bool left = false;
        while (!left && Clock::now() - t0 < std::chrono::seconds(5)) {
            left = health(h)["scheduler"].value("running", 1) == 0;
            if (!left) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
        EXPECT_TRUE(left) << "child " << child << ": the request ran on after its client left";
        EXPECT_LT(ms, 2000) << "child " << child;
    }
}

// The CPU reference engine with a pool that holds about three of twelve
// concurrent requests (stories260K, 256-token context, 1 MiB of KV): every
// request is answered, in process and with the engine in a child (issue
// 52, item 1: three answered and nine waited forever while the scheduler
// preempted and re-admitted millions of times).
TEST(EngineProcess, TwelveRequestsOverASmallKvPoolAllFinish) {
    std::string prompt;
    for (int i = 0; i < 55; ++i) prompt += (i % 7 == 0 ? "Lily " : i % 3 == 0 ? "went to the park " : "and ");
    const json body = {{"prompt", prompt}, {"max_tokens", 64}, {"temperature", 0}};
    for (bool child : {false, true}) {
        std::vector<std::string> args = {"--ctx-size", "256", "--kv-cache-size-mb", "1", "--device", "cpu"};
        if (child) args.push_back("--engine-process");
        EngineHost h(args, {}, true, EH_PLUGIN_DIR, stories_model());
        ASSERT_TRUE(h.running()) << h.log();
        // The pool must be over-subscribed several times for the test to mean anything.
        const json sched0 = health(h)["scheduler"];
        const size_t pool = sched0.value("kv_blocks_total", 0) * sched0.value("kv_block_tokens", 0);
        const size_t n_prompt = json::parse(h.post("/tokenize", json{{"text", prompt}}.dump()).body)["tokens"].size();
        ASSERT_GT(12 * (n_prompt + 64), 3 * pool) << n_prompt << " prompt tokens, a pool of " << pool;
        ASSERT_LT(n_prompt + 64, 256u);
        std::vector<int> status(12, 0);
        std::vector<std::thread> clients;
        for (size_t i = 0; i < status.size(); ++i)
            clients.emplace_back([&, i] { status[i] = h.post("/v1/completions", body.dump()).status; });
        for (auto& t : clients) t.join();
        for (size_t i = 0; i < status.size(); ++i) EXPECT_EQ(status[i], 200) << "child " << child << " request " << i;
        // The last answer can leave before the scheduler retires its
        // sequence (its next turn): nothing may stay running past that.
        json sched = health(h)["scheduler"];
        for (auto until = Clock::now() + std::chrono::seconds(5);
             sched.value("running", -1) != 0 && Clock::now() < until;) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            sched = health(h)["scheduler"];
        }
        EXPECT_EQ(sched.value("running", -1), 0) << sched.dump();
        EXPECT_LE(sched.value("preemptions", 0), 100) << sched.dump();
        EXPECT_EQ(h.stop(), 0) << h.log();
    }
}
