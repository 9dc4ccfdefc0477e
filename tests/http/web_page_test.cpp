// The chat page's files are served from the binary at `/` with their types
// and a self-only content policy; names that are not page files stay 404.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine_host_process.hpp"

using nlohmann::json;
using namespace eh::test;

namespace {

// The deterministic test engine over the shipped model: no ../shared needed.
EngineHost& server() {
    static EngineHost h({}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", EH_DEFAULT_MODEL);
    return h;
}

}  // namespace

TEST(WebPage, ServesThePageAndItsFiles) {
    EngineHost& h = server();
    ASSERT_GT(h.port(), 0) << h.log();
    auto page = h.get("/");
    ASSERT_EQ(page.status, 200);
    EXPECT_EQ(page.header("content-type"), "text/html; charset=utf-8");
    EXPECT_NE(page.body.find("<script src=\"/chat.js\">"), std::string::npos);
    EXPECT_NE(page.header("content-security-policy").find("default-src 'self'"), std::string::npos);
    EXPECT_EQ(h.get("/index.html").body, page.body);

    auto js = h.get("/chat.js");
    ASSERT_EQ(js.status, 200);
    EXPECT_EQ(js.header("content-type"), "text/javascript; charset=utf-8");
    EXPECT_NE(js.body.find("/v1/chat/completions"), std::string::npos);
    auto css = h.get("/chat.css");
    ASSERT_EQ(css.status, 200);
    EXPECT_EQ(css.header("content-type"), "text/css; charset=utf-8");
}

TEST(WebPage, UnknownFilesAreNotFound) {
    EngineHost& h = server();
    ASSERT_GT(h.port(), 0) << h.log();
    for (const char* path : {"/nope.js", "/index.htm", "/chat.js/x", "/..%2fCMakeLists.txt"}) {
        auto r = h.get(path);
        EXPECT_EQ(r.status, 404) << path;
        EXPECT_EQ(json::parse(r.body)["error"]["code"], "NOT_FOUND") << path << ": " << r.body;
    }
    EXPECT_EQ(h.post("/", "{}").status, 404);  // the page takes GET only
}
