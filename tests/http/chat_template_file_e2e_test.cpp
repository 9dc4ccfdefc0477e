// engine-host serve --chat-template-file, /health's chat_template and
// inspect's chat template verdict, on stories260K (which has no template of
// its own) and re-written copies of it.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "engine_host_process.hpp"
#include "model_fixtures.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

const char* kChat = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3})";
const char* kTemplate = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}[assistant]";
const std::string kDeep = "{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}";

// A file in the temp folder, removed with the object.
struct TempFile {
    std::string path;
    explicit TempFile(const std::string& text) {
        static int n = 0;
        path = (std::filesystem::temp_directory_path() /
                ("eh-template-" + std::to_string(::getpid()) + "-" + std::to_string(++n) + ".jinja"))
                   .string();
        std::ofstream(path, std::ios::binary) << text;
    }
    ~TempFile() { std::filesystem::remove(path); }
};

// The prompt of the first job, from its execute_start line (--log-content).
std::string logged_prompt(EngineHost& h) {
    for (const auto& e : h.log_events())
        if (e.value("event", "") == "execute_start") return e.value("prompt", "");
    return "";
}

json chat_template_of(EngineHost& h) {
    auto r = h.get("/health");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false)["chat_template"];
}

TEST(ChatTemplateFile, ReplacesThePlainTranscript) {
    TempFile f(kTemplate);
    EngineHost h({"--chat-template-file", f.path, "--log-content"});
    ASSERT_TRUE(h.running()) << h.log();
    EXPECT_EQ(h.post("/v1/chat/completions", kChat).status, 200);
    EXPECT_NE(logged_prompt(h).find("[user] hi[assistant]"), std::string::npos) << h.log();
    EXPECT_EQ(chat_template_of(h), json({{"status", "ok"}, {"source", "file"}}));
}

TEST(ChatTemplateFile, WithoutItAModelWithoutATemplateGetsThePlainTranscript) {
    EngineHost h({"--log-content"});
    ASSERT_TRUE(h.running()) << h.log();
    EXPECT_EQ(h.post("/v1/chat/completions", kChat).status, 200);
    EXPECT_NE(logged_prompt(h).find("user: hi\nassistant:"), std::string::npos) << h.log();
    EXPECT_EQ(chat_template_of(h), json({{"status", "none"}}));
}

TEST(ChatTemplateFile, ReplacesARejectedModelTemplate) {
    TemplatedModel m(kDeep);
    TempFile f(kTemplate);
    EngineHost h({"--chat-template-file", f.path, "--log-content"}, {}, true,
                 std::string(EH_TEST_PLUGIN_DIR) + "/good", m.path);
    ASSERT_TRUE(h.running()) << h.log();
    auto r = h.post("/v1/chat/completions", kChat);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_NE(logged_prompt(h).find("[user] hi[assistant]"), std::string::npos) << h.log();
    EXPECT_EQ(chat_template_of(h), json({{"status", "ok"}, {"source", "file"}}));
    for (const auto& e : h.log_events()) EXPECT_NE(e.value("event", ""), "chat_template_rejected") << h.log();
}

TEST(ChatTemplateFile, AModelTemplateThatCompilesIsOk) {
    TemplatedModel m(kTemplate);
    EngineHost h({}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", m.path);
    ASSERT_TRUE(h.running()) << h.log();
    EXPECT_EQ(chat_template_of(h), json({{"status", "ok"}, {"source", "model"}}));
}

// serve --chat-template-file with a file it cannot use: exit 2 at once,
// naming the file (and for a compile error its line and reason).
TEST(ChatTemplateFile, AnUnusableFileIsAUsageError) {
    TempFile bad("{% for m in messages %}\n{% frobnicate %}\n{% endfor %}");
    TempFile empty("");
    TempFile big(std::string((size_t(1) << 20) + 1, 'x'));
    const std::string dir = std::filesystem::temp_directory_path().string();
    const std::string fifo = dir + "/eh-template-fifo-" + std::to_string(::getpid());
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const std::vector<std::pair<std::string, std::string>> cases = {
        {bad.path, bad.path + ": chat template line 2: unsupported statement 'frobnicate'"},
        {empty.path, empty.path + " is empty"},
        {big.path, big.path + " is larger than the limit of 1048576 bytes"},
        {fifo, fifo + " is not a regular file"},
        {dir, dir + " is not a regular file"},
        {dir + "/eh-no-such-template.jinja", "cannot read " + dir + "/eh-no-such-template.jinja: No such file"},
    };
    for (const auto& [path, want] : cases) {
        // `timeout`: a FIFO that blocked the open would hang here.
        auto [status, out] = run_command("timeout 20 " EH_ENGINE_HOST " --plugins " EH_TEST_PLUGIN_DIR
                                         "/good --model " + stories_model() + " --port 0 --chat-template-file '" +
                                         path + "' 2>&1");
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << path << ": " << status << "\n" << out;
        EXPECT_NE(out.find("error: --chat-template-file " + want), std::string::npos) << out;
    }
    std::filesystem::remove(fifo);
}

// inspect: the verdict on the model's own template (serve still serves a
// file whose template is rejected: exit 0).
TEST(ChatTemplateInspect, SaysWhetherTheTemplateCompiles) {
    auto inspect = [](const std::string& model) {
        return run_command(EH_ENGINE_HOST " inspect --model " + model + " 2>&1");
    };
    TemplatedModel deep(kDeep), good(kTemplate);
    auto [s1, rejected] = inspect(deep.path);
    EXPECT_EQ(s1, 0) << rejected;
    EXPECT_NE(rejected.find("rejected: chat template line 1: nesting deeper than 200 levels"), std::string::npos)
        << rejected;
    auto [s2, compiles] = inspect(good.path);
    EXPECT_EQ(s2, 0) << compiles;
    EXPECT_NE(compiles.find("compiles"), std::string::npos) << compiles;
    auto [s3, none] = inspect(stories_model());
    EXPECT_EQ(s3, 0) << none;
    EXPECT_NE(none.find("chat_template"), std::string::npos) << none;
    EXPECT_NE(none.find("none (chat requests get"), std::string::npos) << none;
}

// inspect --chat-template-file: checked as serve checks it (an unusable
// file is serve's exit 2, the verdict says why), and a usable one is named
// as the template in use beside the model's own verdict.
TEST(ChatTemplateInspect, TakesTheFileServeWouldBeGiven) {
    TemplatedModel deep(kDeep);
    TempFile good(kTemplate), bad("{% for m in messages %}\n{% frobnicate %}\n{% endfor %}");
    const std::string inspect = EH_ENGINE_HOST " inspect --model " + deep.path + " --chat-template-file ";
    auto [s1, ok] = run_command(inspect + good.path + " 2>&1");
    EXPECT_EQ(s1, 0) << ok;
    EXPECT_NE(ok.find("rejected: chat template line 1: nesting deeper than 200 levels"), std::string::npos) << ok;
    EXPECT_NE(ok.find("--chat-template-file " + good.path + ": compiles (replaces the model's)"), std::string::npos) << ok;
    EXPECT_NE(ok.find("yes, as far as checked"), std::string::npos) << ok;
    auto [s2, refused] = run_command(inspect + bad.path + " 2>&1");
    EXPECT_TRUE(WIFEXITED(s2) && WEXITSTATUS(s2) == 2) << s2 << "\n" << refused;
    EXPECT_NE(refused.find("no: serve refuses this file"), std::string::npos) << refused;
    EXPECT_NE(refused.find("--chat-template-file " + bad.path + ": chat template line 2: unsupported statement 'frobnicate'"),
              std::string::npos) << refused;
    // serve reads the template first: with a model that cannot be opened
    // either, the template's error and exit 2
    auto [s4, both] = run_command(EH_ENGINE_HOST " inspect --offline --model /nonexistent/eh-model.gguf --chat-template-file " +
                                  bad.path + " 2>&1");
    EXPECT_TRUE(WIFEXITED(s4) && WEXITSTATUS(s4) == 2) << s4 << "\n" << both;
    EXPECT_NE(both.find("unsupported statement 'frobnicate'"), std::string::npos) << both;
    auto [s3, js] = run_command(inspect + bad.path + " --json");
    EXPECT_TRUE(WIFEXITED(s3) && WEXITSTATUS(s3) == 2) << s3 << "\n" << js;
    EXPECT_NE(js.find("\"exit_code\":2"), std::string::npos) << js;
}

// `chat` has nothing to do without a template: it refuses a rejected one
// before loading the model (exit 2), and takes --chat-template-file too.
TEST(ChatTemplateChat, RefusesARejectedTemplateAndTakesAFile) {
    TemplatedModel deep(kDeep);
    const std::string chat = "timeout 60 " EH_ENGINE_HOST " chat --plugins " EH_PLUGIN_DIR " --device cpu -n 2 -p hi --model ";
    auto [s1, refused] = run_command(chat + deep.path + " 2>&1");
    EXPECT_TRUE(WIFEXITED(s1) && WEXITSTATUS(s1) == 2) << s1 << "\n" << refused;
    EXPECT_NE(refused.find("nesting deeper than 200 levels"), std::string::npos) << refused;
    EXPECT_NE(refused.find("--chat-template-file"), std::string::npos) << refused;
    TempFile f(kTemplate);
    auto [s2, answered] = run_command(chat + deep.path + " --chat-template-file " + f.path + " 2>&1");
    EXPECT_EQ(s2, 0) << answered;
}

}  // namespace
