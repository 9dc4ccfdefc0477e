// API keys: the comparison, how a request presents a key, which routes need
// one, and the key file (in process; the server's use of them is in
// auth_access_test.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "auth.hpp"
#include "eh/error.hpp"
#include "request_guard.hpp"

namespace eh::http {
namespace {

TEST(ApiKeys, AcceptsExactlyTheConfiguredKeys) {
    ApiKeys keys({"alpha-key", "b", std::string(4096, 'z')});
    EXPECT_TRUE(keys.required());
    EXPECT_TRUE(keys.accepts("alpha-key"));
    EXPECT_TRUE(keys.accepts("b"));
    EXPECT_TRUE(keys.accepts(std::string(4096, 'z')));
    for (const char* wrong : {"", "alpha", "alpha-key ", "alpha-keyx", "ALPHA-KEY", "bb", "a", "alpha-kez"})
        EXPECT_FALSE(keys.accepts(wrong)) << wrong;
    EXPECT_FALSE(keys.accepts(std::string(4095, 'z')));
    EXPECT_FALSE(keys.accepts(std::string(4097, 'z')));
}

TEST(ApiKeys, NoKeysMeansNoneRequiredAndNoneAccepted) {
    ApiKeys none;
    EXPECT_FALSE(none.required());
    EXPECT_FALSE(none.accepts("anything"));
}

TEST(ApiKeys, PresentedKeyComesFromBearerThenXApiKey) {
    EXPECT_EQ(presented_key("Bearer abc", ""), "abc");
    EXPECT_EQ(presented_key("bearer abc", ""), "abc");   // the scheme is case-insensitive
    EXPECT_EQ(presented_key("BEARER   abc  ", ""), "abc");
    EXPECT_EQ(presented_key("Basic abc", ""), "");         // another scheme is no key
    EXPECT_EQ(presented_key("Bearer", ""), "");
    EXPECT_EQ(presented_key("", "xkey"), "xkey");          // Anthropic clients
    EXPECT_EQ(presented_key("Bearer abc", "xkey"), "abc");
    EXPECT_EQ(presented_key("", ""), "");
}

TEST(ApiKeys, AnyRunOfBlanksFollowsTheScheme) {
    EXPECT_EQ(presented_key("Bearer\tabc", ""), "abc");
    EXPECT_EQ(presented_key(" bearer \t abc\t", ""), "abc");
    EXPECT_EQ(presented_key("Bearerabc", ""), "");  // no blank: another scheme
    EXPECT_EQ(parse_authorization("Basic  dXNlcg==").scheme, "Basic");
    EXPECT_EQ(parse_authorization("Basic  dXNlcg==").token, "dXNlcg==");
    EXPECT_EQ(parse_authorization("  ").scheme, "");
}

// The owner of a job (POST /cancel) is the credential, never the header's
// spelling, and the key is not kept.
TEST(ApiKeys, CredentialIdentityIgnoresSpellingAndKeepsNoKey) {
    const std::string id = credential_identity("Bearer key-one");
    EXPECT_EQ(id.size(), 64u);
    EXPECT_EQ(id.find("key-one"), std::string::npos);
    for (const char* same : {"bearer key-one", "BEARER  key-one", "Bearer\tkey-one", " Bearer key-one \t"})
        EXPECT_EQ(credential_identity(same), id) << same;
    for (const char* other : {"Bearer key-two", "Bearer Key-one", "Basic key-one", "Bearer", "Bearerkey-one"})
        EXPECT_NE(credential_identity(other), id) << other;
    EXPECT_EQ(credential_identity(""), "");
    EXPECT_EQ(credential_identity(" \t"), "");
}

TEST(ApiKeys, RoutesThatStayOpen) {
    EXPECT_FALSE(route_needs_key("GET", "/health", false));
    EXPECT_FALSE(route_needs_key("GET", "/metrics", false));
    EXPECT_TRUE(route_needs_key("GET", "/metrics", true));
    EXPECT_FALSE(route_needs_key("GET", "/", false));           // the chat page asks for the key itself
    EXPECT_FALSE(route_needs_key("GET", "/chat.js", false));
    EXPECT_FALSE(route_needs_key("OPTIONS", "/v1/chat/completions", false));  // CORS preflight
    for (const char* p : {"/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/messages", "/execute",
                          "/cancel", "/tokenize", "/detokenize", "/capabilities", "/v1/capabilities", "/shutdown",
                          "/no-such-route", "/../health"})
        for (const char* m : {"GET", "POST"}) EXPECT_TRUE(route_needs_key(m, p, false)) << m << " " << p;
    EXPECT_TRUE(route_needs_key("POST", "/", false));
    EXPECT_TRUE(route_needs_key("GET", "/capabilities", false));
}

TEST(ApiKeys, KeyProblems) {
    EXPECT_EQ(key_problem("sk-abc_123.XYZ~"), "");
    EXPECT_NE(key_problem(""), "");
    EXPECT_NE(key_problem("has space"), "");
    EXPECT_NE(key_problem("tab\there"), "");
    EXPECT_NE(key_problem("caf\xc3\xa9"), "");
    EXPECT_NE(key_problem(std::string(4097, 'k')), "");
}

class KeyFile : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = std::filesystem::temp_directory_path() / ("eh-keys-" + std::to_string(std::random_device{}()));
        std::filesystem::create_directories(dir_);
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }
    std::string write(const std::string& name, const std::string& text) {
        auto p = dir_ / name;
        std::ofstream(p, std::ios::binary) << text;
        return p.string();
    }
    std::string error_of(const std::string& path) {
        try {
            read_api_key_file(path);
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    }
    std::filesystem::path dir_;
};

TEST_F(KeyFile, ReadsOneKeyALineSkippingCommentsAndBlankLines) {
    auto p = write("keys", "# team keys\nfirst-key\r\n\n  second-key  \n#third\nthird-key");
    EXPECT_EQ(read_api_key_file(p), (std::vector<std::string>{"first-key", "second-key", "third-key"}));
}

TEST_F(KeyFile, ClearErrorsThatNeverQuoteAKey) {
    EXPECT_NE(error_of(dir_.string()).find("not a regular file"), std::string::npos) << error_of(dir_.string());
    EXPECT_NE(error_of((dir_ / "absent").string()).find("no such file"), std::string::npos);
    EXPECT_NE(error_of(write("empty", "# nothing\n\n")).find("holds no key"), std::string::npos);
    std::string bad = error_of(write("bad", "good-key\nsecret with-space\n"));
    EXPECT_NE(bad.find("line 2"), std::string::npos) << bad;
    EXPECT_EQ(bad.find("secret"), std::string::npos) << bad;
}

TEST(FormContentType, OnlyTheFormMediaType) {
    EXPECT_TRUE(form_content_type("application/x-www-form-urlencoded"));
    EXPECT_TRUE(form_content_type("Application/X-WWW-Form-Urlencoded; charset=utf-8"));
    EXPECT_FALSE(form_content_type("application/json"));
    EXPECT_FALSE(form_content_type(""));
}

}  // namespace
}  // namespace eh::http
