// The real engine-host process over loopback HTTP: event order, validation,
// cancel, disconnect, queue, timeout, shutdown, health, metrics, logs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine_host_process.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

std::string exec_body(const std::string& id, int max_tokens, const std::string& extra = "") {
    return R"({"job_id":")" + id + R"(","prompt":"Once upon a time","temperature":0,"seed":1,"max_tokens":)" +
           std::to_string(max_tokens) + extra + "}";
}

std::string text_of(const std::vector<SseEvent>& evs) {
    std::string s;
    for (auto& e : evs)
        if (e.event == "token") s += json::parse(e.data)["t"].get<std::string>();
    return s;
}

// A one-shot receiver of the ready callback on a free loopback port: it
// reads one request (up to the end of its JSON body), answers 200 and
// closes; wait() returns what it read. port is 0 when it could not listen.
struct CallbackReceiver {
    int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    int port = 0;
    std::string received;
    std::thread rx;

    CallbackReceiver() {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
        socklen_t len = sizeof a;
        getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
        ::listen(lfd, 4);
        port = ntohs(a.sin_port);
        rx = std::thread([this] {
            int c = ::accept(lfd, nullptr, nullptr);
            std::string buf;
            char tmp[4096];
            while (buf.find("}") == std::string::npos) {
                ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
                if (n <= 0) break;
                buf.append(tmp, size_t(n));
            }
            received = buf;
            send_all(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            ::close(c);
        });
    }
    std::string wait() {
        if (rx.joinable()) rx.join();
        return received;
    }
    ~CallbackReceiver() {
        if (rx.joinable()) {  // (a test that stopped early: unblock accept)
            ::shutdown(lfd, SHUT_RDWR);
            rx.join();
        }
        ::close(lfd);
    }
};

// One server for the tests that do not need special flags.
EngineHost& shared_host() {
    static EngineHost host({"--queue-size", "2"}, {{"EH_TEST_ENGINE_DELAY_MS", "2"}});
    return host;
}

}  // namespace

TEST(Server, ExecuteStreamsStartedTokensThenExactlyOneEnd) {
    auto& h = shared_host();
    auto r = h.post("/execute", exec_body("order", 10), {{"X-Correlation-Id", "corr-123"}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("content-type").rfind("text/event-stream", 0), 0u);
    EXPECT_EQ(r.header("x-correlation-id"), "corr-123");
    auto evs = parse_sse(r.body);
    ASSERT_GE(evs.size(), 3u);
    EXPECT_EQ(evs.front().event, "started");
    json st = json::parse(evs.front().data);
    EXPECT_EQ(st["job_id"], "order");
    EXPECT_EQ(st["model"], "stories260K");
    EXPECT_EQ(st["seed"], 1);
    EXPECT_EQ(st["correlation_id"], "corr-123");
    EXPECT_GT(st["prompt_tokens"].get<int>(), 0);
    EXPECT_TRUE(st.contains("started_at"));
    // The context at the start: the prompt used, the rest left for the output.
    EXPECT_EQ(st["tokens_used"], st["prompt_tokens"]);
    json health = json::parse(h.get("/health").body);
    EXPECT_EQ(st["tokens_remaining"].get<int>(), health["context_length"].get<int>() - st["prompt_tokens"].get<int>());
    int terminal = 0;
    int last_i = -1;
    for (size_t k = 1; k < evs.size(); ++k) {
        if (evs[k].event == "end" || evs[k].event == "error") {
            ++terminal;
            EXPECT_EQ(k, evs.size() - 1) << "nothing may follow the terminal event";
        } else {
            ASSERT_EQ(evs[k].event, "token");
            json t = json::parse(evs[k].data);
            EXPECT_EQ(t["correlation_id"], "corr-123") << "every frame carries the correlation id";
            EXPECT_GT(t["i"].get<int>(), last_i);
            last_i = t["i"];
        }
    }
    EXPECT_EQ(terminal, 1);
    json end = json::parse(evs.back().data);
    EXPECT_EQ(evs.back().event, "end");
    EXPECT_EQ(end["tokens_out"], 10);
    EXPECT_EQ(end["stop_reason"], "length");
    EXPECT_EQ(end["correlation_id"], "corr-123");
    EXPECT_TRUE(end.contains("decode_time_ms"));
    // The correlation id is in the job's log lines.
    bool logged = false;
    for (auto& j : h.log_events())
        if (j.value("event", "") == "execute_end" && j.value("correlation_id", "") == "corr-123") logged = true;
    EXPECT_TRUE(logged);
}

TEST(Server, TemperatureZeroIsRepeatableAndSeedIsReportedWhenGenerated) {
    auto& h = shared_host();
    auto a = parse_sse(h.post("/execute", exec_body("g1", 12)).body);
    auto b = parse_sse(h.post("/execute", exec_body("g2", 12)).body);
    EXPECT_EQ(text_of(a), text_of(b));
    auto c = parse_sse(h.post("/execute", R"({"job_id":"g3","prompt":"hi","max_tokens":1})").body);
    EXPECT_TRUE(json::parse(c.front().data)["seed"].is_number_unsigned());
}

TEST(Server, StopStringEndsGenerationAndNeverLeaks) {
    auto& h = shared_host();
    std::string full = text_of(parse_sse(h.post("/execute", exec_body("s0", 40)).body));
    ASSERT_GE(full.size(), 12u);
    // Pick a stop string from the middle of the known greedy output.
    size_t at = full.size() / 2;
    while (at < full.size() && (uint8_t(full[at]) & 0xC0) == 0x80) ++at;
    std::string stop = full.substr(at, 3);
    while (!stop.empty() && (uint8_t(stop.back()) & 0x80)) stop.pop_back();
    if (stop.empty()) GTEST_SKIP() << "no ASCII stop candidate in the output";
    json body = json::parse(exec_body("s1", 40));
    body["stop"] = {stop};
    auto evs = parse_sse(h.post("/execute", body.dump()).body);
    std::string got = text_of(evs);
    EXPECT_EQ(got, full.substr(0, full.find(stop)));
    EXPECT_EQ(got.find(stop), std::string::npos);
    EXPECT_EQ(json::parse(evs.back().data)["stop_reason"], "stop");
}

TEST(Server, ValidationErrorsAre400WithTheEnvelope) {
    auto& h = shared_host();
    auto r = h.post("/execute", R"({"job_id":"v","prompt":"x","max_tokens":5000})", {{"X-Correlation-Id", "c-v"}});
    EXPECT_EQ(r.status, 400);
    json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["code"], "INVALID_REQUEST");
    EXPECT_EQ(e["correlation_id"], "c-v");
    EXPECT_EQ(e["details"]["field"], "max_tokens");
    EXPECT_NE(e["message"].get<std::string>().find("5000"), std::string::npos);
}

TEST(Server, PromptPlusMaxTokensBeyondContextIsA400WithTheNumbers) {
    EngineHost h({"--ctx-size", "64"});
    std::string prompt(100, 'a');
    auto r = h.post("/execute", R"({"job_id":"c","prompt":")" + prompt + R"(","max_tokens":10})");
    EXPECT_EQ(r.status, 400) << r.body;
    std::string msg = json::parse(r.body)["error"]["message"];
    EXPECT_NE(msg.find("64"), std::string::npos) << msg;
    auto ok = h.post("/execute", R"({"job_id":"c2","prompt":"a b","max_tokens":10})");
    EXPECT_EQ(ok.status, 200);
}

TEST(Server, CancelStopsTheJobWithinAFewTokens) {
    EngineHost h({}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    std::atomic<int> after_cancel{0};
    std::atomic<bool> cancelled{false};
    std::string terminal;
    int seen = 0;
    auto r = sse_stream(h.port(), "/execute", exec_body("cx", 500), [&](const SseEvent& e) {
        if (e.event == "token") {
            if (cancelled) ++after_cancel;
            if (++seen == 3) {
                auto c = h.post("/cancel", R"({"job_id":"cx"})");
                EXPECT_EQ(c.status, 202);
                cancelled = true;
            }
        }
        if (e.event == "end" || e.event == "error") terminal = e.data;
        return true;
    });
    ASSERT_FALSE(terminal.empty());
    json t = json::parse(terminal);
    EXPECT_EQ(t["code"], "CANCELLED");
    EXPECT_LE(after_cancel.load(), 2) << "tokens streamed after the cancel request";
    // Idempotent.
    auto again = h.post("/cancel", R"({"job_id":"cx"})");
    EXPECT_EQ(again.status, 202);
    EXPECT_EQ(json::parse(again.body)["status"], "finished");
}

TEST(Server, ClientDisconnectCancelsTheJob) {
    EngineHost h({}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    int tokens = 0;
    sse_stream(h.port(), "/execute", exec_body("dc", 500), [&](const SseEvent& e) {
        return !(e.event == "token" && ++tokens == 2);  // hang up
    });
    bool cancelled = false;
    for (int i = 0; i < 300 && !cancelled; ++i) {
        for (auto& j : h.log_events())
            if (j.value("event", "") == "error" && j.value("job_id", "") == "dc" && j.value("code", "") == "CANCELLED")
                cancelled = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(cancelled) << h.log();
    EXPECT_EQ(h.get("/health").status, 200);
}

// --artifacts-dir: one record per /execute job, completed or not, with the
// request, the result and the SSE transcript as sent; the oldest go past
// --artifacts-max-files; the job id is kept to file-name characters.
TEST(Server, ArtifactRecordsOnePerJobBoundedInNumber) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("eh-artifacts-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    EngineHost h({"--artifacts-dir", dir.string(), "--artifacts-max-files", "2"}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    auto records = [&] {
        std::vector<fs::path> v;
        for (const auto& e : fs::directory_iterator(dir))
            if (e.path().extension() == ".json") v.push_back(e.path());
        std::sort(v.begin(), v.end());
        return v;
    };
    auto read = [](const fs::path& p) {
        std::ifstream f(p);
        return json::parse(f);
    };
    // A job that completes.
    auto r = h.post("/execute", exec_body("art-1", 5), {{"X-Correlation-Id", "corr-art"}});
    ASSERT_EQ(r.status, 200) << r.body;
    auto v = records();
    ASSERT_EQ(v.size(), 1u);
    json rec = read(v[0]);
    EXPECT_EQ(rec["job_id"], "art-1");
    EXPECT_EQ(rec["status"], "completed");
    EXPECT_EQ(rec["correlation_id"], "corr-art");
    EXPECT_EQ(rec["request"]["prompt"], "Once upon a time");
    EXPECT_EQ(rec["request"]["max_tokens"], 5);
    EXPECT_EQ(rec["max_tokens"], 5);
    EXPECT_EQ(rec["seed"], 1);
    EXPECT_EQ(rec["tokens_out"], 5);
    EXPECT_TRUE(rec.contains("decode_time_ms"));
    EXPECT_GT(rec["ctx"].get<int>(), 0);
    EXPECT_FALSE(rec["engine"].get<std::string>().empty());
    EXPECT_EQ(rec["sampler_profile_version"], "1");
    EXPECT_FALSE(rec["model_ref"].get<std::string>().empty());
    EXPECT_EQ(rec["transcript"], r.body) << "the transcript is the stream as sent";
    EXPECT_EQ(rec["transcript_truncated"], false);
    // A job the client cancels: a failed record with its partial transcript.
    bool cancelled = false;
    sse_stream(h.port(), "/execute", exec_body("art/2 x", 500), [&](const SseEvent& e) {
        if (e.event == "token" && !cancelled) {
            cancelled = true;
            EXPECT_EQ(h.post("/cancel", R"({"job_id":"art/2 x"})").status, 202);
        }
        return true;
    });
    v = records();
    ASSERT_EQ(v.size(), 2u);
    EXPECT_NE(v[1].filename().string().find("-art_2_x.json"), std::string::npos) << v[1];
    rec = read(v[1]);
    EXPECT_EQ(rec["job_id"], "art/2 x");
    EXPECT_EQ(rec["status"], "failed");
    EXPECT_EQ(rec["code"], "CANCELLED");
    EXPECT_TRUE(rec.contains("retriable"));
    EXPECT_NE(rec["transcript"].get<std::string>().find("event: error"), std::string::npos);
    // A third job: the oldest record goes.
    ASSERT_EQ(h.post("/execute", exec_body("art-3", 2)).status, 200);
    v = records();
    ASSERT_EQ(v.size(), 2u);
    EXPECT_EQ(read(v[0])["job_id"], "art/2 x");
    EXPECT_EQ(read(v[1])["job_id"], "art-3");
    // A client that hangs up: the record is written when the stream closes.
    int tokens = 0;
    sse_stream(h.port(), "/execute", exec_body("art-4", 500), [&](const SseEvent& e) {
        return !(e.event == "token" && ++tokens == 2);
    });
    json last;
    for (int i = 0; i < 300; ++i) {
        v = records();
        if (!v.empty() && (last = read(v.back()))["job_id"] == "art-4") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(last["job_id"], "art-4");
    EXPECT_EQ(last["status"], "failed");
    EXPECT_EQ(last["code"], "CANCELLED");
    EXPECT_NE(last["transcript"].get<std::string>().find("event: token"), std::string::npos);
    // The model file's digest (hashed in the background; a 1 MB file is done by now).
    std::string want;
    if (FILE* p = popen(("sha256sum " + stories_model()).c_str(), "r")) {
        char buf[65] = {};
        if (fread(buf, 1, 64, p) == 64) want = buf;
        pclose(p);
    }
    ASSERT_EQ(want.size(), 64u);
    EXPECT_EQ(last["model_sha256"], want);
    fs::remove_all(dir);
}

TEST(Server, ArtifactsDirThatCannotBeCreatedIsAUsageError) {
    EngineHost h({"--artifacts-dir", "/proc/eh-no-such/artifacts"}, {}, false);
    EXPECT_EQ(h.wait_exit(20000), 2) << h.log();
}

TEST(Server, FullQueueAnswers503WithRetryAfter) {
    EngineHost h({"--queue-size", "1"}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    std::vector<std::thread> ts;
    std::atomic<int> started{0};
    for (const char* id : {"q1", "q2"}) {
        ts.emplace_back([&, id] {
            sse_stream(h.port(), "/execute", exec_body(id, 60), [&](const SseEvent& e) {
                if (e.event == "started") ++started;
                return true;
            });
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    auto r = h.post("/execute", exec_body("q3", 5));
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_FALSE(r.header("retry-after").empty());
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "QUEUE_FULL");
    // Health and metrics are not blocked by the running job.
    EXPECT_EQ(h.get("/health").status, 200);
    EXPECT_EQ(h.get("/metrics").status, 200);
    h.post("/cancel", R"({"job_id":"q1"})");
    h.post("/cancel", R"({"job_id":"q2"})");
    for (auto& t : ts) t.join();
}

TEST(Server, InferenceTimeoutEndsWithInferenceTimeout) {
    EngineHost h({"--inference-timeout-sec", "1"}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    auto evs = parse_sse(h.post("/execute", exec_body("to", 2000)).body);
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.back().event, "error");
    EXPECT_EQ(json::parse(evs.back().data)["code"], "INFERENCE_TIMEOUT");
}

TEST(Server, SigtermMidJobExitsZero) {
    EngineHost h({"--shutdown-grace-ms", "200"}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    std::string terminal;
    std::thread client([&] {
        sse_stream(h.port(), "/execute", exec_body("st", 2000), [&](const SseEvent& e) {
            if (e.event == "error" || e.event == "end") terminal = e.event + " " + e.data;
            return true;
        });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(h.stop(SIGTERM), 0) << h.log();
    client.join();
    EXPECT_NE(terminal.find("SHUTTING_DOWN"), std::string::npos) << terminal;
    bool shutdown_logged = false;
    for (auto& j : h.log_events()) shutdown_logged = shutdown_logged || j.value("event", "") == "shutdown";
    EXPECT_TRUE(shutdown_logged);
}

TEST(Server, ShutdownEndpointWhenEnabled) {
    EngineHost h({"--allow-shutdown-endpoint"});
    EXPECT_EQ(h.post("/shutdown", "").status, 202);
    EXPECT_EQ(h.wait_exit(), 0);
    EngineHost off;
    EXPECT_EQ(off.post("/shutdown", "").status, 404);
}

TEST(Server, HealthReportsTheModelAndUnhealthyWhenNotResident) {
    auto& h = shared_host();
    auto r = h.get("/health");
    ASSERT_EQ(r.status, 200);
    json j = json::parse(r.body);
    for (const char* k : {"status", "model", "resident", "quant_kind", "vram_bytes_used", "tokenizer_kind", "vocab_size",
                          "context_length", "uptime_seconds", "plugin", "sm", "cuda_runtime_version"})
        EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j["status"], "healthy");
    EXPECT_TRUE(j["cuda_runtime_version"].is_null()) << j.dump();  // the test engine has no CUDA runtime
    EXPECT_EQ(j["vocab_size"], 512);
    EXPECT_EQ(j["bos_id"], 1) << j.dump();  // stories260K's tokenizer (the worker contract's bos_id / eos_id)
    EXPECT_EQ(j["eos_id"], 2) << j.dump();
    EXPECT_EQ(j["plugin"]["name"], "test-engine");
    EngineHost bad({}, {{"EH_TEST_ENGINE_NOT_RESIDENT", "1"}}, false);
    json b;
    for (int i = 0; i < 300; ++i) {
        auto hr = bad.get("/health");
        b = json::parse(hr.body);
        if (b["status"] != "loading") {
            EXPECT_EQ(hr.status, 503);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(b["status"], "unhealthy");
    EXPECT_EQ(b["resident"], false);
}

TEST(Server, CapabilitiesListsLimitsAndPlugins) {
    auto& h = shared_host();
    json j = json::parse(h.get("/capabilities").body);
    EXPECT_EQ(j["api_version"], "1");
    EXPECT_EQ(j["engine"], "test");
    EXPECT_EQ(j["max_tokens_out"], 2048);
    EXPECT_EQ(j["concurrency"]["slots"], 1);
    EXPECT_TRUE(j["plugins"]["rejected"].is_array());
    EXPECT_EQ(j["plugins"]["accepted"].size(), 1u);
    EXPECT_TRUE(j["sampler"].contains("top_p"));
}

// The worker contract's capabilities route, beside /capabilities.
TEST(Server, V1CapabilitiesListsEachEngine) {
    auto& h = shared_host();
    auto r = h.get("/v1/capabilities");
    ASSERT_EQ(r.status, 200);
    json j = json::parse(r.body);
    EXPECT_EQ(j["api_version"], "1");
    ASSERT_EQ(j["engines"].size(), 1u);
    const json& e = j["engines"][0];
    EXPECT_EQ(e["engine"], "test");
    EXPECT_EQ(e["engine_version"], "1.0.0");
    EXPECT_EQ(e["sampler_profile_version"], "1");
    EXPECT_EQ(e["ctx_max"], j["ctx_max"]);
    EXPECT_EQ(e["max_tokens_out"], 2048);
    EXPECT_EQ(e["concurrency"]["slots"], 1);
    EXPECT_EQ(e["supported_workloads"], json({"generate", "chat", "tokenize", "detokenize"}));
    EXPECT_EQ(json::parse(h.get("/capabilities").body)["engines"], j["engines"]);
}

TEST(Server, MetricsParseAsPrometheusText) {
    auto& h = shared_host();
    h.post("/execute", exec_body("m1", 3));
    auto r = h.get("/metrics");
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.header("content-type").rfind("text/plain", 0), 0u);
    std::istringstream in(r.body);
    std::string line;
    int samples = 0;
    std::set<std::string> names;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        if (line[0] == '#') {
            EXPECT_TRUE(line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) << line;
            continue;
        }
        // name{labels} value
        size_t sp = line.rfind(' ');
        ASSERT_NE(sp, std::string::npos) << line;
        std::string name = line.substr(0, std::min(line.find('{'), sp));
        for (char c : name) EXPECT_TRUE(std::isalnum(uint8_t(c)) || c == '_' || c == ':') << line;
        EXPECT_NO_THROW((void)std::stod(line.substr(sp + 1))) << line;
        EXPECT_EQ(line.find("m1"), std::string::npos) << "job ids must not be labels";
        names.insert(name);
        ++samples;
    }
    EXPECT_GT(samples, 10);
    for (const char* n : {"eh_requests_total", "eh_generated_tokens_total", "eh_prompt_tokens_total",
                          "eh_time_to_first_token_seconds_bucket", "eh_inter_token_latency_seconds_bucket",
                          "eh_queue_depth", "eh_vram_bytes", "eh_uptime_seconds"})
        EXPECT_TRUE(names.count(n)) << n;
}

TEST(Server, TokenizeAndDetokenizeRoundTrip) {
    auto& h = shared_host();
    auto t = h.post("/tokenize", R"({"text":"hello world","add_special":false})");
    ASSERT_EQ(t.status, 200) << t.body;
    json tj = json::parse(t.body);
    EXPECT_EQ(tj["count"], tj["tokens"].size());
    auto d = h.post("/detokenize", json({{"tokens", tj["tokens"]}}).dump());
    ASSERT_EQ(d.status, 200);
    EXPECT_NE(json::parse(d.body)["text"].get<std::string>().find("hello world"), std::string::npos);
    EXPECT_EQ(h.post("/detokenize", R"({"tokens":[99999]})").status, 400);
}

TEST(Server, LogsAreJsonLinesWithTheNamedEvents) {
    auto& h = shared_host();
    h.post("/execute", exec_body("lg", 2));
    json om = json::parse(exec_body("om", 2));
    om["output_mode"] = "edits";
    ASSERT_EQ(h.post("/execute", om.dump()).status, 200);
    std::set<std::string> events;
    for (auto& j : h.log_events()) {
        events.insert(j.value("event", ""));
        EXPECT_TRUE(j.contains("worker_id") && j.contains("model") && j.contains("gpu")) << j.dump();
        EXPECT_FALSE(j.contains("prompt")) << "prompts are logged only with --log-content";
    }
    for (const char* e : {"startup", "model_load_start", "model_load_progress", "model_load_complete", "ready",
                          "execute_start", "execute_end"})
        EXPECT_TRUE(events.count(e)) << e;
    // A job's log names the plugin that ran it and the sampling it ran with.
    bool start_seen = false;
    for (auto& j : h.log_events()) {
        if (j.value("event", "") != "execute_start" || j.value("job_id", "") != "lg") continue;
        start_seen = true;
        EXPECT_EQ(j.value("plugin", ""), "test-engine") << j.dump();
        EXPECT_EQ(j.value("plugin_version", ""), "1.0.0") << j.dump();
        ASSERT_TRUE(j.contains("sampling") && j["sampling"].is_object()) << j.dump();
        for (const char* k : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                              "frequency_penalty"})
            EXPECT_TRUE(j["sampling"].contains(k)) << k << " in " << j.dump();
    }
    EXPECT_TRUE(start_seen);
    bool mode_seen = false;
    for (auto& j : h.log_events())
        if (j.value("event", "") == "execute_start" && j.value("job_id", "") == "om")
            mode_seen = j.value("output_mode", "") == "edits";
    EXPECT_TRUE(mode_seen) << "output_mode is recorded in the job's log";
    int marks = 0;
    for (auto& j : h.log_events())
        if (j.value("event", "") == "model_load_progress") ++marks;
    EXPECT_GE(marks, 5);
}

TEST(Server, CorsOnlyWithTheFlag) {
    auto& off = shared_host();
    auto r = http(off.port(), "GET", "/health", "", {{"Origin", "http://localhost:3000"}});
    EXPECT_TRUE(r.header("access-control-allow-origin").empty());
    EngineHost on({"--cors"});
    auto r2 = http(on.port(), "GET", "/health", "", {{"Origin", "http://localhost:3000"}});
    EXPECT_EQ(r2.header("access-control-allow-origin"), "http://localhost:3000");
    auto pre = http(on.port(), "OPTIONS", "/execute", "", {{"Origin", "http://localhost:3000"}});
    EXPECT_EQ(pre.status, 204);
    auto foreign = http(on.port(), "GET", "/health", "", {{"Origin", "http://evil.example"}});
    EXPECT_TRUE(foreign.header("access-control-allow-origin").empty());
}

TEST(Server, CliRejectsABadWorkerId) {
    EngineHost h({"--worker-id", "not-a-uuid"}, {}, false);
    EXPECT_EQ(h.wait_exit(), 2);
}

// --prefill-chunk-tokens reaches the scheduler (/health reports it, 512 by
// default) and is range-checked like --batch-tokens (exit 2 outside 16-65536).
TEST(Server, PrefillChunkTokensIsReportedAndRangeChecked) {
    EXPECT_EQ(json::parse(shared_host().get("/health").body)["scheduler"]["prefill_chunk_tokens"], 512);
    EngineHost h({"--prefill-chunk-tokens", "100"});
    ASSERT_GT(h.port(), 0) << h.log();
    EXPECT_EQ(json::parse(h.get("/health").body)["scheduler"]["prefill_chunk_tokens"], 100);
    for (const char* bad : {"15", "65537", "x"}) {
        EngineHost b({"--prefill-chunk-tokens", bad}, {}, false);
        EXPECT_EQ(b.wait_exit(), 2) << bad;
    }
}

TEST(Server, CallbackIsPostedOnceListeningAndAFailedOneExitsNonZero) {
    CallbackReceiver rx;
    ASSERT_GT(rx.port, 0);
    const std::string wid = "123e4567-e89b-42d3-a456-426614174000";
    EngineHost h({"--callback-url", "http://127.0.0.1:" + std::to_string(rx.port) + "/workers", "--worker-id", wid});
    const std::string received = rx.wait();
    json body = json::parse(received.substr(received.find("\r\n\r\n") + 4));
    EXPECT_EQ(body["worker_id"], wid);
    EXPECT_EQ(body["uri"], "http://127.0.0.1:" + std::to_string(h.port()));
    EXPECT_TRUE(body.contains("vram_bytes") && body.contains("model_ref"));
    EXPECT_TRUE(h.running());

    EngineHost fail({"--callback-url", "http://127.0.0.1:1/none"}, {}, false);
    EXPECT_EQ(fail.wait_exit(), 1);
}

// The callback's vram_bytes is the service's figure, the weights and the KV
// pool kv_init allocated (issue 53: it used to be the load's, weights alone),
// the same as /health's vram_bytes_used.
TEST(Server, CallbackVramCountsTheKvPool) {
    CallbackReceiver rx;
    ASSERT_GT(rx.port, 0);
    EngineHost h({"--callback-url", "http://127.0.0.1:" + std::to_string(rx.port) + "/workers"},
                 {{"EH_TEST_ENGINE_DEVICE_BYTES", "1000000"}}, true, std::string(EH_TEST_PLUGIN_DIR) + "/step-only");
    const std::string received = rx.wait();
    const json body = json::parse(received.substr(received.find("\r\n\r\n") + 4));
    const json health = json::parse(h.get("/health").body);
    EXPECT_EQ(health["vram_bytes_model"], 1000000);
    EXPECT_GT(body["vram_bytes"].get<uint64_t>(), 1000000u) << received;
    EXPECT_EQ(body["vram_bytes"], health["vram_bytes_used"]) << received;
}

TEST(Server, LogContentAndTextFormatAreOptIn) {
    EngineHost h({"--log-content"});
    h.post("/execute", R"({"job_id":"lc","prompt":"secret words","max_tokens":2})");
    bool prompt_logged = false;
    for (auto& j : h.log_events())
        if (j.value("event", "") == "execute_start" && j.value("prompt", "") == "secret words") prompt_logged = true;
    EXPECT_TRUE(prompt_logged);
    EngineHost t({"--log-format", "text"});
    EXPECT_TRUE(t.log_events().empty()) << "text logs are not JSON";
    EXPECT_NE(t.log().find(" ready "), std::string::npos) << t.log();
}

// Text logs quote a value with a control character or a space, so a job_id
// holding a newline cannot forge a log line.
TEST(Server, TextLogsCannotBeForgedThroughAJobId) {
    EngineHost h({"--log-format", "text"});
    auto r = h.post("/execute", R"({"job_id":"a\nFORGED error event=shutdown","prompt":"hi","max_tokens":2})");
    EXPECT_EQ(r.status, 200) << r.body;
    const std::string log = h.log();
    EXPECT_EQ(log.find("\nFORGED"), std::string::npos) << log;
    EXPECT_NE(log.find(R"(job_id="a\nFORGED error event=shutdown")"), std::string::npos) << log;
}

TEST(Server, KvCacheSizeSetsTheContext) {
    EngineHost h({"--kv-cache-size-mb", "1"});
    json j = json::parse(h.get("/health").body);
    int ctx = j["context_length"];
    EXPECT_GT(ctx, 16);
    EXPECT_LT(ctx, 2048) << "1 MiB of KV holds fewer tokens than the trained context";
    EngineHost too_big({"--ctx-size", "999999"}, {}, false);
    EXPECT_EQ(too_big.wait_exit(), 2) << too_big.log();
}

// The server listens before the model is loaded: /health says "loading"
// with a 503 (and generation is refused with MODEL_LOADING) until it is ready.
TEST(Server, HealthIs503WhileTheModelLoads) {
    EngineHost h({"--log-format", "text"}, {{"EH_TEST_ENGINE_LOAD_DELAY_MS", "1500"}}, false);
    ASSERT_GT(h.port(), 0) << h.log();
    auto early = h.get("/health");
    EXPECT_EQ(early.status, 503) << early.body;
    EXPECT_EQ(json::parse(early.body)["status"], "loading") << early.body;
    auto refused = h.post("/execute", exec_body("too-early", 2));
    EXPECT_EQ(refused.status, 503) << refused.body;
    EXPECT_NE(refused.body.find("MODEL_LOADING"), std::string::npos) << refused.body;
    bool ready = false;
    for (int i = 0; i < 100 && !ready; ++i) {
        ready = h.get("/health").status == 200;
        if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(ready) << h.log();
}

// `engine-host loadgen` against a live server: every level sends 2N
// requests and counts the completion tokens the server reports.
TEST(Server, LoadgenReportsEveryLevel) {
    EngineHost h;
    ASSERT_GT(h.port(), 0) << h.log();
    const std::string cmd = std::string(EH_ENGINE_HOST) + " loadgen --url http://127.0.0.1:" + std::to_string(h.port()) +
                            " --levels 1,3 -n 4 --json 2>&1";
    const auto [status, out] = run_command(cmd);
    ASSERT_NE(status, -1);
    EXPECT_EQ(status, 0) << out;
    json j = json::parse(out);
    ASSERT_EQ(j["levels"].size(), 2u) << out;
    EXPECT_EQ(j["levels"][0]["clients"], 1);
    EXPECT_EQ(j["levels"][0]["requests"], 2);
    EXPECT_EQ(j["levels"][1]["requests"], 6);
    for (auto& l : j["levels"]) {
        EXPECT_EQ(l["failed"], 0) << out;
        EXPECT_EQ(l["completion_tokens"], l["requests"].get<int>() * 4) << out;
        EXPECT_GT(l["tokens_per_s"].get<double>(), 0.0);
    }
    // A bad level is a usage error, a dead server a clear failure.
    EXPECT_NE(std::system((std::string(EH_ENGINE_HOST) + " loadgen --levels 0 > /dev/null 2>&1").c_str()), 0);
    EXPECT_NE(std::system((std::string(EH_ENGINE_HOST) + " loadgen --extra '[1]' > /dev/null 2>&1").c_str()), 0);
    EXPECT_NE(std::system((std::string(EH_ENGINE_HOST) + " loadgen --url http://127.0.0.1:1 > /dev/null 2>&1").c_str()), 0);
}

// `loadgen --workload chat`: streamed requests drawn from the seed (a
// shared preamble, drawn prompt and answer lengths). The JSON's counts agree
// with each other and with the server (the CPU reference on stories260K):
// every answer is as long as a draw allows (ignore_eos), percentiles are
// ordered, the same seed sends the same requests, and the preamble is really
// shared: the server's prefix-cache counter rises by exactly the reuse usage
// reports, and by nothing when no request carries the preamble.
TEST(Server, LoadgenChatWorkloadSharesItsPreambleAndReportsPercentiles) {
    // The CPU reference: batched steps and forks, so a prefix cache.
    EngineHost h({}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    const std::string base = std::string(EH_ENGINE_HOST) + " loadgen --url http://127.0.0.1:" + std::to_string(h.port()) +
                             " --workload chat --preamble-words 40 --prompt-words 5:20 --answer-tokens 3:6"
                             " --requests-per-client 4 --levels 1,2 --json";
    auto hit_tokens = [&] {
        return json::parse(h.get("/health").body)["scheduler"]["prefix_cache_hit_tokens"].get<uint64_t>();
    };
    auto run = [&](const std::string& flags, uint64_t* cached) {
        const uint64_t before = hit_tokens();
        const auto [status, out] = run_command(base + " " + flags + " 2>&1");
        EXPECT_EQ(status, 0) << out;
        json j = json::parse(out, nullptr, false);
        if (j.is_discarded() || !j.contains("levels") || j["levels"].size() != 2) {
            ADD_FAILURE() << out;
            return json();
        }
        EXPECT_EQ(j["workload"], "chat");
        EXPECT_EQ(j["chat"]["preamble_words"], 40);
        EXPECT_EQ(j["chat"]["answer_tokens"], json::array({3, 6}));
        *cached = 0;
        for (auto& l : j["levels"]) {
            const uint64_t n = l["requests"];
            EXPECT_EQ(n, l["clients"].get<uint64_t>() * 4) << out;
            EXPECT_EQ(l["failed"], 0) << out;
            EXPECT_GE(l["completion_tokens"].get<uint64_t>(), 3 * n) << out;
            EXPECT_LE(l["completion_tokens"].get<uint64_t>(), 6 * n) << out;
            for (const char* m : {"ttft", "tpot", "latency"}) {
                const double p50 = l[std::string(m) + "_p50_s"], p95 = l[std::string(m) + "_p95_s"],
                             p99 = l[std::string(m) + "_p99_s"];
                EXPECT_GT(p50, 0.0) << m << " " << out;
                EXPECT_LE(p50, p95) << m;
                EXPECT_LE(p95, p99) << m;
            }
            EXPECT_LT(l["ttft_p50_s"].get<double>(), l["latency_p99_s"].get<double>());
            EXPECT_LT(l["cached_prompt_tokens"].get<uint64_t>(), l["prompt_tokens"].get<uint64_t>()) << out;
            *cached += l["cached_prompt_tokens"].get<uint64_t>();
        }
        EXPECT_EQ(hit_tokens() - before, *cached) << "the server reused what usage says it did\n" << out;
        return j;
    };
    uint64_t cached = 0;
    const json shared = run("--shared-prefix 1", &cached);
    ASSERT_FALSE(shared.is_null());
    for (auto& l : shared["levels"]) EXPECT_EQ(l["shared_prefix_requests"], l["requests"]);
    // One client's later requests reuse its first one's preamble.
    EXPECT_GT(shared["levels"][0]["cached_prompt_tokens"].get<uint64_t>(), 0u);

    // The same seed: the same prompts and answer lengths (now all cached).
    uint64_t again_cached = 0;
    const json again = run("--shared-prefix 1", &again_cached);
    ASSERT_FALSE(again.is_null());
    EXPECT_GT(again_cached, cached);
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(again["levels"][i]["prompt_tokens"], shared["levels"][i]["prompt_tokens"]);
        EXPECT_EQ(again["levels"][i]["completion_tokens"], shared["levels"][i]["completion_tokens"]);
    }

    // No preamble anywhere, another seed: nothing to reuse.
    uint64_t none_cached = 1;
    const json alone = run("--shared-prefix 0 --seed 7", &none_cached);
    ASSERT_FALSE(alone.is_null());
    EXPECT_EQ(none_cached, 0u);
    for (auto& l : alone["levels"]) EXPECT_EQ(l["shared_prefix_requests"], 0);
    EXPECT_NE(alone["levels"][0]["prompt_tokens"], shared["levels"][0]["prompt_tokens"]);

    // The table names the reuse; bad settings are usage errors (exit 2).
    const auto [table_status, table] =
        run_command(std::string(EH_ENGINE_HOST) + " loadgen --url http://127.0.0.1:" + std::to_string(h.port()) +
                    " --workload chat --preamble-words 10 --prompt-words 3:5 --answer-tokens 2 --levels 1 2>&1");
    EXPECT_EQ(table_status, 0) << table;
    EXPECT_NE(table.find("reused from the prefix cache"), std::string::npos) << table;
    EXPECT_NE(table.find("TPOT p99 ms"), std::string::npos) << table;
    const std::string cli = std::string(EH_ENGINE_HOST) + " loadgen --url http://127.0.0.1:" + std::to_string(h.port());
    for (const char* bad : {" --workload chat --prompt-words 30:20", " --workload chat --prompt-words 0:5",
                            " --workload chat --answer-tokens 1:70000", " --workload chat --shared-prefix 1.5",
                            " --workload chat -n 5", " --seed 3", " --workload story"}) {
        const auto [st, out] = run_command(cli + bad + " 2>&1");
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << bad << ": " << out;
        EXPECT_NE(out.find("--"), std::string::npos) << bad << ": " << out;
    }
}

// `loadgen --stream`: each request is streamed; TTFT and TPOT come from the
// chunks' arrival. The engine sleeps 30 ms in every decode step, so the time
// per output token after the first is at least that, and the first token
// comes before the request ends. `--extra` reaches the server: a field it
// refuses fails every request.
TEST(Server, LoadgenStreamsAndMeasuresTimeToFirstTokenAndPerToken) {
    EngineHost h({}, {{"EH_TEST_ENGINE_DELAY_MS", "30"}});
    ASSERT_GT(h.port(), 0) << h.log();
    const std::string base = std::string(EH_ENGINE_HOST) + " loadgen --url http://127.0.0.1:" + std::to_string(h.port());
    const auto [status, out] = run_command(base + " --levels 1,2 -n 5 --stream --json 2>&1");
    ASSERT_EQ(status, 0) << out;
    json j = json::parse(out);
    ASSERT_EQ(j["levels"].size(), 2u) << out;
    for (auto& l : j["levels"]) {
        EXPECT_EQ(l["failed"], 0) << out;
        EXPECT_EQ(l["completion_tokens"], l["requests"].get<int>() * 5) << out;
        const double ttft = l["ttft_p50_s"], tpot = l["tpot_p50_s"], latency = l["latency_p50_s"];
        EXPECT_GT(ttft, 0.0) << out;
        EXPECT_LT(ttft, latency) << out;
        EXPECT_GE(tpot, 0.029) << out;  // each later token waited for a 30 ms step
        EXPECT_GE(l["tpot_p95_s"].get<double>(), tpot) << out;
    }
    const auto [table_status, table] = run_command(base + " --levels 1 -n 3 --stream 2>&1");
    ASSERT_EQ(table_status, 0) << table;
    EXPECT_NE(table.find("TPOT p50 ms"), std::string::npos) << table;
    const auto [refused_status, refused] = run_command(base + " --levels 1 -n 3 --stream --extra '{\"best_of\": 3}' 2>&1");
    EXPECT_NE(refused_status, 0) << refused;
    EXPECT_NE(refused.find("best_of"), std::string::npos) << refused;
}
