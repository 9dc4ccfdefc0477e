// Who may take the listener and its connections (issue 52, items 3, 6, 9
// and 10), against the real engine-host on loopback: an empty API key is a
// startup error whatever its source; a second server cannot bind the port;
// one client address cannot hold all the connection slots; certificate and
// key paths that are not regular files are refused before they are opened.
// Every loop is bounded in count and time.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "engine_host_process.hpp"

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
EngineHost host(std::vector<std::string> args = {}, std::map<std::string, std::string> env = {}, bool wait_ready = true) {
    return EngineHost(std::move(args), std::move(env), wait_ready, kTestEngine, kModel);
}

struct TempDir {
    std::filesystem::path dir;
    TempDir() {
        dir = std::filesystem::temp_directory_path() / ("eh-listener-" + std::to_string(::getpid()) + "-" +
                                                        std::to_string(Clock::now().time_since_epoch().count()));
        std::filesystem::create_directories(dir);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    std::string file(const std::string& name, const std::string& text) const {
        const std::string p = (dir / name).string();
        std::ofstream(p, std::ios::binary) << text;
        return p;
    }
};

// A connection to the server on 127.0.0.1 from the loopback address `from`
// (any of 127.0.0.0/8), so a test can be several clients at once.
int connect_from(const char* from, int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &src.sin_addr);
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(uint16_t(port));
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
        ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

HttpResponse request_from(const char* from, int port, const std::string& method, const std::string& path,
                          const std::string& body = "") {
    int fd = connect_from(from, port);
    if (fd < 0) return {};
    return send_and_read(fd, build_request(method, path, body));
}

std::string error_code(const HttpResponse& r) {
    json j = json::parse(r.body, nullptr, false);
    return j.is_object() && j.contains("error") ? j["error"].value("code", "") : "";
}

// What has arrived on `fd` within `ms`, without waiting for more.
std::string read_now(int fd, int ms) {
    std::string out;
    char buf[4096];
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
        int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, std::max(left, 0)) <= 0) break;
        ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        out.append(buf, size_t(n));
    }
    return out;
}

const std::string kHalfHead = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n";  // no blank line: never complete
const std::string kTokenize = R"({"text":"Hello world","add_special":false})";

}  // namespace

// ---- item 3: an empty API key ------------------------------------------------

TEST(ApiKeyStartup, AnEmptyKeyFromAnySourceIsAStartupError) {
    TempDir d;
    struct Case {
        std::vector<std::string> args;
        std::map<std::string, std::string> env;
        std::string says;
    };
    const std::vector<Case> cases = {
        {{}, {{"ENGINE_HOST_API_KEY", ""}}, "$ENGINE_HOST_API_KEY: an API key must not be empty"},
        {{}, {{"ENGINE_HOST_API_KEY", " "}}, "$ENGINE_HOST_API_KEY: an API key may hold printable ASCII only"},
        {{"--api-key", ""}, {}, "--api-key: an API key must not be empty"},
        {{"--api-key", "good-key", "--api-key", ""}, {}, "--api-key: an API key must not be empty"},
        {{"--api-key", "good-key"}, {{"ENGINE_HOST_API_KEY", ""}}, "$ENGINE_HOST_API_KEY: an API key must not be empty"},
        {{"--api-key-file", d.file("empty.txt", "")}, {}, "holds no key"},
        {{"--api-key-file", d.file("blank.txt", "\n")}, {}, "holds no key"},
        {{"--api-key-file", d.file("spaces.txt", "   \r\n\t\n")}, {}, "holds no key"},
    };
    for (const Case& c : cases) {
        EngineHost h = host(c.args, c.env, false);
        EXPECT_EQ(h.port(), 0) << "listened with an empty key: " << c.says;
        EXPECT_EQ(h.wait_exit(10000), 2) << h.log();
        EXPECT_NE(h.log().find(c.says), std::string::npos) << h.log();
    }
}

// ---- item 6: a second server on the same port --------------------------------

TEST(Listener, ASecondServerOnTheSamePortFailsAndTheFirstKeepsServing) {
    EngineHost first = host();
    ASSERT_GT(first.port(), 0) << first.log();
    const std::string port = std::to_string(first.port());
    // Bounded: a second server that did bind would serve until killed.
    auto [status, out] = run_command("timeout -s KILL 20 " + std::string(EH_ENGINE_HOST) + " --plugins " + kTestEngine +
                                     " --model " + kModel + " --port " + port + " 2>&1");
    ASSERT_TRUE(WIFEXITED(status)) << "the second server did not exit: " << out;
    EXPECT_EQ(WEXITSTATUS(status), 1) << out;
    EXPECT_NE(out.find("cannot listen on 127.0.0.1:" + port + ": port " + port + " is in use"), std::string::npos)
        << out;
    EXPECT_EQ(out.find("\"event\":\"listening\""), std::string::npos) << out;
    // Every connection still reaches the first one.
    for (int i = 0; i < 20; ++i) EXPECT_EQ(first.get("/health").status, 200);
}

// ---- item 9: connections per client address -----------------------------------

TEST(ClientCap, HalfOpenHeadsFromOneAddressLeaveHealthToOthers) {
    EngineHost h = host();
    ASSERT_GT(h.port(), 0) << h.log();
    // More half-sent heads from 127.0.0.1 than the connection slots and the
    // probe reserve together (256 + 64).
    const int n = 330;
    std::vector<int> held;
    for (int i = 0; i < n; ++i) {
        int fd = connect_from("127.0.0.1", h.port());
        ASSERT_GE(fd, 0) << "connection " << i;
        send_all(fd, kHalfHead);
        held.push_back(fd);
    }
    // Past the cap each is answered at once, before its head is complete.
    int refused = 0, waiting = 0;
    for (int fd : held) {
        std::string got = read_now(fd, 20);
        if (got.rfind("HTTP/1.1 429 ", 0) == 0) ++refused;
        else if (got.empty()) ++waiting;
    }
    EXPECT_LE(waiting, 64);
    EXPECT_GE(waiting, 60);
    EXPECT_EQ(refused + waiting, n);

    // Probes from another address answer at once.
    for (int i = 0; i < 10; ++i) {
        auto t0 = Clock::now();
        EXPECT_EQ(request_from("127.0.0.2", h.port(), "GET", "/health").status, 200);
        EXPECT_LT(ms_since(t0), 2000);
    }
    EXPECT_EQ(request_from("127.0.0.3", h.port(), "POST", "/tokenize", kTokenize).status, 200);

    // The refusal, as documented: 429 TOO_MANY_CONNECTIONS, closed.
    HttpResponse r = request_from("127.0.0.1", h.port(), "GET", "/health");
    EXPECT_EQ(r.status, 429) << r.body;
    EXPECT_EQ(error_code(r), "TOO_MANY_CONNECTIONS") << r.body;
    EXPECT_EQ(r.header("retry-after"), "1");
    EXPECT_EQ(r.header("connection"), "close");
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r.body;
    EXPECT_EQ(e["error"]["details"]["limit_connections_per_client"], 64);
    EXPECT_NE(e["error"]["message"].get<std::string>().find("too many connections open from 127.0.0.1 (limit 64 per client address)"),
              std::string::npos)
        << r.body;

    // A head that never completes holds its slot only up to the header
    // timeout (5 s from the accept): then 127.0.0.1 is served again.
    HttpResponse again;
    const auto t0 = Clock::now();
    for (int i = 0; i < 100 && again.status != 200; ++i) {  // at most ~10 s
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        again = request_from("127.0.0.1", h.port(), "GET", "/health");
    }
    EXPECT_EQ(again.status, 200);
    EXPECT_LT(ms_since(t0), 8000);
    for (int fd : held) ::close(fd);
}

// The connection cap itself: four addresses' 64 connections fill the 256
// slots; a fifth address still gets /health and /metrics from the probe
// reserve, and work is refused with 503 QUEUE_FULL.
// --max-connections-per-client sets the cap: with 2, a third connection from
// one address is refused while another address is served; out of range is a
// usage error (exit 2).
TEST(ClientCap, TheCapIsTheFlagsNumber) {
    EngineHost h = host({"--max-connections-per-client", "2"});
    ASSERT_GT(h.port(), 0) << h.log();
    // An address nothing else here uses: the harness's own readiness
    // connection from 127.0.0.1 can still be open (lingering after its
    // answer), and with it one of the two held ones would be over the cap.
    const char* from = "127.0.0.7";
    std::vector<int> held;
    for (int i = 0; i < 2; ++i) {
        held.push_back(connect_from(from, h.port()));
        ASSERT_GE(held.back(), 0);
        send_all(held.back(), kHalfHead);
    }
    // Both held connections are counted once the listener has accepted them
    // (a loaded machine may take a while): until then a third is served.
    HttpResponse r;
    for (int i = 0; i < 50 && r.status != 429; ++i) {  // at most ~5 s
        if (i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        r = request_from(from, h.port(), "GET", "/health");
    }
    EXPECT_EQ(r.status, 429) << r.body << "\n" << h.log();  // the log: which connections were refused
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r.body;
    EXPECT_EQ(e["error"]["details"]["limit_connections_per_client"], 2);
    EXPECT_EQ(request_from("127.0.0.2", h.port(), "GET", "/health").status, 200);
    for (int fd : held) EXPECT_EQ(read_now(fd, 0), "") << "a held connection was refused";  // both were within the cap
    for (int fd : held) ::close(fd);
    for (const char* bad : {"0", "65537"}) {
        EngineHost b = host({"--max-connections-per-client", bad}, {}, false);
        EXPECT_EQ(b.wait_exit(10000), 2) << bad << ": " << b.log();
        EXPECT_NE(b.log().find("--max-connections-per-client must be between 1 and 65536"), std::string::npos) << b.log();
    }
}

TEST(ClientCap, FullSlotsStillAnswerProbesFromAnotherAddress) {
    EngineHost h = host();
    ASSERT_GT(h.port(), 0) << h.log();
    std::vector<int> idle;
    for (const char* from : {"127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"})
        for (int i = 0; i < 64; ++i) {
            int fd = connect_from(from, h.port());
            ASSERT_GE(fd, 0);
            idle.push_back(fd);
        }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all accepted and counted
    EXPECT_EQ(request_from("127.0.0.15", h.port(), "GET", "/health").status, 200);
    EXPECT_EQ(request_from("127.0.0.15", h.port(), "GET", "/metrics").status, 200);
    HttpResponse work = request_from("127.0.0.15", h.port(), "POST", "/tokenize", kTokenize);
    EXPECT_EQ(work.status, 503) << work.body;
    EXPECT_EQ(error_code(work), "QUEUE_FULL");
    EXPECT_EQ(work.header("retry-after"), "1");
    for (int fd : idle) ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(request_from("127.0.0.15", h.port(), "POST", "/tokenize", kTokenize).status, 200);
}

// ---- item 10: certificate and key files that are not files --------------------

TEST(TlsFiles, AnythingButARegularFileIsAUsageErrorBeforeItIsOpened) {
    TempDir d;
    const std::string pem = d.file("cert.pem", "not checked before the bind\n");
    const std::string fifo = (d.dir / "fifo.pem").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const std::string dir = d.dir.string();
    const std::string missing = (d.dir / "missing.pem").string();
    struct Case {
        std::string cert, key, says;
    };
    const std::vector<Case> cases = {
        {fifo, pem, "--ssl-cert-file: " + fifo + " is not a regular file"},
        {pem, fifo, "--ssl-key-file: " + fifo + " is not a regular file"},
        {dir, pem, "--ssl-cert-file: " + dir + " is not a regular file"},
        {pem, "/dev/zero", "--ssl-key-file: /dev/zero is not a regular file"},
        {pem, missing, "--ssl-key-file: cannot read " + missing},
    };
    for (const Case& c : cases) {
        const auto t0 = Clock::now();
        EngineHost h = host({"--ssl-cert-file", c.cert, "--ssl-key-file", c.key}, {}, false);
        EXPECT_EQ(h.wait_exit(5000), 2) << c.says << "\n" << h.log();
        EXPECT_LT(ms_since(t0), 5000);
        EXPECT_EQ(h.port(), 0);
        EXPECT_NE(h.log().find(c.says), std::string::npos) << h.log();
    }
}
