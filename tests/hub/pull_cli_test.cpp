// The command line against the loopback hub: `pull`, `--model ORG/REPO:QUANT`
// on inspect and chat, offline mode, and the errors a user sees.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "fake_hub.hpp"

namespace fs = std::filesystem;
using eh::hub::test::FakeHub;
using eh::hub::test::FakeRepo;

namespace {

struct Outcome {
    int exit = -1;
    std::string out;  // stdout and stderr
};

class PullCli : public ::testing::Test {
protected:
    void SetUp() override {
        home = fs::temp_directory_path() / ("eh_pull_cli_" + std::to_string(::getpid()) + "_" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(home);
        fs::create_directories(home);
        FakeRepo r;
        r.commit = "89abcdef0123456789abcdef0123456789abcdef";
        r.files["stories260K-F32.gguf"] = {eh::hub::test::read_file(EH_TESTDATA_DIR "/models/stories260K.gguf"), true};
        r.files["other-Q8_0.gguf"] = {"not used", true};
        hub.add("tiny/stories", r);
    }
    void TearDown() override { fs::remove_all(home); }

    Outcome run(const std::string& args, const std::string& env = "") {
        return shell(env + " " EH_ENGINE_HOST " " + args);
    }
    // `command` in the hub's environment: this test's HF_HOME and the loopback hub.
    Outcome shell(const std::string& command) {
        std::string cmd = "env -u HF_TOKEN -u HF_HUB_CACHE -u HF_HUB_OFFLINE HF_HOME='" + home.string() +
                          "' HF_ENDPOINT='" + hub.endpoint() + "' " + command + " 2>&1";
        Outcome r;
        FILE* p = popen(cmd.c_str(), "r");
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
        int st = pclose(p);
        r.exit = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        return r;
    }

    FakeHub hub;
    fs::path home;
};

}  // namespace

TEST_F(PullCli, PullPrintsTheSnapshotPathAndLogsProgress) {
    Outcome r = run("pull tiny/stories:F32");
    ASSERT_EQ(r.exit, 0) << r.out;
    fs::path want = home / "hub/models--tiny--stories/snapshots/89abcdef0123456789abcdef0123456789abcdef/stories260K-F32.gguf";
    EXPECT_NE(r.out.find(want.string() + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("pull: stories260K-F32.gguf 100%"), std::string::npos) << "log lines off a terminal: " << r.out;
    EXPECT_TRUE(fs::exists(want));
}

TEST_F(PullCli, ModelRefsWorkOnInspectAndChat) {
    Outcome r = run("inspect --model tiny/stories:F32");
    ASSERT_EQ(r.exit, 0) << r.out;
    EXPECT_NE(r.out.find("llama"), std::string::npos) << r.out;
    r = run("chat -m hf://tiny/stories/stories260K-F32.gguf -p 'Once upon a time' -n 8 --offline --device cpu");
    EXPECT_EQ(r.exit, 0) << r.out;
    EXPECT_EQ(hub.cdn_gets.load(), 1) << "the second command used the cache";
}

TEST_F(PullCli, AProgressBarOnATerminal) {
    // script(1) gives engine-host a pseudo-terminal for stderr.
    Outcome r = shell("script -qefc '" EH_ENGINE_HOST " pull tiny/stories:F32' /dev/null");
    ASSERT_EQ(r.exit, 0) << r.out;
    EXPECT_NE(r.out.find("\rstories260K-F32.gguf [###"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("100% "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("MiB/s"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("pull: stories260K-F32.gguf 10%"), std::string::npos) << "no log lines on a terminal: " << r.out;
}

TEST_F(PullCli, ServeTakesAHubReference) {
    std::string cmd = "HF_HOME='" + home.string() + "' HF_ENDPOINT='" + hub.endpoint() + "' exec env -u HF_HUB_OFFLINE " EH_ENGINE_HOST
                      " serve -m tiny/stories:F32 --device cpu --port 0 --log-level warn --callback-url " + hub.endpoint() +
                      "/callback >/dev/null 2>&1";
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
        _exit(127);
    }
    for (int i = 0; i < 300 && hub.callbacks().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_EQ(hub.callbacks().size(), 1u) << "serve never became ready";
    auto body = nlohmann::json::parse(hub.callbacks().front());
    EXPECT_EQ(body.value("model_ref", ""), "tiny/stories:F32");
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    Outcome r = run("serve -m tiny/gone:Q4_0 --port 0");
    EXPECT_EQ(r.exit, 4) << r.out;
    EXPECT_NE(r.out.find("repository not found"), std::string::npos) << r.out;
}

TEST_F(PullCli, OfflineFlagAndVariableUseTheCacheOnly) {
    Outcome r = run("pull tiny/stories:F32 --offline");
    EXPECT_EQ(r.exit, 4) << r.out;
    EXPECT_NE(r.out.find("is not in the hub cache"), std::string::npos) << r.out;
    r = run("pull tiny/stories:F32", "HF_HUB_OFFLINE=1");
    EXPECT_EQ(r.exit, 4) << r.out;
    EXPECT_EQ(hub.heads.load() + hub.tree_gets.load(), 0);
    ASSERT_EQ(run("pull tiny/stories:F32").exit, 0);
    r = run("pull tiny/stories:F32 --json", "HF_HUB_OFFLINE=1");
    EXPECT_EQ(r.exit, 0) << r.out;
    EXPECT_NE(r.out.find("\"offline\": true"), std::string::npos) << r.out;
}

TEST_F(PullCli, ErrorsAUserCanActOn) {
    Outcome r = run("pull tiny/stories");
    EXPECT_EQ(r.exit, 2) << r.out;
    EXPECT_NE(r.out.find("error: tiny/stories has 2 GGUF files; name one as tiny/stories:QUANT"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("F32        stories260K-F32.gguf"), std::string::npos) << r.out;
    r = run("pull ./local.gguf");
    EXPECT_EQ(r.exit, 2) << r.out;
    EXPECT_NE(r.out.find("is not a hub reference"), std::string::npos) << r.out;
    r = run("pull 'hf://tiny/stories/../x.gguf'");
    EXPECT_EQ(r.exit, 2) << r.out;
    r = run("pull nobody/nothing:Q4_0");
    EXPECT_EQ(r.exit, 4) << r.out;
    EXPECT_NE(r.out.find("repository not found"), std::string::npos) << r.out;
    r = run("pull");
    EXPECT_EQ(r.exit, 2) << r.out;
}
