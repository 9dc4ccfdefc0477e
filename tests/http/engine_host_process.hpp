// Runs the real engine-host binary on a free loopback port (--port 0; the
// port is read from the `listening` log line) with the test engine plugin.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "raw_http.hpp"

namespace eh::test {

// Runs a shell command; its exit status and what it wrote (stdout and
// stderr, when the command redirects 2>&1).
inline std::pair<int, std::string> run_command(const std::string& cmd) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return {-1, out};
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    return {pclose(p), out};
}

inline std::string stories_model() { return std::string(EH_TESTDATA_DIR) + "/models/stories260K.gguf"; }

class EngineHost {
public:
    // `env`: extra environment (EH_TEST_ENGINE_DELAY_MS, ...). `plugins`:
    // the plugin directory (default: the deterministic test engine).
    // `model`: the model file (default: stories260K).
    EngineHost(std::vector<std::string> extra_args = {}, std::map<std::string, std::string> env = {},
               bool wait_ready = true, std::string plugins = std::string(EH_TEST_PLUGIN_DIR) + "/good",
               std::string model = stories_model()) {
        std::random_device rd;
        log_path_ = (std::filesystem::temp_directory_path() / ("eh-http-test-" + std::to_string(rd()) + ".log")).string();
        std::vector<std::string> args = {EH_ENGINE_HOST, "--plugins", plugins,
                                         "--model", model, "--port", "0"};
        for (auto& a : extra_args) args.push_back(a);
#ifdef EH_PLUGIN_DIR
        // The build's plugin folder also holds a CUDA build's GPU plugins,
        // rejected on a machine without a GPU, and serve's default then
        // refuses rather than fall back (--device): these tests ask for the
        // CPU engine they are about.
        if (plugins == EH_PLUGIN_DIR && std::find(args.begin(), args.end(), "--device") == args.end())
            args.insert(args.end(), {"--device", "cpu"});
#endif
        pid_ = fork();
        if (pid_ == 0) {
            for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
            FILE* f = std::fopen(log_path_.c_str(), "w");
            dup2(fileno(f), 1);
            dup2(fileno(f), 2);
            std::vector<char*> argv;
            for (auto& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
        for (int i = 0; i < 500 && port_ == 0; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            for (auto& j : log_events())
                if (j.value("event", "") == "listening") port_ = j.value("port", 0);
            std::string text = log();  // --log-format text: "... listening ... port=N"
            if (size_t at = text.find(" listening "); port_ == 0 && at != std::string::npos) {
                size_t p = text.find("port=", at);
                if (p != std::string::npos) port_ = std::atoi(text.c_str() + p + 5);
            }
            if (!running()) break;
        }
        if (wait_ready && port_) {
            // Until /health says the model is loaded (a loaded machine, as CI
            // running tests side by side, can take seconds; a request before
            // then is answered 503 "still loading"), for at most a minute.
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
            while (std::chrono::steady_clock::now() < until && running()) {
                try {
                    if (http(port_, "GET", "/health").status == 200) break;
                } catch (...) {
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
        }
    }
    ~EngineHost() {
        if (pid_ > 0 && exit_status_ < 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        std::error_code ec;
        std::filesystem::remove(log_path_, ec);
    }
    int port() const { return port_; }
    pid_t pid() const { return pid_; }
    bool running() {
        if (exit_status_ >= 0) return false;
        int st;
        pid_t r = waitpid(pid_, &st, WNOHANG);
        if (r == pid_) {
            exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            return false;
        }
        return true;
    }
    // Sends `sig` and waits for the exit status (-1 if it does not exit in time).
    int stop(int sig = SIGTERM, int timeout_ms = 15000) {
        if (running()) kill(pid_, sig);
        return wait_exit(timeout_ms);
    }
    int wait_exit(int timeout_ms = 15000) {
        for (int i = 0; i < timeout_ms / 10 && running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return running() ? -1 : exit_status_;
    }
    std::string log() const {
        std::ifstream f(log_path_);
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
    }
    std::vector<nlohmann::json> log_events() const {
        std::vector<nlohmann::json> out;
        std::istringstream in(log());
        std::string line;
        while (std::getline(in, line)) {
            auto j = nlohmann::json::parse(line, nullptr, false);
            if (!j.is_discarded() && j.is_object()) out.push_back(j);
        }
        return out;
    }
    HttpResponse get(const std::string& path) { return http(port_, "GET", path); }
    HttpResponse post(const std::string& path, const std::string& body,
                      const std::map<std::string, std::string>& headers = {}) {
        return http(port_, "POST", path, body, headers);
    }

private:
    pid_t pid_ = -1;
    int port_ = 0;
    int exit_status_ = -1;
    std::string log_path_;
};

}  // namespace eh::test
