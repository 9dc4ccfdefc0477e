// Many models per server (issue 50): several --model NAME=PATH or
// --models-dir, each loaded on its first request and unloaded least recently
// used first under --models-memory-mb, after --idle-unload-seconds, or on
// POST /v1/models/unload; against the real engine-host with the
// deterministic test engine (whose models report 1024 bytes of memory).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "engine_host_process.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

const std::string kModel = stories_model();
const std::string kTestEngine = std::string(EH_TEST_PLUGIN_DIR) + "/good";

// engine-host serving `names` (each the same test model file) plus `args`.
EngineHost pool_host(const std::vector<std::string>& names, std::vector<std::string> args = {},
                     std::map<std::string, std::string> env = {}) {
    for (size_t i = 1; i < names.size(); ++i) args.insert(args.begin(), {"--model", names[i] + "=" + kModel});
    return EngineHost(std::move(args), std::move(env), true, kTestEngine, names[0] + "=" + kModel);
}

json completion(const std::string& model, int max_tokens = 3, bool stream = false) {
    json j = {{"prompt", "Once upon"}, {"max_tokens", max_tokens}, {"temperature", 0}};
    if (!model.empty()) j["model"] = model;
    if (stream) j["stream"] = true;
    return j;
}

// The model's state in /health ("loaded", "loading", "unloaded").
// Streams a 30-token completion from `model`: the chunks with text counted
// in `tokens` (as they come), the finish reason kept.
void stream_completion(EngineHost& h, const std::string& model, std::atomic<int>& tokens, std::string& finish) {
    sse_stream(h.port(), "/v1/completions", completion(model, 30, true).dump(), [&](const SseEvent& e) {
        if (e.data == "[DONE]") return false;
        const json j = json::parse(e.data, nullptr, false);
        if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) return true;
        if (!j["choices"][0]["text"].get<std::string>().empty()) ++tokens;
        if (j["choices"][0]["finish_reason"].is_string()) finish = j["choices"][0]["finish_reason"];
        return true;
    });
}

std::string state_of(EngineHost& h, const std::string& model) {
    const json j = json::parse(h.get("/health").body, nullptr, false);
    if (j.is_discarded() || !j.contains("models")) return "?";
    for (const auto& m : j["models"])
        if (m["id"] == model) return m["state"];
    return "absent";
}

bool wait_state(EngineHost& h, const std::string& model, const std::string& want, int ms = 5000) {
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
        if (state_of(h, model) == want) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

TEST(ManyModels, EachApiPicksTheModelByNameAndLoadsItOnFirstUse) {
    auto h = pool_host({"a", "b"}, {"--served-model-name", "b=bee"});
    ASSERT_GT(h.port(), 0) << h.log();
    // Nothing loaded until asked for.
    EXPECT_EQ(state_of(h, "a"), "unloaded");
    EXPECT_EQ(state_of(h, "b"), "unloaded");
    const json models = json::parse(h.get("/v1/models").body);
    ASSERT_EQ(models["data"].size(), 3u) << models.dump();
    EXPECT_EQ(models["data"][0]["id"], "a");
    EXPECT_EQ(models["data"][1]["id"], "b");
    EXPECT_EQ(models["data"][2]["id"], "bee");
    EXPECT_EQ(models["data"][2]["root"], "b");
    EXPECT_EQ(models["data"][0]["status"], "unloaded");

    auto r = h.post("/v1/completions", completion("a").dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["model"], "a");
    EXPECT_EQ(state_of(h, "a"), "loaded");
    EXPECT_EQ(state_of(h, "b"), "unloaded");
    const json health = json::parse(h.get("/health").body);
    EXPECT_EQ(health["models"][0]["engine_state"], "ready") << health.dump();
    EXPECT_EQ(health["models"][0]["memory_bytes"], 1024);
    EXPECT_EQ(health["models_memory_bytes"], 1024);

    r = h.post("/v1/chat/completions",
               json({{"model", "bee"}, {"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["model"], "bee");
    EXPECT_EQ(state_of(h, "b"), "loaded");

    r = h.post("/v1/messages", json({{"model", "b"}, {"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    r = h.post("/v1/responses", json({{"model", "a"}, {"max_output_tokens", 2}, {"input", "hi"}}).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    // No model: the first, the default (and the native routes' model).
    r = h.post("/v1/completions", completion("").dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["model"], "a");
    EXPECT_EQ(h.post("/tokenize", R"({"text":"hi"})").status, 200);

    const std::string metrics = h.get("/metrics").body;
    EXPECT_NE(metrics.find("eh_model_loaded{model=\"a\"} 1"), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("eh_model_loaded{model=\"b\"} 1"), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("eh_models_memory_bytes 2048"), std::string::npos) << metrics;
}

TEST(ManyModels, NativeRoutesTakeTheModelField) {
    auto h = pool_host({"a", "b"});
    std::string started_model;
    sse_stream(h.port(), "/execute", R"({"job_id":"j1","prompt":"Once","max_tokens":2,"model":"b"})", [&](const SseEvent& e) {
        if (e.event == "started") started_model = json::parse(e.data)["model"];
        return e.event != "end" && e.event != "error";
    });
    EXPECT_EQ(started_model, "b");
    EXPECT_EQ(state_of(h, "b"), "loaded");
    EXPECT_EQ(state_of(h, "a"), "unloaded");
    auto r = h.post("/tokenize", R"({"text":"hi","model":"b"})");
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(state_of(h, "a"), "unloaded");
    r = h.post("/detokenize", R"({"tokens":[1,2],"model":"nope"})");
    EXPECT_EQ(r.status, 404) << r.body;
    r = h.post("/execute", R"({"job_id":"j2","prompt":"Once","max_tokens":2,"model":"nope"})");
    EXPECT_EQ(r.status, 404) << r.body;
    // No model: the default.
    EXPECT_EQ(h.post("/tokenize", R"({"text":"hi"})").status, 200);
    EXPECT_EQ(state_of(h, "a"), "loaded");
}

TEST(ManyModels, UnknownModelIsNotFoundOnEveryApi) {
    auto h = pool_host({"a", "b"});
    auto r = h.post("/v1/completions", completion("nope").dump());
    EXPECT_EQ(r.status, 404) << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "NOT_FOUND");
    EXPECT_NE(r.body.find("'nope' is not served here"), std::string::npos) << r.body;
    r = h.post("/v1/messages", json({{"model", "nope"}, {"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}).dump());
    EXPECT_EQ(r.status, 404) << r.body;
    r = h.post("/v1/responses", json({{"model", "nope"}, {"input", "hi"}}).dump());
    EXPECT_EQ(r.status, 404) << r.body;
    EXPECT_EQ(state_of(h, "a"), "unloaded");  // nothing was loaded for them
}

// --models-memory-mb for `bytes`: a model is estimated at its file's size
// before its first load, and holds 1024 bytes once loaded (the test engine).
std::string budget_mb(uint64_t bytes) { return std::to_string(double(bytes) / (1024.0 * 1024.0)); }
// (read when a test runs: ctest lists the tests by running the binary at
// build time, where a clone without the shared test data has no file)
uint64_t file_bytes() { return std::filesystem::file_size(kModel); }

TEST(ManyModels, LeastRecentlyUsedIsUnloadedPastTheMemoryBudget) {
    // Room for one loaded model beside a new one, not two.
    auto h = pool_host({"a", "b", "c"}, {"--models-memory-mb", budget_mb(file_bytes() + 1024 + 512)});
    ASSERT_EQ(h.post("/v1/completions", completion("a").dump()).status, 200);
    ASSERT_EQ(h.post("/v1/completions", completion("b").dump()).status, 200);
    ASSERT_EQ(h.post("/v1/completions", completion("a").dump()).status, 200);  // a is now the most recent
    EXPECT_EQ(state_of(h, "a"), "loaded");
    EXPECT_EQ(state_of(h, "b"), "loaded");
    ASSERT_EQ(h.post("/v1/completions", completion("c").dump()).status, 200);
    EXPECT_EQ(state_of(h, "b"), "unloaded");  // the least recently used
    EXPECT_EQ(state_of(h, "a"), "loaded");
    EXPECT_EQ(state_of(h, "c"), "loaded");
    // And it loads again when asked for (its 1024 bytes fit now).
    auto r = h.post("/v1/completions", completion("b").dump());
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(state_of(h, "b"), "loaded");
    EXPECT_EQ(json::parse(h.get("/health").body)["models_memory_bytes"], 3072);
}

TEST(ManyModels, ALoadWaitsUntilTheModelItDisplacesHasFinishedItsRequest) {
    // Room for one model: b's load unloads a, whose stream is running.
    auto h = pool_host({"a", "b"}, {"--models-memory-mb", budget_mb(1536), "--shutdown-grace-ms", "100"},
                       {{"EH_TEST_ENGINE_DELAY_MS", "40"}});
    std::atomic<int> tokens{0};
    std::atomic<bool> a_done{false};
    std::string finish;
    std::thread streamer([&] {
        stream_completion(h, "a", tokens, finish);
        a_done = true;
    });
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (tokens.load() < 2 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_GE(tokens.load(), 2) << h.log();
    auto r = h.post("/v1/completions", completion("b", 2).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(a_done.load()) << "b answered while a's request still ran";
    streamer.join();
    EXPECT_EQ(finish, "length");
    EXPECT_GE(tokens.load(), 25);
    EXPECT_EQ(state_of(h, "a"), "unloaded");
    EXPECT_EQ(state_of(h, "b"), "loaded");
}

TEST(ManyModels, IdleModelIsUnloaded) {
    auto h = pool_host({"a", "b"}, {"--idle-unload-seconds", "1"});
    ASSERT_EQ(h.post("/v1/completions", completion("a").dump()).status, 200);
    EXPECT_EQ(state_of(h, "a"), "loaded");
    const auto t0 = Clock::now();
    EXPECT_TRUE(wait_state(h, "a", "unloaded", 5000)) << h.log();
    EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(300));  // not at once
}

TEST(ManyModels, AnUnloadWaitsForTheModelsRunningRequest) {
    // A short shutdown grace: a service shut down under its request would end it.
    auto h = pool_host({"a", "b"}, {"--shutdown-grace-ms", "100"}, {{"EH_TEST_ENGINE_DELAY_MS", "40"}});
    std::atomic<int> tokens{0};
    std::string finish;
    std::thread streamer([&] {
        stream_completion(h, "a", tokens, finish);
    });
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (tokens.load() < 2 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_GE(tokens.load(), 2) << h.log();
    auto r = h.post("/v1/models/unload", R"({"model":"a"})");
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["status"], "unloading");
    EXPECT_EQ(state_of(h, "a"), "unloaded");  // no longer handed out
    auto released = [&] {
        for (const auto& e : h.log_events())
            if (e.value("event", "") == "model_unload" && e.value("phase", "") == "complete" && e.value("model", "") == "a")
                return true;
        return false;
    };
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a sweep or more
    EXPECT_FALSE(released()) << "released while its request still ran";
    EXPECT_LT(tokens.load(), 30);
    streamer.join();
    EXPECT_EQ(finish, "length");  // ran to its end
    EXPECT_GE(tokens.load(), 25);
    const auto until2 = Clock::now() + std::chrono::seconds(5);
    while (!released() && Clock::now() < until2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(released()) << h.log();
}

// Children of `parent` whose command line holds `needle` (engine-worker processes).
int children_with(pid_t parent, const std::string& needle) {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
        const std::string name = e.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream stat(e.path() / "stat");
        std::string line;
        std::getline(stat, line);
        const size_t close = line.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream rest(line.substr(close + 2));
        std::string state;
        pid_t ppid = 0;
        rest >> state >> ppid;
        if (ppid != parent || state == "Z") continue;
        std::ifstream cmd(e.path() / "cmdline");
        std::string args((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
        std::replace(args.begin(), args.end(), '\0', ' ');
        if (args.find(needle) != std::string::npos) ++n;
    }
    return n;
}

TEST(ManyModels, AnUnloadEndsTheModelsEngineProcess) {
    auto h = pool_host({"a", "b"}, {"--engine-process"});
    ASSERT_EQ(h.post("/v1/completions", completion("a").dump()).status, 200);
    ASSERT_EQ(h.post("/v1/completions", completion("b").dump()).status, 200);
    EXPECT_EQ(children_with(h.pid(), "--model-name a "), 1);
    EXPECT_EQ(children_with(h.pid(), "--model-name b "), 1);
    ASSERT_EQ(h.post("/v1/models/unload", R"({"model":"a"})").status, 200);
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (children_with(h.pid(), "--model-name a ") > 0 && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(children_with(h.pid(), "--model-name a "), 0);
    EXPECT_EQ(children_with(h.pid(), "--model-name b "), 1);
    EXPECT_EQ(h.post("/v1/completions", completion("b").dump()).status, 200);
}

TEST(ManyModels, LoadAndUnloadNeedTheApiKeyAndAKnownName) {
    auto h = pool_host({"a", "b"}, {"--api-key", "k-1"});
    const std::map<std::string, std::string> key = {{"Authorization", "Bearer k-1"}};
    EXPECT_EQ(h.post("/v1/models/load", R"({"model":"b"})").status, 401);
    EXPECT_EQ(h.post("/v1/models/unload", R"({"model":"b"})", {{"Authorization", "Bearer wrong"}}).status, 401);
    EXPECT_EQ(state_of(h, "b"), "unloaded");
    auto r = h.post("/v1/models/load", R"({"model":"b"})", key);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["status"], "loaded");
    EXPECT_EQ(state_of(h, "b"), "loaded");
    r = h.post("/models/unload", R"({"model":"b"})", key);  // llama-server's path
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["status"], "unloading");
    EXPECT_TRUE(wait_state(h, "b", "unloaded"));
    r = h.post("/v1/models/unload", R"({"model":"b"})", key);
    EXPECT_EQ(json::parse(r.body)["status"], "not_loaded") << r.body;
    r = h.post("/v1/models/load", R"({"model":"nope"})", key);
    EXPECT_EQ(r.status, 404) << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "NOT_FOUND");
    EXPECT_EQ(h.post("/v1/models/load", R"({})", key).status, 400);
    EXPECT_EQ(h.post("/v1/models/load", R"({"model":7})", key).status, 400);
    EXPECT_EQ(h.post("/v1/models/unload", "not json", key).status, 400);
}

TEST(ManyModels, ARequestWaitsBoundedForItsModelsLoad) {
    auto h = pool_host({"a", "b"}, {"--model-load-wait-sec", "1"}, {{"EH_TEST_ENGINE_LOAD_DELAY_MS", "2500"}});
    const auto t0 = Clock::now();
    auto r = h.post("/v1/completions", completion("b").dump());
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(900));
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "MODEL_LOADING");
    EXPECT_EQ(json::parse(r.body)["error"]["details"]["model"], "b");
    EXPECT_EQ(r.header("retry-after"), "5");
    EXPECT_EQ(state_of(h, "b"), "loading");
    ASSERT_TRUE(wait_state(h, "b", "loaded", 10000));
    EXPECT_EQ(h.post("/v1/completions", completion("b").dump()).status, 200);
}

TEST(ManyModels, ModelsDirServesEveryModelByFileName) {
    const auto dir = std::filesystem::temp_directory_path() / ("eh-models-dir-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::filesystem::create_symlink(kModel, dir / "x.gguf");
    std::filesystem::create_symlink(kModel, dir / "y.gguf");
    {
        std::ofstream(dir / "notes.txt") << "not a model";
        EngineHost h({"--models-dir", dir.string()}, {}, true, kTestEngine, "w=" + kModel);
        const json models = json::parse(h.get("/v1/models").body);
        ASSERT_EQ(models["data"].size(), 3u) << models.dump();
        EXPECT_EQ(models["data"][1]["id"], "x");
        EXPECT_EQ(models["data"][2]["id"], "y");
        auto r = h.post("/v1/completions", completion("y").dump());
        EXPECT_EQ(r.status, 200) << r.body;
    }
    std::filesystem::remove_all(dir);
}

TEST(ManyModels, BadFlagsAreUsageErrors) {
    const std::string base = std::string(EH_ENGINE_HOST) + " --plugins " + kTestEngine + " --port 0 ";
    const auto empty = std::filesystem::temp_directory_path() / ("eh-empty-dir-" + std::to_string(::getpid()));
    std::filesystem::create_directories(empty);
    for (const std::string& args : std::vector<std::string>{
             "--model " + kModel + " --models-memory-mb 1",                       // one model
             "--model a=" + kModel + " --model a=" + kModel,                      // a name twice
             "--model a=" + kModel + " --model b=" + kModel + " --served-model-name x",  // alias of which?
             "--model a=" + kModel + " --model b=" + kModel + " --model-name z",
             "--model a=" + kModel + " --model-load-wait-sec 0",
             "--model a=" + kModel + " --artifacts-dir /tmp",
             "--models-dir " + empty.string(),
             "--models-dir /nonexistent-dir",
         }) {
        auto [status, out] = run_command(base + args + " 2>&1");
        EXPECT_EQ(WEXITSTATUS(status), 2) << args << "\n" << out;
    }
    std::filesystem::remove_all(empty);
}

}  // namespace
