// The rest of issue 26's contract items, against the real engine-host with
// the shipped model (models/tinytales.gguf, no shared test data): shutdown
// within the worker contract's 5 s, /cancel only by the submitter, a chat
// message's "</s>" kept as text, a chat template's evaluation stopped by
// SIGTERM or by the client leaving, `--device`, and a split GGUF served as
// one model.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "eh/model/gguf_split.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tools/vocab.hpp"
#include "engine_host_process.hpp"
#include "streamed_job.hpp"
#include "model_fixtures.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

const std::string kModel = EH_DEFAULT_MODEL;
const std::string kTestEngine = std::string(EH_TEST_PLUGIN_DIR) + "/good";

int64_t ms_since(Clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// The shipped model through the deterministic test engine.
EngineHost host(std::vector<std::string> args = {}, std::map<std::string, std::string> env = {},
                const std::string& model = kModel) {
    return EngineHost(std::move(args), std::move(env), true, kTestEngine, model);
}

std::string exec_body(const std::string& id, int max_tokens) {
    return R"({"job_id":")" + id + R"(","prompt":"Once upon a time","max_tokens":)" + std::to_string(max_tokens) + "}";
}

// One request from the loopback address `source` (127.0.0.0/8 all reach the
// server, each a different client address).
HttpResponse http_from(const char* source, int port, const std::string& method, const std::string& path,
                       const std::string& body, const std::map<std::string, std::string>& headers = {}) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, source, &src.sin_addr);
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(uint16_t(port));
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
        ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
        ::close(fd);
        ADD_FAILURE() << "cannot connect from " << source;
        return {};
    }
    return send_and_read(fd, build_request(method, path, body, headers));
}

std::string cancel_status(const HttpResponse& r) {
    json j = json::parse(r.body, nullptr, false);
    return j.is_object() ? j.value("status", "") : "(" + r.body + ")";
}

// ---- shutdown ------------------------------------------------------------------

// The worker contract gives a worker 5 s from SIGTERM to exit. By default a
// running job gets 4.5 s, then is cancelled; its stream's last event goes out
// within the 500 ms left.
TEST(WorkerContract, DefaultShutdownEndsARunningJobWithinFiveSeconds) {
    EngineHost h = host({}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    ASSERT_TRUE(h.running()) << h.log();
    std::atomic<int64_t> terminal_ms{-1};
    std::string terminal;
    Clock::time_point sigterm_at;
    std::atomic<bool> sent{false};
    std::thread client([&] {
        sse_stream(h.port(), "/execute", exec_body("grace", 400), [&](const SseEvent& e) {
            if ((e.event == "error" || e.event == "end") && sent.load()) {
                terminal = e.data;
                terminal_ms = ms_since(sigterm_at);
            }
            return true;
        });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    sigterm_at = Clock::now();
    sent = true;
    ::kill(h.pid(), SIGTERM);
    EXPECT_EQ(h.wait_exit(8000), 0) << h.log();
    const int64_t exit_ms = ms_since(sigterm_at);
    client.join();
    EXPECT_NE(terminal.find("SHUTTING_DOWN"), std::string::npos) << terminal;
    EXPECT_GE(terminal_ms.load(), 4300);  // the grace was given
    EXPECT_LT(terminal_ms.load(), 5000);  // and no more: the last event is out within the 5 s
    EXPECT_LT(exit_ms, 5500);
}

// ---- /cancel ---------------------------------------------------------------------

TEST(WorkerContract, OnlyTheSubmittingAddressMayCancel) {
    EngineHost h = host({}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    StreamedJob job(h.port(), "mine");  // from 127.0.0.1
    HttpResponse other = http_from("127.0.0.2", h.port(), "POST", "/cancel", R"({"job_id":"mine"})");
    EXPECT_EQ(other.status, 202) << other.body;
    EXPECT_EQ(cancel_status(other), "unknown");  // not told the job exists
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(job.terminal.empty()) << job.terminal;  // still running
    HttpResponse same = http_from("127.0.0.1", h.port(), "POST", "/cancel", R"({"job_id":"mine"})");
    EXPECT_EQ(cancel_status(same), "cancelling") << same.body;
    job.t.join();
    EXPECT_NE(job.terminal.find("CANCELLED"), std::string::npos) << job.terminal;
}

TEST(WorkerContract, WithCredentialsOnlyTheSameCredentialsMayCancel) {
    EngineHost h = host({}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    StreamedJob job(h.port(), "keyed", {{"Authorization", "Bearer key-one"}});
    // The same address with other credentials, or none, is another client.
    EXPECT_EQ(cancel_status(h.post("/cancel", R"({"job_id":"keyed"})", {{"Authorization", "Bearer key-two"}})), "unknown");
    EXPECT_EQ(cancel_status(h.post("/cancel", R"({"job_id":"keyed"})")), "unknown");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(job.terminal.empty()) << job.terminal;
    // The same credentials from another address are the same client.
    HttpResponse r = http_from("127.0.0.3", h.port(), "POST", "/cancel", R"({"job_id":"keyed"})",
                               {{"Authorization", "Bearer key-one"}});
    EXPECT_EQ(cancel_status(r), "cancelling") << r.body;
    job.t.join();
    EXPECT_NE(job.terminal.find("CANCELLED"), std::string::npos) << job.terminal;
}

// ---- "</s>" in a chat message ------------------------------------------------------

int prompt_tokens_of_chat(EngineHost& h, const std::string& messages) {
    HttpResponse r = h.post("/v1/chat/completions", R"({"messages":)" + messages + R"(,"max_tokens":1})");
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    return j.is_object() ? j["usage"].value("prompt_tokens", -1) : -1;
}

int token_count(EngineHost& h, const std::string& text, bool parse_special) {
    HttpResponse r = h.post("/tokenize", json{{"text", text}, {"add_special", false}, {"parse_special", parse_special}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body).value("count", -1);
}

// tinytales' template ends an assistant turn with eos_token ("</s>"): that one
// is the end-of-sequence token, while the same four characters typed in a
// message are text, as on /execute.
TEST(WorkerContract, ControlTokenTextInAChatMessageIsText) {
    EngineHost h = host();
    const int got = prompt_tokens_of_chat(
        h, R"([{"role":"user","content":"hi"},{"role":"assistant","content":"ok"},)"
           R"({"role":"user","content":"x </s> y <s> z"}])");
    // The rendering: "<s>User: hi\nAssistant: ok</s>" (the template's own
    // control tokens), then "User: x </s> y <s> z\nAssistant:", all of it text;
    // a fragment after a control token encodes as at the start of a text.
    const int markup = token_count(h, "<s>User: hi\nAssistant: ok</s>", true);
    const int typed = token_count(h, "User: x </s> y <s> z\nAssistant:", false);
    EXPECT_EQ(got, markup + typed);
    EXPECT_GT(typed, token_count(h, "User: x </s> y <s> z\nAssistant:", true));  // the test can tell them apart
}

// ---- a chat template's evaluation ------------------------------------------------

const char* kChat = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3})";

// A template whose every step copies 2 x `piece` bytes, so its evaluation
// runs for seconds before the 1,000,000-step budget ends it (a 400).
std::string slow_template(int piece) {
    return "{% set s = 'x' * " + std::to_string(piece) +
           " %}{% for a in range(100000) %}{% for b in range(100000) %}{% set t = s ~ s %}{% endfor %}{% endfor %}";
}

// The piece size (and the time the evaluation then runs when nothing stops
// it) at which it takes at least 1.5 s on this machine: long enough to tell
// a stopped evaluation from one that ran to its end.
struct SlowTemplate {
    int piece = 0;
    int64_t full_ms = 0;
};
const SlowTemplate& slow_template_here() {
    static SlowTemplate st = [] {
        SlowTemplate s;
        for (s.piece = 8000; s.piece <= 512000; s.piece *= 4) {
            TemplatedModel m(slow_template(s.piece), kModel);
            EngineHost h = host({}, {}, m.path);
            auto t0 = Clock::now();
            EXPECT_EQ(h.post("/v1/chat/completions", kChat).status, 400);
            s.full_ms = ms_since(t0);
            h.stop();
            if (s.full_ms >= 1500) break;
        }
        std::printf("template pieces of %d bytes: the evaluation runs %lld ms when nothing stops it\n", s.piece,
                    (long long)s.full_ms);
        return s;
    }();
    return st;
}

TEST(WorkerContract, SigtermStopsALongChatTemplateEvaluation) {
    const SlowTemplate& st = slow_template_here();
    ASSERT_GE(st.full_ms, 1500);
    TemplatedModel m(slow_template(st.piece), kModel);
    EngineHost h = host({}, {}, m.path);
    ASSERT_TRUE(h.running()) << h.log();
    HttpResponse r;
    std::thread client([&] { r = h.post("/v1/chat/completions", kChat); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto t0 = Clock::now();
    ::kill(h.pid(), SIGTERM);
    EXPECT_EQ(h.wait_exit(15000), 0) << h.log();
    EXPECT_LT(ms_since(t0), st.full_ms / 2);
    client.join();
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_NE(r.body.find("SHUTTING_DOWN"), std::string::npos) << r.body;
}

// The number of chat requests that have ended (any outcome), from /metrics.
double chats_ended(EngineHost& h) {
    std::string m = h.get("/metrics").body;
    double n = 0;
    for (size_t at = m.find("eh_requests_total{endpoint=\"chat\""); at != std::string::npos;
         at = m.find("eh_requests_total{endpoint=\"chat\"", at + 1))
        n += std::atof(m.c_str() + m.find("} ", at) + 2);
    return n;
}

TEST(WorkerContract, AClientThatLeavesStopsItsChatTemplateEvaluation) {
    const SlowTemplate& st = slow_template_here();
    ASSERT_GE(st.full_ms, 1500);
    TemplatedModel m(slow_template(st.piece), kModel);
    EngineHost h = host({}, {}, m.path);
    ASSERT_TRUE(h.running()) << h.log();
    const double before = chats_ended(h);
    int fd = connect_local(h.port());
    send_all(fd, build_request("POST", "/v1/chat/completions", kChat));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::close(fd);
    auto t0 = Clock::now();
    while (chats_ended(h) == before && ms_since(t0) < st.full_ms + 2000)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LT(ms_since(t0), st.full_ms / 2) << "the evaluation ran on for a client that had left";
    EXPECT_EQ(h.stop(), 0);
}

// ---- --device --------------------------------------------------------------------

TEST(WorkerContract, DeviceGpuNeverFallsBackToACpuPlugin) {
    EngineHost h({"--device", "gpu"}, {}, false, kTestEngine, kModel);
    EXPECT_EQ(h.wait_exit(15000), 3) << h.log();  // no plugin
    EXPECT_NE(h.log().find("no accepted device (GPU) plugin can serve this model"), std::string::npos) << h.log();
}

TEST(WorkerContract, DeviceCpuServesWithTheCpuPlugin) {
    EngineHost h = host({"--device", "cpu"});
    ASSERT_TRUE(h.running()) << h.log();
    json j = json::parse(h.get("/health").body, nullptr, false);
    EXPECT_EQ(j["plugin"].value("name", ""), "test-engine") << j.dump();
    EXPECT_EQ(h.stop(), 0);
}

// /health's quant_kind is the file's quantization (general.file_type), not
// the dominant tensor type the plugin reports (F32 for the test engine here).
TEST(WorkerContract, QuantKindIsTheFilesQuantization) {
    RewrittenModel q4km(kModel, {{"general.file_type", eh::model::GgufValue::u32(15)}});
    EngineHost h = host({}, {}, q4km.path);
    ASSERT_TRUE(h.running()) << h.log();
    json j = json::parse(h.get("/health").body, nullptr, false);
    EXPECT_EQ(j.value("quant_kind", ""), "Q4_K_M") << j.dump();
    EXPECT_EQ(h.stop(), 0);
}

TEST(WorkerContract, DeviceTakesOnlyKnownKinds) {
    EngineHost h = host({"--device", "tpu"}, {}, kModel);
    EXPECT_EQ(h.wait_exit(15000), 2) << h.log();
    EXPECT_NE(h.log().find("--device must be auto, gpu, cpu or any"), std::string::npos) << h.log();
}

// ---- split GGUF --------------------------------------------------------------------

// The shipped model cut into three shards (the first with the metadata and no
// tensors, as gguf-split --no-tensor-in-metadata writes it) answers exactly
// as the whole file through the CPU reference engine.
TEST(WorkerContract, ASplitGgufServesAsTheWholeFile) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("eh-split-serve-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    auto mf = eh::model::ModelFile::open(kModel);
    const auto ts = mf->tensors();
    const int n = 3;
    for (int k = 0; k < n; ++k) {
        eh::model::GgufWriter w;
        if (k == 0)
            for (const auto& kv : mf->metadata()) {
                std::string key(eh::model::to_sv(kv.key));
                if (key != "general.alignment") w.set(key, eh::tools::to_gguf_value(kv.value));
            }
        w.set("split.no", eh::model::GgufValue::u16(uint16_t(k)));
        w.set("split.count", eh::model::GgufValue::u16(uint16_t(n)));
        if (k == 0) w.set("split.tensors.count", eh::model::GgufValue::i32(int32_t(ts.size())));
        for (size_t i = 0; i < ts.size(); ++i)
            if (k > 0 && int(i % 2) == k - 1)
                w.add_tensor(std::string(eh::model::to_sv(ts[i].name)), ts[i].type,
                             std::vector<uint64_t>(ts[i].dims, ts[i].dims + ts[i].n_dims), ts[i].data);
        w.write((dir / eh::model::split_file_name("tales", k + 1, n)).string());
    }
    const std::string body = R"({"prompt":"Once upon a time","max_tokens":12,"temperature":0})";
    std::string whole_text, split_text;
    {
        EngineHost h({}, {}, true, EH_PLUGIN_DIR, kModel);
        HttpResponse r = h.post("/v1/completions", body);
        ASSERT_EQ(r.status, 200) << r.body;
        whole_text = json::parse(r.body)["choices"][0].value("text", "");
    }
    {
        EngineHost h({}, {}, true, EH_PLUGIN_DIR, (dir / eh::model::split_file_name("tales", 1, n)).string());
        HttpResponse r = h.post("/v1/completions", body);
        ASSERT_EQ(r.status, 200) << r.body << h.log();
        split_text = json::parse(r.body)["choices"][0].value("text", "");
    }
    fs::remove_all(dir);
    EXPECT_FALSE(whole_text.empty());
    EXPECT_EQ(split_text, whole_text);
}

}  // namespace

// ---- the load progress bar (issue 24) ------------------------------------------------

namespace load_bar {

// engine-host with stderr on a new terminal (a pty) and stdout on that same
// terminal or in a file; returns everything the terminal showed by the time
// the server was ready, and the log (stdout) in `log`.
std::string terminal_output(bool log_on_terminal, std::string& log) {
    int master = ::posix_openpt(O_RDWR | O_NOCTTY);
    EXPECT_GE(master, 0);
    ::grantpt(master);
    ::unlockpt(master);
    const std::string slave_name = ::ptsname(master);
    const std::string log_path = (std::filesystem::temp_directory_path() /
                                  ("eh-loadbar-" + std::to_string(::getpid()) + ".log")).string();
    pid_t pid = ::fork();
    if (pid == 0) {
        int slave = ::open(slave_name.c_str(), O_RDWR);
        int out = log_on_terminal ? slave : ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        ::dup2(out, 1);
        ::dup2(slave, 2);
        ::setenv("EH_TEST_ENGINE_LOAD_DELAY_MS", "100", 1);
        std::vector<std::string> args = {EH_ENGINE_HOST, "--plugins", kTestEngine, "--model", kModel, "--port", "0"};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    std::string screen;
    auto ready = [&] {
        std::ifstream f(log_path);
        std::stringstream ss;
        ss << f.rdbuf();
        log = log_on_terminal ? screen : ss.str();
        return log.find("\"event\":\"ready\"") != std::string::npos;
    };
    auto read_screen = [&] {
        pollfd p{master, POLLIN, 0};
        if (::poll(&p, 1, 20) > 0) {
            char buf[4096];
            ssize_t n = ::read(master, buf, sizeof buf);
            if (n > 0) screen.append(buf, size_t(n));
        }
    };
    auto t0 = Clock::now();
    while (!ready() && ms_since(t0) < 10000) read_screen();
    for (int i = 0; i < 10; ++i) read_screen();  // what was written before the log said ready
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
    ::close(master);
    std::filesystem::remove(log_path);
    return screen;
}

TEST(LoadProgress, BarOnATerminalWhenTheLogGoesElsewhere) {
    std::string log;
    std::string screen = terminal_output(false, log);
    EXPECT_NE(screen.find("loading model [#########################] 100%"), std::string::npos) << screen;
    EXPECT_EQ(screen.find("model_load_progress"), std::string::npos) << screen;  // the log is not on it
    EXPECT_NE(log.find("model_load_progress"), std::string::npos) << log;        // but has the lines
}

TEST(LoadProgress, LogLinesAloneWhenTheLogSharesTheTerminal) {
    std::string log;
    std::string screen = terminal_output(true, log);
    EXPECT_NE(screen.find("\"percent\":100"), std::string::npos) << screen;
    EXPECT_EQ(screen.find("loading model ["), std::string::npos) << screen;  // no bar to break
}

}  // namespace load_bar

// ---- a plugin that dies (issue 26 item 5) ------------------------------------------

// The engine-crashed line of a log, or null.
json crash_line(EngineHost& h) {
    for (auto& e : h.log_events())
        if (e.value("event", "") == "engine_crashed") return e;
    return nullptr;
}

// A plugin that passes the pre-flight and dies loading the model: the worker
// exits with 128 + the signal, its last log line says which plugin died, how
// and in which phase, and a request that came during the load was answered.
TEST(PluginDies, AtLoadTheLogSaysWhichPluginDiedAndHow) {
    EngineHost h({}, {{"EH_TEST_ENGINE_CRASH_AT_LOAD", "1"}, {"EH_TEST_ENGINE_LOAD_DELAY_MS", "600"}}, false, kTestEngine,
                 kModel);
    ASSERT_GT(h.port(), 0) << h.log();
    HttpResponse during = h.post("/execute", exec_body("early", 4));
    EXPECT_EQ(during.status, 503) << during.body;  // loading: retriable, answered at once
    EXPECT_EQ(h.wait_exit(10000), 128 + SIGILL) << h.log();
    json line = crash_line(h);
    ASSERT_TRUE(line.is_object()) << h.log();
    EXPECT_EQ(line.value("signal", ""), "SIGILL");
    EXPECT_EQ(line.value("phase", ""), "loading");
    EXPECT_EQ(line.value("plugin", ""), "test-engine");
    EXPECT_EQ(line.value("level", ""), "critical");
    EXPECT_EQ(line.value("ts", "").size(), 24u) << line.dump();
    EXPECT_EQ(line.value("ts", "").find("0000-"), std::string::npos) << line.dump();  // the crash time, not the placeholder
}

TEST(PluginDies, MidRequestTheStreamEndsAndTheLogSaysSo) {
    EngineHost h = host({}, {{"EH_TEST_ENGINE_CRASH_AFTER", "3"}, {"EH_TEST_ENGINE_DELAY_MS", "20"}});
    std::vector<SseEvent> events;
    sse_stream(h.port(), "/execute", exec_body("dies", 20), [&](const SseEvent& e) {
        events.push_back(e);
        return true;
    });
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().event, "error");
    EXPECT_EQ(h.wait_exit(5000), 128 + SIGSEGV);
    json line = crash_line(h);
    ASSERT_TRUE(line.is_object()) << h.log();
    EXPECT_EQ(line.value("signal", ""), "SIGSEGV");
    EXPECT_EQ(line.value("phase", ""), "serving");
}
