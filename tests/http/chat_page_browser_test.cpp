// The chat page at `/` in a real browser: Debian's headless Chromium driven
// through chromedriver (W3C WebDriver over loopback HTTP). scripts/setup.sh
// installs both, so a missing browser is a failure, never a skip.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <functional>
#include <thread>

#include "engine_host_process.hpp"

using nlohmann::json;
using namespace eh::test;
using namespace std::chrono_literals;

namespace {

const char* kElement = "element-6066-11e4-a52e-4f735466cecf";  // W3C WebDriver's element key

int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

// One chromedriver process and one headless Chromium session.
class Browser {
public:
    Browser() {
        port_ = free_port();
        pid_ = fork();
        if (pid_ == 0) {
            const std::string port_arg = "--port=" + std::to_string(port_);
            execl(EH_CHROMEDRIVER, EH_CHROMEDRIVER, port_arg.c_str(), "--log-level=SEVERE", static_cast<char*>(nullptr));
            _exit(127);
        }
        for (int i = 0; i < 200; ++i) {
            try {
                if (http(port_, "GET", "/status").status == 200) break;
            } catch (...) {
            }
            std::this_thread::sleep_for(50ms);
        }
        json caps = {{"capabilities",
                      {{"alwaysMatch",
                        {{"browserName", "chrome"},
                         {"goog:chromeOptions",
                          {{"binary", EH_CHROMIUM},
                           {"args", {"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"}}}}}}}}};
        json r = call("POST", "/session", caps);
        session_ = r["value"].value("sessionId", "");
    }
    ~Browser() {
        if (!session_.empty()) {
            try {
                http(port_, "DELETE", "/session/" + session_);
            } catch (...) {
            }
        }
        if (pid_ > 0) {
            kill(pid_, SIGTERM);
            waitpid(pid_, nullptr, 0);
        }
    }
    bool ok() const { return !session_.empty(); }

    void open(const std::string& url) { command("POST", "/url", {{"url", url}}); }
    std::string find(const std::string& css) {
        return command("POST", "/element", {{"using", "css selector"}, {"value", css}})["value"].value(kElement, "");
    }
    void type(const std::string& element, const std::string& text) {
        command("POST", "/element/" + element + "/value", {{"text", text}});
    }
    void clear(const std::string& element) { command("POST", "/element/" + element + "/clear", json::object()); }
    void click(const std::string& element) { command("POST", "/element/" + element + "/click", json::object()); }
    json script(const std::string& js) { return command("POST", "/execute/sync", {{"script", js}, {"args", json::array()}})["value"]; }

    // Polls `js` until it returns true (or the time is up).
    bool wait_for(const std::string& js, std::chrono::seconds limit) {
        auto until = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < until) {
            if (script(js) == true) return true;
            std::this_thread::sleep_for(20ms);
        }
        return false;
    }

private:
    json call(const std::string& method, const std::string& path, const json& body) {
        auto r = http(port_, method, path, body.dump());
        json j = json::parse(r.body, nullptr, false);
        if (r.status != 200 || j.is_discarded()) ADD_FAILURE() << method << " " << path << ": " << r.status << " " << r.body;
        return j.is_discarded() ? json::object() : j;
    }
    json command(const std::string& method, const std::string& path, const json& body) {
        return call(method, "/session/" + session_ + path, body);
    }

    int port_ = 0;
    pid_t pid_ = -1;
    std::string session_;
};

// Opens the page of `h` and waits for its /health facts; false if either
// the browser or the page fails.
bool open_page(Browser& b, EngineHost& h) {
    if (!std::string(EH_CHROMEDRIVER).size() || !std::string(EH_CHROMIUM).size()) {
        ADD_FAILURE() << "chromium / chromedriver not found at configure time: run scripts/setup.sh "
                         "(Debian: chromium chromium-driver)";
        return false;
    }
    if (!b.ok()) return false;
    b.open("http://127.0.0.1:" + std::to_string(h.port()) + "/");
    return b.wait_for("return document.getElementById('model-info').dataset.status === 'healthy'", 10s);
}

// Sets a number field of the sampling settings as a user would.
void set_field(Browser& b, const std::string& css, const std::string& value) {
    const std::string el = b.find(css);
    b.clear(el);
    b.type(el, value);
}

}  // namespace

// Load the page, see the model facts from /health, set temperature 0, send
// a message, and watch the reply arrive over several streamed events.
TEST(ChatPageBrowser, StreamsAReplyFromTheShippedModel) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR, EH_DEFAULT_MODEL);
    ASSERT_GT(h.port(), 0) << h.log();
    Browser b;
    ASSERT_TRUE(open_page(b, h));
    const std::string info = b.script("return document.getElementById('model-info').textContent");
    EXPECT_NE(info.find("tinytales"), std::string::npos) << info;
    EXPECT_NE(info.find("cpu-reference"), std::string::npos) << info;

    set_field(b, "#temperature", "0");
    b.type(b.find("#prompt"), "Tell me a story about a shy owl named Milo.");
    b.click(b.find("#send"));
    ASSERT_TRUE(b.wait_for("const m = document.querySelector('.msg.assistant');"
                           "return !!m && m.dataset.state === 'done'", 60s))
        << b.script("return document.getElementById('conversation').innerHTML");
    json reply = b.script("const m = document.querySelector('.msg.assistant');"
                          "return {text: m.textContent, chunks: Number(m.dataset.chunks)}");
    const std::string text = reply["text"];
    EXPECT_GT(reply["chunks"].get<int>(), 10) << "the reply did not arrive as a stream";
    // the story the request named (its opening words are the model's choice)
    EXPECT_NE(text.find("shy owl named Milo"), std::string::npos) << text;
    EXPECT_TRUE(!text.empty() && std::isupper(static_cast<unsigned char>(text[0]))) << text;
    EXPECT_EQ(b.script("return document.querySelectorAll('.msg.user').length"), 1);
    EXPECT_EQ(b.script("return document.getElementById('send').disabled"), false);
}

// With --api-key the page still loads; a message without the key shows the
// server's 401 and points at the key field; with the key typed in, the
// reply streams.
TEST(ChatPageBrowser, AsksForTheApiKeyAndSendsIt) {
    EngineHost h({"--api-key", "page-key"}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", EH_DEFAULT_MODEL);
    ASSERT_GT(h.port(), 0) << h.log();
    Browser b;
    ASSERT_TRUE(open_page(b, h));
    b.type(b.find("#prompt"), "Hello");
    b.click(b.find("#send"));
    ASSERT_TRUE(b.wait_for("const m = document.querySelector('.msg.assistant');"
                           "return !!m && m.dataset.state === 'error'", 20s));
    const std::string error = b.script("return document.querySelector('.msg.assistant').textContent");
    EXPECT_NE(error.find("API key"), std::string::npos) << error;
    EXPECT_EQ(b.script("return document.activeElement.id"), "api_key");

    b.type(b.find("#api_key"), "page-key");
    set_field(b, "#max_tokens", "5");
    b.type(b.find("#prompt"), "Hello");
    b.click(b.find("#send"));
    ASSERT_TRUE(b.wait_for("const m = document.querySelectorAll('.msg.assistant')[1];"
                           "return !!m && m.dataset.state === 'done'", 30s))
        << b.script("return document.getElementById('conversation').innerHTML");
}

// Stop ends a slow reply: the page marks it stopped and the server drops the
// job (the test engine waits 50 ms a token, so the reply cannot finish first).
TEST(ChatPageBrowser, StopEndsTheReplyAndTheServerJob) {
    EngineHost h({}, {{"EH_TEST_ENGINE_DELAY_MS", "50"}}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", EH_DEFAULT_MODEL);
    ASSERT_GT(h.port(), 0) << h.log();
    Browser b;
    ASSERT_TRUE(open_page(b, h));
    set_field(b, "#max_tokens", "400");
    b.type(b.find("#prompt"), "Hello!");
    b.click(b.find("#send"));
    ASSERT_TRUE(b.wait_for("const m = document.querySelector('.msg.assistant');"
                           "return !!m && Number(m.dataset.chunks) >= 2", 20s));
    b.click(b.find("#stop"));
    ASSERT_TRUE(b.wait_for("return document.querySelector('.msg.assistant').dataset.state === 'stopped'", 5s));
    EXPECT_EQ(b.script("return document.getElementById('send').disabled"), false);
    bool idle = false;
    for (int i = 0; i < 100 && !idle; ++i) {
        idle = json::parse(h.get("/health").body).value("active_jobs", -1) == 0;
        if (!idle) std::this_thread::sleep_for(50ms);
    }
    EXPECT_TRUE(idle) << "the server kept generating after the page stopped reading";
}

// A context smaller than what the page asks for (--ctx-size 128 against its
// max_tokens of 400): the first reply is capped at what the context has left
// and says that the conversation fills it; the next turn, with no room left,
// says so and how to start over, instead of a raw 400 about max_tokens.
TEST(ChatPageBrowser, AReplyIsCappedAtTheContextAndAFullConversationSaysSo) {
    EngineHost h({"--ctx-size", "128"}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", EH_DEFAULT_MODEL);
    ASSERT_GT(h.port(), 0) << h.log();
    Browser b;
    ASSERT_TRUE(open_page(b, h));
    set_field(b, "#max_tokens", "400");
    b.type(b.find("#prompt"), "Hello");
    b.click(b.find("#send"));
    ASSERT_TRUE(b.wait_for("const m = document.querySelector('.msg.assistant');"
                           "return !!m && m.dataset.state === 'done'", 30s))
        << b.script("return document.getElementById('conversation').innerHTML");
    ASSERT_TRUE(b.wait_for("return !!document.querySelector('.msg.note')", 5s))
        << b.script("return document.getElementById('conversation').innerHTML");
    const std::string note = b.script("return document.querySelector('.msg.note').textContent");
    EXPECT_NE(note.find("fills the context (128 tokens)"), std::string::npos) << note;

    b.type(b.find("#prompt"), "And then?");
    b.click(b.find("#send"));
    ASSERT_TRUE(b.wait_for("const m = document.querySelectorAll('.msg.assistant')[1];"
                           "return !!m && m.dataset.state === 'error'", 30s))
        << b.script("return document.getElementById('conversation').innerHTML");
    const std::string full = b.script("return document.querySelectorAll('.msg.assistant')[1].textContent");
    EXPECT_NE(full.find("the conversation fills the context (128 tokens); start a new one with New chat"),
              std::string::npos)
        << full;
}

// A reply holding a NUL (the test engine is scripted to emit the <0x00> byte
// token) still lets the conversation go on: the server refuses NUL in
// messages, so the page keeps the reply in its history without it. Before,
// the next turn failed with "'messages' contains a NUL character".
TEST(ChatPageBrowser, AReplyWithANulByteDoesNotBreakTheNextTurn) {
    EngineHost h({}, {{"EH_TEST_ENGINE_SCRIPT", "300,3,301"}}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good",
                 EH_DEFAULT_MODEL);
    ASSERT_GT(h.port(), 0) << h.log();
    Browser b;
    ASSERT_TRUE(open_page(b, h));
    for (int turn = 0; turn < 2; ++turn) {
        b.type(b.find("#prompt"), turn == 0 ? "Hello" : "And then?");
        b.click(b.find("#send"));
        ASSERT_TRUE(b.wait_for("const m = document.querySelectorAll('.msg.assistant')[" + std::to_string(turn) +
                                   "]; return !!m && ['done', 'error', 'stopped'].includes(m.dataset.state)",
                               30s))
            << b.script("return document.getElementById('conversation').innerHTML");
        EXPECT_EQ(b.script("return document.querySelectorAll('.msg.assistant')[" + std::to_string(turn) +
                           "].dataset.state"),
                  "done")
            << b.script("return document.getElementById('conversation').innerHTML");
    }
}
