// What the distributed serving stacks (the Gateway API Inference Extension's
// endpoint picker, llm-d, KServe) ask of a model server, against the real
// engine-host with the shipped model: the model-server protocol's gauges
// under vLLM's names, readiness apart from liveness, draining on SIGTERM,
// --served-model-name, and the routing headers in the access log.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <optional>
#include <regex>
#include <thread>

#include "engine_host_process.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

const std::string kModel = EH_DEFAULT_MODEL;
const std::string kTestEngine = std::string(EH_TEST_PLUGIN_DIR) + "/good";

EngineHost test_engine(std::vector<std::string> args = {}, std::map<std::string, std::string> env = {},
                       bool wait_ready = true) {
    return EngineHost(std::move(args), std::move(env), wait_ready, kTestEngine, kModel);
}

// The value of the first sample of `name` (labels or not); nullopt if absent.
std::optional<double> sample(const std::string& text, const std::string& name, std::string* labels = nullptr) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
        const char next = line[name.size()];
        if (next != '{' && next != ' ') continue;
        const size_t sp = line.rfind(' ');
        if (labels) *labels = next == '{' ? line.substr(name.size(), line.find('}') - name.size() + 1) : "";
        return std::stod(line.substr(sp + 1));
    }
    return std::nullopt;
}

bool has_line(const std::string& text, const std::string& line) {
    return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

std::string completion(int max_tokens, bool stream, const std::string& model = "") {
    json b = {{"prompt", "Once upon a time"}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", stream}};
    if (!model.empty()) b["model"] = model;
    return b.dump();
}

// Polls `pred` every 10 ms for at most `ms`.
template <class F>
bool eventually(F pred, int ms = 5000) {
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred();
}

// ---- the model-server protocol's gauges -----------------------------------------

// The endpoint picker's default metric names, their types, the labels vLLM
// gives them, and their values following the load: with one request running
// (the test engine runs one sequence at a time) the others wait.
TEST(ModelServerProtocol, VllmGaugesCarryTheirNamesTypesAndFollowTheLoad) {
    EngineHost h = test_engine({"--served-model-name", "tales"}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    ASSERT_GT(h.port(), 0);
    std::string m = h.get("/metrics").body;
    for (const char* name : {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                             "vllm:gpu_cache_usage_perc", "vllm:cache_config_info"})
        EXPECT_TRUE(has_line(m, std::string("# TYPE ") + name + " gauge")) << name << "\n" << m;
    std::string labels;
    EXPECT_EQ(sample(m, "vllm:num_requests_waiting", &labels), 0.0);
    EXPECT_EQ(labels, R"({model_name="tales",engine="0"})");
    EXPECT_EQ(sample(m, "vllm:num_requests_running"), 0.0);
    EXPECT_EQ(sample(m, "vllm:kv_cache_usage_perc"), 0.0);
    // block_size and num_gpu_blocks as /health reports the pool.
    json health = json::parse(h.get("/health").body);
    ASSERT_EQ(sample(m, "vllm:cache_config_info", &labels), 1.0);
    EXPECT_NE(labels.find("block_size=\"" + std::to_string(health["scheduler"]["kv_block_tokens"].get<int>()) + "\""),
              std::string::npos) << labels;
    EXPECT_NE(labels.find("num_gpu_blocks=\"" + std::to_string(health["scheduler"]["kv_blocks_total"].get<int>()) + "\""),
              std::string::npos) << labels;

    std::vector<std::thread> clients;
    std::atomic<int> ok{0};
    for (int i = 0; i < 3; ++i)
        clients.emplace_back([&] {
            if (h.post("/v1/completions", completion(30, false)).status == 200) ++ok;
        });
    double max_waiting = 0, max_running = 0, max_usage = 0;
    EXPECT_TRUE(eventually([&] {
        const std::string t = h.get("/metrics").body;
        max_waiting = std::max(max_waiting, sample(t, "vllm:num_requests_waiting").value_or(-1));
        max_running = std::max(max_running, sample(t, "vllm:num_requests_running").value_or(-1));
        max_usage = std::max(max_usage, sample(t, "vllm:kv_cache_usage_perc").value_or(-1));
        EXPECT_EQ(sample(t, "vllm:gpu_cache_usage_perc"), sample(t, "vllm:kv_cache_usage_perc"));
        return max_waiting >= 1 && max_running == 1 && max_usage > 0;
    })) << "waiting " << max_waiting << " running " << max_running << " usage " << max_usage;
    EXPECT_EQ(max_running, 1);  // one sequence at a time
    for (auto& t : clients) t.join();
    EXPECT_EQ(ok.load(), 3);
    // A reply's last byte can reach the client a moment before its
    // sequence is released: the gauges settle, they need not be 0 at once.
    EXPECT_TRUE(eventually([&] {
        m = h.get("/metrics").body;
        return sample(m, "vllm:num_requests_waiting") == 0.0 && sample(m, "vllm:num_requests_running") == 0.0 &&
               sample(m, "vllm:kv_cache_usage_perc") == 0.0;
    })) << m;
}

// vLLM's kv_cache_usage_perc counts the blocks running requests hold; a
// finished request's blocks kept for prefix reuse are evictable, so free.
// eh_kv_cache_usage_perc counts them. The CPU reference engine (blocks,
// prefix cache) on the shipped model.
TEST(ModelServerProtocol, KvUsageCountsRunningRequestsNotCachedPrefixes) {
    EngineHost h({"--served-model-name", "tales"}, {}, true, EH_PLUGIN_DIR, kModel);
    ASSERT_GT(h.port(), 0);
    std::string labels;
    ASSERT_EQ(sample(h.get("/metrics").body, "vllm:cache_config_info", &labels), 1.0);
    EXPECT_NE(labels.find("block_size=\"16\""), std::string::npos) << labels;
    EXPECT_NE(labels.find("enable_prefix_caching=\"True\""), std::string::npos) << labels;
    double during = -1, eh_during = -1;
    int chunks = 0;
    sse_stream(h.port(), "/v1/completions", completion(120, true), [&](const SseEvent&) {
        if (++chunks == 20) {
            const std::string t = h.get("/metrics").body;
            during = sample(t, "vllm:kv_cache_usage_perc").value_or(-1);
            eh_during = sample(t, "eh_kv_cache_usage_perc").value_or(-1);
        }
        return true;
    });
    ASSERT_GE(chunks, 20);
    EXPECT_GT(during, 0);
    EXPECT_NEAR(during, eh_during, 1e-9);  // nothing cached yet: the same blocks
    // The stream's end can reach the client a moment before the sequence's
    // blocks pass to the prefix cache.
    std::string after;
    EXPECT_TRUE(eventually([&] {
        after = h.get("/metrics").body;
        return sample(after, "vllm:kv_cache_usage_perc") == 0.0 && sample(after, "eh_prefix_cache_entries") == 1.0;
    })) << after;
    EXPECT_EQ(sample(after, "vllm:kv_cache_usage_perc"), 0.0) << after;
    EXPECT_GT(sample(after, "eh_kv_cache_usage_perc").value_or(0), 0) << "the finished request's blocks stay cached";
    EXPECT_EQ(sample(after, "eh_prefix_cache_entries"), 1.0);
}

// ---- readiness, liveness, draining ---------------------------------------------

TEST(Lifecycle, LoadingIsAliveButNotReady) {
    EngineHost h = test_engine({}, {{"EH_TEST_ENGINE_LOAD_DELAY_MS", "3000"}}, false);
    ASSERT_GT(h.port(), 0);
    HttpResponse ready = h.get("/health/ready"), live = h.get("/health/live");
    EXPECT_EQ(ready.status, 503);
    EXPECT_EQ(json::parse(ready.body).value("status", ""), "loading");
    EXPECT_EQ(live.status, 200);
    EXPECT_EQ(json::parse(live.body).value("status", ""), "alive");
    EXPECT_TRUE(eventually([&] { return h.get("/health/ready").status == 200; }, 20000));
    EXPECT_EQ(json::parse(h.get("/health/ready").body).value("status", ""), "ready");
}

// Probes carry no credentials: with --api-key the probe routes still answer.
TEST(Lifecycle, ProbesNeedNoApiKey) {
    EngineHost h = test_engine({"--api-key", "sekrit-key-1"});
    ASSERT_GT(h.port(), 0);
    EXPECT_EQ(h.get("/health/ready").status, 200);
    EXPECT_EQ(h.get("/health/live").status, 200);
    EXPECT_EQ(h.get("/v1/models").status, 401);
}

// SIGTERM: readiness turns 503 "draining" at once (the load balancer stops
// sending), new requests are refused with 503 SHUTTING_DOWN, liveness stays
// 200 (no kill while draining), and the running stream goes on to its end.
TEST(Lifecycle, SigtermDrainsRunningStreamsWhileReadinessSaysDraining) {
    EngineHost h = test_engine({}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    ASSERT_GT(h.port(), 0);
    ASSERT_EQ(h.get("/health/ready").status, 200);
    std::atomic<int> chunks{0};
    std::string finish;
    int completion_tokens = -1;
    bool done = false;
    json body = json::parse(completion(100, true));
    body["stream_options"] = {{"include_usage", true}};
    std::thread stream([&] {
        sse_stream(h.port(), "/v1/completions", body.dump(), [&](const SseEvent& e) {
            if (e.data == "[DONE]") {
                done = true;
                return true;
            }
            json j = json::parse(e.data, nullptr, false);
            if (!j.is_object()) return true;
            if (j.contains("choices") && !j["choices"].empty()) {
                ++chunks;
                if (j["choices"][0]["finish_reason"].is_string()) finish = j["choices"][0]["finish_reason"];
            }
            if (j.contains("usage") && j["usage"].is_object()) completion_tokens = j["usage"].value("completion_tokens", -1);
            return true;
        });
    });
    ASSERT_TRUE(eventually([&] { return chunks.load() >= 5; }));
    ASSERT_EQ(kill(h.pid(), SIGTERM), 0);
    const auto t0 = Clock::now();
    HttpResponse ready;
    EXPECT_TRUE(eventually([&] {
        ready = h.get("/health/ready");
        return ready.status == 503;
    }, 1000));
    EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
    json rj = json::parse(ready.body, nullptr, false);
    EXPECT_EQ(rj.value("status", ""), "draining") << ready.body;
    EXPECT_EQ(rj.value("running", -1), 1) << ready.body;
    EXPECT_EQ(h.get("/health/live").status, 200);
    HttpResponse refused = h.post("/v1/completions", completion(5, false));
    EXPECT_EQ(refused.status, 503);
    EXPECT_EQ(json::parse(refused.body)["error"].value("code", ""), "SHUTTING_DOWN") << refused.body;
    EXPECT_LT(chunks.load(), 90) << "the stream was still running when the new request was refused";
    stream.join();
    EXPECT_TRUE(done);
    EXPECT_EQ(finish, "length");
    EXPECT_EQ(completion_tokens, 100);
    EXPECT_EQ(h.wait_exit(), 0);
}

// ---- served model names ------------------------------------------------------------

TEST(ServedModelName, AliasesAreListedAndServedAndOtherNamesRefused) {
    EngineHost h = test_engine({"--served-model-name", "story", "--served-model-name", "tales"});
    ASSERT_GT(h.port(), 0);
    json models = json::parse(h.get("/v1/models").body);
    std::vector<std::string> ids;
    for (const auto& m : models["data"]) ids.push_back(m["id"]);
    EXPECT_EQ(ids, (std::vector<std::string>{"story", "tales", "tinytales"}));
    EXPECT_EQ(json::parse(h.get("/health").body).value("model", ""), "story");
    for (const char* name : {"story", "tales", "tinytales"}) {
        HttpResponse r = h.post("/v1/completions", completion(3, false, name));
        EXPECT_EQ(r.status, 200) << name << r.body;
        EXPECT_EQ(json::parse(r.body).value("model", ""), name);
    }
    EXPECT_EQ(h.post("/v1/completions", completion(3, false)).status, 200) << "no model: the served one";
    HttpResponse bad = h.post("/v1/completions", completion(3, false, "gpt-4"));
    EXPECT_EQ(bad.status, 404) << bad.body;
    json err = json::parse(bad.body)["error"];
    EXPECT_EQ(err.value("code", ""), "NOT_FOUND");
    EXPECT_EQ(err.value("message", ""), "the model 'gpt-4' is not served here (served: 'story', 'tales', 'tinytales')");
    HttpResponse chat = h.post("/v1/chat/completions",
                               R"({"model":"gpt-4","messages":[{"role":"user","content":"hi"}],"max_tokens":3})");
    EXPECT_EQ(chat.status, 404) << chat.body;
    HttpResponse msg = h.post("/v1/messages",
                              R"({"model":"claude","max_tokens":3,"messages":[{"role":"user","content":"hi"}]})");
    EXPECT_EQ(msg.status, 404) << msg.body;
    EXPECT_EQ(json::parse(msg.body).value("type", ""), "error") << msg.body;
}

TEST(ServedModelName, WithoutItAnyModelNameIsServedAsBefore) {
    EngineHost h = test_engine();
    ASSERT_GT(h.port(), 0);
    EXPECT_EQ(h.post("/v1/completions", completion(3, false, "gpt-4")).status, 200);
    json models = json::parse(h.get("/v1/models").body);
    ASSERT_EQ(models["data"].size(), 1u);
    EXPECT_EQ(models["data"][0].value("id", ""), "tinytales");
}

TEST(ServedModelName, AnEmptyNameIsAUsageError) {
    auto [st, out] = run_command(std::string(EH_ENGINE_HOST) + " --model " + kModel + " --plugins " + kTestEngine +
                                 " --port 0 --served-model-name '' 2>&1");
    EXPECT_EQ(WEXITSTATUS(st), 2) << out;
    EXPECT_NE(out.find("--served-model-name must be 1-256 bytes"), std::string::npos) << out;
}

// ---- one log line per request with its routing headers ------------------------

TEST(AccessLog, RoutingHeadersAreLoggedAndNoOthers) {
    EngineHost h = test_engine({"--api-key", "sekrit-key-1"});
    ASSERT_GT(h.port(), 0);
    HttpResponse r = h.post("/v1/completions", completion(3, false),
                            {{"Authorization", "Bearer sekrit-key-1"},
                             {"X-Request-Id", "req-42"},
                             {"x-gateway-destination-endpoint", "10.1.2.3:8080"},
                             {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                             {"X-Other", "not-logged"}});
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_EQ(h.get("/health").status, 200);
    std::optional<json> with, without;
    ASSERT_TRUE(eventually([&] {
        for (const auto& e : h.log_events()) {
            if (e.value("event", "") != "http_request") continue;
            if (e.value("path", "") == "/v1/completions") with = e;
            if (e.value("path", "") == "/health") without = e;
        }
        return with && without;
    }));
    EXPECT_EQ((*with)["routing"], (json{{"x-request-id", "req-42"},
                                        {"x-gateway-destination-endpoint", "10.1.2.3:8080"},
                                        {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}));
    EXPECT_FALSE(without->contains("routing"));
    EXPECT_EQ(h.log().find("sekrit-key-1"), std::string::npos);
    EXPECT_EQ(h.log().find("not-logged"), std::string::npos);
}

}  // namespace
