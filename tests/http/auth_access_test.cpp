// API keys, the access log, the request limits and HTTPS on the real
// engine-host process (test engine behind it).
#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine_host_process.hpp"
#include "streamed_job.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

const std::map<std::string, std::string> kJson = {{"Content-Type", "application/json"}};

std::map<std::string, std::string> bearer(const std::string& key) {
    return {{"Authorization", "Bearer " + key}};
}

std::string chat_body(int max_tokens = 3) {
    return json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", max_tokens}, {"temperature", 0}}
        .dump();
}

std::vector<json> access_lines(const EngineHost& h) {
    std::vector<json> out;
    for (auto& j : h.log_events())
        if (j.value("event", "") == "http_request") out.push_back(j);
    return out;
}

// The log is flushed per line, but a line is written after the response:
// wait until `n` access lines are there.
std::vector<json> wait_access_lines(const EngineHost& h, size_t n) {
    for (int i = 0; i < 300; ++i) {
        auto lines = access_lines(h);
        if (lines.size() >= n) return lines;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return access_lines(h);
}

class TempDir {
public:
    TempDir() : dir_(std::filesystem::temp_directory_path() / ("eh-auth-" + std::to_string(std::random_device{}()))) {
        std::filesystem::create_directories(dir_);
    }
    ~TempDir() { std::filesystem::remove_all(dir_); }
    std::string file(const std::string& name, const std::string& text) const {
        std::ofstream(dir_ / name, std::ios::binary) << text;
        return (dir_ / name).string();
    }
    std::string path(const std::string& name) const { return (dir_ / name).string(); }

private:
    std::filesystem::path dir_;
};

}  // namespace

TEST(Auth, MissingWrongAndRightKey) {
    EngineHost h({"--api-key", "right-key-1"});
    ASSERT_GT(h.port(), 0) << h.log();
    auto missing = h.post("/v1/chat/completions", chat_body());
    EXPECT_EQ(missing.status, 401) << missing.body;
    json e = json::parse(missing.body)["error"];
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["code"], "INVALID_API_KEY");
    EXPECT_NE(e["message"].get<std::string>().find("Authorization: Bearer"), std::string::npos);
    EXPECT_EQ(missing.header("www-authenticate"), "Bearer");

    auto wrong = h.post("/v1/chat/completions", chat_body(), bearer("right-key-2"));
    EXPECT_EQ(wrong.status, 401);
    EXPECT_EQ(json::parse(wrong.body)["error"]["message"], "invalid API key");
    EXPECT_EQ(h.post("/v1/chat/completions", chat_body(), bearer("right-key")).status, 401);  // a prefix
    EXPECT_EQ(h.post("/v1/chat/completions", chat_body(), {{"Authorization", "Basic right-key-1"}}).status, 401);
    // x-api-key is the Anthropic routes' header only.
    EXPECT_EQ(h.post("/v1/chat/completions", chat_body(), {{"x-api-key", "right-key-1"}}).status, 401);

    auto right = h.post("/v1/chat/completions", chat_body(), bearer("right-key-1"));
    EXPECT_EQ(right.status, 200) << right.body;
    // Every route but the open ones, unknown ones included (no route map for strangers).
    for (const char* p : {"/v1/models", "/capabilities", "/v1/capabilities", "/no-such-route"})
        EXPECT_EQ(h.get(p).status, 401) << p;
    for (const char* p : {"/execute", "/tokenize", "/detokenize", "/cancel", "/v1/completions"})
        EXPECT_EQ(h.post(p, "{}").status, 401) << p;
    EXPECT_EQ(h.get("/v1/models").status, 401);
    EXPECT_EQ(http(h.port(), "GET", "/v1/models", "", bearer("right-key-1")).status, 200);
    EXPECT_EQ(http(h.port(), "GET", "/no-such-route", "", bearer("right-key-1")).status, 404);
}

TEST(Auth, OpenRoutesAndMetricsFlag) {
    {
        EngineHost h({"--api-key", "k-open"});
        EXPECT_EQ(h.get("/health").status, 200);
        EXPECT_EQ(h.get("/metrics").status, 200);
        auto page = h.get("/");
        EXPECT_EQ(page.status, 200);  // the chat page asks for the key itself
        EXPECT_NE(page.body.find("<html"), std::string::npos);
        EXPECT_EQ(h.get("/chat.js").status, 200);
    }
    {
        EngineHost h({"--api-key", "k-metrics", "--metrics-require-key"});
        EXPECT_EQ(h.get("/health").status, 200);
        EXPECT_EQ(h.get("/metrics").status, 401);
        EXPECT_EQ(http(h.port(), "GET", "/metrics", "", bearer("k-metrics")).status, 200);
    }
    {
        EngineHost h;  // no keys: nothing is asked for
        EXPECT_EQ(h.post("/v1/chat/completions", chat_body()).status, 200);
    }
}

TEST(Auth, CorsPreflightNeedsNoKeyAndA401IsReadableCrossOrigin) {
    EngineHost h({"--api-key", "k-cors", "--cors"});
    const std::map<std::string, std::string> origin = {{"Origin", "http://localhost:3000"}};
    auto pre = http(h.port(), "OPTIONS", "/v1/chat/completions", "",
                    {{"Origin", "http://localhost:3000"}, {"Access-Control-Request-Method", "POST"},
                     {"Access-Control-Request-Headers", "authorization, content-type"}});
    EXPECT_EQ(pre.status, 204);
    EXPECT_NE(pre.header("access-control-allow-headers").find("Authorization"), std::string::npos);
    auto denied = h.post("/v1/chat/completions", chat_body(), origin);
    EXPECT_EQ(denied.status, 401);
    EXPECT_EQ(denied.header("access-control-allow-origin"), "http://localhost:3000");
    auto allowed = h.post("/v1/chat/completions", chat_body(), {{"Origin", "http://localhost:3000"}, {"Authorization", "Bearer k-cors"}});
    EXPECT_EQ(allowed.status, 200) << allowed.body;
}

TEST(Auth, SeveralKeysFromFlagsFileAndEnvironment) {
    TempDir d;
    std::string file = d.file("keys", "# ops\nfile-key-a\n\nfile-key-b\r\n");
    EngineHost h({"--api-key", "flag-key-1", "--api-key", "flag-key-2", "--api-key-file", file},
                 {{"ENGINE_HOST_API_KEY", "env-key"}});
    ASSERT_GT(h.port(), 0) << h.log();
    for (const char* k : {"flag-key-1", "flag-key-2", "file-key-a", "file-key-b", "env-key"})
        EXPECT_EQ(http(h.port(), "GET", "/v1/models", "", bearer(k)).status, 200) << k;
    for (const char* k : {"flag-key-3", "file-key", "# ops", "env-key2"})
        EXPECT_EQ(http(h.port(), "GET", "/v1/models", "", bearer(k)).status, 401) << k;
}

TEST(Auth, BadKeyFilesAreClearStartupErrors) {
    TempDir d;
    auto run = [&](std::vector<std::string> args) {
        EngineHost h(args, {}, false);
        int rc = h.wait_exit(10000);
        return std::make_pair(rc, h.log());
    };
    auto [rc_dir, log_dir] = run({"--api-key-file", d.path("")});
    EXPECT_EQ(rc_dir, 2);
    EXPECT_NE(log_dir.find("not a regular file"), std::string::npos) << log_dir;
    auto [rc_empty, log_empty] = run({"--api-key-file", d.file("empty", "\n# none\n")});
    EXPECT_EQ(rc_empty, 2);
    EXPECT_NE(log_empty.find("holds no key"), std::string::npos) << log_empty;
    auto [rc_bad, log_bad] = run({"--api-key", "has space"});
    EXPECT_EQ(rc_bad, 2);
    EXPECT_EQ(log_bad.find("has space"), std::string::npos) << log_bad;  // a key is never echoed
    auto [rc_m, log_m] = run({"--metrics-require-key"});
    EXPECT_EQ(rc_m, 2) << log_m;
}

TEST(Auth, KeysNeverReachTheLog) {
    for (const char* format : {"json", "text"}) {
        SCOPED_TRACE(format);
        const std::string key = "sk-secret-7f3a9c", wrong = "sk-wrong-b41d2e";
        EngineHost h({"--api-key", key, "--log-format", format, "--log-level", "trace", "--log-content"});
        ASSERT_GT(h.port(), 0) << h.log();
        EXPECT_EQ(h.post("/v1/chat/completions", chat_body(), bearer(key)).status, 200);
        EXPECT_EQ(h.post("/v1/chat/completions", chat_body(), bearer(wrong)).status, 401);
        EXPECT_EQ(h.post("/v1/messages", "{}", {{"x-api-key", wrong}}).status, 401);
        EXPECT_EQ(http(h.port(), "GET", "/v1/models?key=" + wrong, "", bearer(key)).status, 200);
        std::string log = h.log();
        EXPECT_NE(log.find("http_request"), std::string::npos);
        EXPECT_EQ(log.find("sk-secret"), std::string::npos) << log;
        EXPECT_EQ(log.find("sk-wrong"), std::string::npos) << log;
    }
}

TEST(AccessLog, OneLinePerRequestRefusalsIncluded) {
    EngineHost h({"--api-key", "k", "--max-body-bytes", "4096"}, {{"EH_TEST_ENGINE_LOAD_DELAY_MS", "1500"}}, false);
    ASSERT_GT(h.port(), 0) << h.log();
    std::vector<std::pair<HttpResponse, std::string>> sent;  // response, "METHOD path"
    auto send = [&](const std::string& method, const std::string& path, const std::string& body,
                    std::map<std::string, std::string> headers) {
        sent.push_back({http(h.port(), method, path, body, headers), method + " " + path});
        return sent.back().first;
    };
    auto loading = send("POST", "/v1/chat/completions", chat_body(), bearer("k"));
    EXPECT_EQ(loading.status, 503) << loading.body;
    while (send("GET", "/health", "", {}).status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(send("GET", "/v1/models", "", {}).status, 401);
    EXPECT_EQ(send("GET", "/nope", "", bearer("k")).status, 404);
    EXPECT_EQ(send("POST", "/tokenize", std::string(5000, ' '), bearer("k")).status, 413);  // refused by the gate
    EXPECT_EQ(send("POST", "/v1/chat/completions", chat_body(4), bearer("k")).status, 200);
    auto stream = send("POST", "/v1/chat/completions",
                       json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4}, {"stream", true}}.dump(),
                       bearer("k"));
    EXPECT_EQ(stream.status, 200);

    auto lines = wait_access_lines(h, sent.size());
    ASSERT_EQ(lines.size(), sent.size()) << h.log();
    for (const auto& [r, what] : sent) {
        SCOPED_TRACE(what);
        const std::string cid = r.header("x-correlation-id");
        ASSERT_FALSE(cid.empty());
        size_t matches = 0;
        for (const auto& l : lines) {
            if (l["correlation_id"] != cid) continue;
            ++matches;
            EXPECT_EQ(l["status"].get<int>(), r.status);
            EXPECT_EQ(l["method"].get<std::string>() + " " + l["path"].get<std::string>(), what);
            EXPECT_GE(l["bytes"].get<uint64_t>(), r.body.size());
            EXPECT_GE(l["total_ms"].get<double>(), 0.0);
            // Only requests that ran a job have a queue time.
            EXPECT_EQ(l.contains("queue_ms"), r.status == 200 && what.rfind("POST /v1/chat", 0) == 0) << l.dump();
        }
        EXPECT_EQ(matches, 1u);
    }
}

TEST(AccessLog, AClientThatLeavesMidStreamStillGetsItsLine) {
    EngineHost h({}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    int events = 0;
    auto r = sse_stream(h.port(), "/execute",
                        R"({"job_id":"leaver","prompt":"Once upon a time","max_tokens":500})",
                        [&](const SseEvent&) { return ++events < 3; }, {{"X-Correlation-Id", "leaver-1"}});
    EXPECT_EQ(r.status, 200);
    json line;
    for (int i = 0; i < 300 && line.is_null(); ++i) {
        for (auto& l : access_lines(h))
            if (l["correlation_id"] == "leaver-1") line = l;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_FALSE(line.is_null()) << h.log();
    EXPECT_EQ(line["status"], 200);
    EXPECT_EQ(line["path"], "/execute");
    EXPECT_GT(line["bytes"].get<uint64_t>(), 0u);
    EXPECT_TRUE(line.contains("queue_ms"));
    size_t mine = 0;  // one line, however the stream ended (the others are the start-up /health polls)
    for (auto& l : access_lines(h)) mine += l["correlation_id"] == "leaver-1";
    EXPECT_EQ(mine, 1u);
}

TEST(Limits, FormTypedAndUntypedBodiesAreReadAsJson) {
    EngineHost h;
    const std::string body = json{{"text", std::string(10 * 1024, 'a')}}.dump();  // past httplib's 8 KiB form limit
    auto form = h.post("/tokenize", body, {{"Content-Type", "application/x-www-form-urlencoded"}});
    EXPECT_EQ(form.status, 200) << form.body;
    auto untyped = http_raw(h.port(), "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: " +
                                          std::to_string(body.size()) + "\r\n\r\n" + body);
    EXPECT_EQ(untyped.status, 200) << untyped.body;
    EXPECT_EQ(json::parse(form.body)["count"], json::parse(untyped.body)["count"]);
    // A browser's cross-site form post is still refused (it carries an Origin).
    auto cross = h.post("/tokenize", body, {{"Content-Type", "application/x-www-form-urlencoded"}, {"Origin", "https://evil.example"}});
    EXPECT_EQ(cross.status, 415);
}

TEST(Limits, BodyAndPromptLimitsAreTheConfiguredNumbers) {
    EngineHost h({"--max-body-bytes", "4096", "--max-prompt-chars", "100"});
    ASSERT_GT(h.port(), 0) << h.log();
    auto caps = json::parse(h.get("/capabilities").body);
    EXPECT_EQ(caps["limits"]["max_body_bytes"], 4096);
    EXPECT_EQ(caps["limits"]["max_prompt_chars"], 100);

    const std::string big = json{{"text", std::string(5000, 'a')}}.dump();
    for (const auto& type : {std::string("application/json"), std::string("application/x-www-form-urlencoded")}) {
        auto r = h.post("/tokenize", big, {{"Content-Type", type}});
        EXPECT_EQ(r.status, 413) << r.body;
        json e = json::parse(r.body)["error"];
        EXPECT_NE(e["message"].get<std::string>().find("4096 bytes"), std::string::npos) << r.body;
        EXPECT_EQ(e["details"]["limit_bytes"], 4096);
    }
    auto chunked = http_raw(h.port(), "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                                      "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                                      "1388\r\n" + std::string(5000, 'a') + "\r\n0\r\n\r\n");
    EXPECT_EQ(chunked.status, 413);
    EXPECT_NE(chunked.body.find("4096"), std::string::npos);

    auto fits = h.post("/tokenize", json{{"text", std::string(100, 'a')}}.dump());
    EXPECT_EQ(fits.status, 200) << fits.body;
    auto longer = h.post("/v1/completions", json{{"prompt", std::string(101, 'a')}, {"max_tokens", 1}}.dump());
    EXPECT_EQ(longer.status, 400);
    EXPECT_NE(json::parse(longer.body)["error"]["message"].get<std::string>().find("the limit is 100"), std::string::npos)
        << longer.body;
}

TEST(Limits, OutOfRangeFlagsAreUsageErrors) {
    for (auto args : {std::vector<std::string>{"--max-body-bytes", "10"}, {"--max-prompt-chars", "16777217"},
                      {"--ssl-cert-file", "/nonexistent.pem"}, {"--engine-options", "fp16_weights=off"},
                      {"--engine-options", "[1]"}}) {
        EngineHost h(args, {}, false);
        EXPECT_EQ(h.wait_exit(10000), 2) << h.log();
    }
}

// --engine-options reaches the plugin's load: a key the test plugin does not
// know is ignored (the server comes up); a JSON object is required.
TEST(Limits, EngineOptionsAreHandedToThePlugin) {
    EngineHost h({"--engine-options", R"({"unknown_key": 1})"});
    EXPECT_EQ(h.get("/health").status, 200) << h.log();
    EngineHost bad({"--engine-options", "{"}, {}, false);
    EXPECT_EQ(bad.wait_exit(10000), 2) << bad.log();
    EXPECT_NE(bad.log().find("--engine-options must be a JSON object"), std::string::npos) << bad.log();
}

// ---- who may cancel: the credential, not the header's text ------------------

namespace {

std::string exec_body(const std::string& id, int max_tokens) {
    return json{{"job_id", id}, {"prompt", "Once upon a time"}, {"max_tokens", max_tokens}}.dump();
}

std::string cancel_status(const HttpResponse& r) {
    auto j = json::parse(r.body, nullptr, false);
    return j.is_object() ? j.value("status", "") : "";
}

}  // namespace

// RFC 7235: the scheme is case-insensitive and any run of blanks may follow
// it, so "bearer  KEY" is the client that sent "Bearer KEY".
TEST(Auth, TheOwnerIsTheParsedCredentialNotTheHeaderText) {
    EngineHost h({}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    ASSERT_GT(h.port(), 0) << h.log();
    StreamedJob job(h.port(), "owned", bearer("key-one"));
    EXPECT_EQ(cancel_status(h.post("/cancel", R"({"job_id":"owned"})", bearer("key-two"))), "unknown");
    EXPECT_EQ(cancel_status(h.post("/cancel", R"({"job_id":"owned"})", {{"Authorization", "Basic key-one"}})), "unknown");
    auto r = h.post("/cancel", R"({"job_id":"owned"})", {{"Authorization", "bearer \t key-one"}});
    EXPECT_EQ(cancel_status(r), "cancelling") << r.body;
    job.t.join();
    EXPECT_NE(job.terminal.find("CANCELLED"), std::string::npos) << job.terminal;
}

// Authorization is not a list: two of them are a 400, whichever is right
// (a proxy in front may have checked the other one).
TEST(Auth, TwoAuthorizationHeadersAreRefused) {
    EngineHost h({}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    ASSERT_GT(h.port(), 0) << h.log();
    // std::map keeps both spellings; HTTP names are case-insensitive.
    const std::map<std::string, std::string> two = {{"Authorization", "Bearer key-one"}, {"authorization", "Bearer key-two"}};
    for (const auto& [path, body] : {std::pair<std::string, std::string>{"/execute", exec_body("twice", 4)},
                                     {"/cancel", R"({"job_id":"twice"})"}}) {
        auto r = h.post(path, body, two);
        EXPECT_EQ(r.status, 400) << path << ": " << r.body;
        json e = json::parse(r.body, nullptr, false);
        ASSERT_TRUE(e.is_object()) << r.body;
        EXPECT_EQ(e["error"]["code"], "INVALID_REQUEST") << r.body;
        EXPECT_EQ(e["error"]["message"], "the request has 2 Authorization headers; send one") << r.body;
    }
    // A cancel with two headers cancels nothing.
    StreamedJob job(h.port(), "once", bearer("key-two"));
    EXPECT_EQ(h.post("/cancel", R"({"job_id":"once"})", two).status, 400);
    EXPECT_EQ(cancel_status(h.post("/cancel", R"({"job_id":"once"})", bearer("key-two"))), "cancelling");
}

// With two API keys, one key's cached prompt is never reused for the other:
// its cached_tokens would tell the other whether a guessed prompt matches
// (102 against 28 before). --prefix-cache-shared shares them (one tenant).
TEST(Auth, PrefixReuseStaysWithItsKeyUnlessShared) {
    std::string secret = "The secret plan:";
    for (int i = 0; i < 12; ++i) secret += " meet at the old mill at noon";
    for (bool shared : {false, true}) {
        std::vector<std::string> args = {"--api-key", "key-a", "--api-key", "key-b"};
        if (shared) args.push_back("--prefix-cache-shared");
        EngineHost h(args, {}, true, EH_PLUGIN_DIR);
        ASSERT_GT(h.port(), 0) << h.log();
        auto cached = [&](const std::string& key, const std::string& prompt) {
            auto r = h.post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}}.dump(),
                            bearer(key));
            EXPECT_EQ(r.status, 200) << r.body;
            json j = json::parse(r.body, nullptr, false);
            return j.is_object() ? j["usage"]["prompt_tokens_details"].value("cached_tokens", -1) : -1;
        };
        EXPECT_EQ(cached("key-a", secret), 0);
        const int guess = cached("key-b", secret + " and bring the map");
        if (shared) EXPECT_GT(guess, 16) << "shared: the other key's prefix is reused";
        else EXPECT_EQ(guess, 0) << "key-b reused key-a's cached prompt";
        EXPECT_GT(cached("key-a", secret + " tomorrow"), 16) << "shared " << shared << ": its own prefix is reused";
    }
}

// With API keys, every route refuses two credentials before the key check:
// a gateway in front that reads the second one would let a request through
// that the first one's key would have refused, or the other way round.
TEST(Auth, TwoCredentialHeadersAreRefusedOnEveryRoute) {
    EngineHost h({"--api-key", "key-one", "--api-key", "key-two"});
    ASSERT_GT(h.port(), 0) << h.log();
    const std::map<std::string, std::string> two = {{"Authorization", "Bearer key-one"}, {"authorization", "Bearer nope"}};
    for (const auto& [path, body] : {std::pair<std::string, std::string>{"/v1/completions", R"({"prompt":"x","max_tokens":2})"},
                                     {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2})"},
                                     {"/tokenize", R"({"text":"x"})"}}) {
        auto r = h.post(path, body, two);
        EXPECT_EQ(r.status, 400) << path << ": " << r.body;
        EXPECT_NE(r.body.find("2 Authorization headers"), std::string::npos) << path << ": " << r.body;
    }
    const std::map<std::string, std::string> keys = {{"x-api-key", "key-one"}, {"X-Api-Key", "nope"}};
    auto r = h.post("/v1/messages", R"({"model":"m","max_tokens":2,"messages":[{"role":"user","content":"x"}]})", keys);
    EXPECT_EQ(r.status, 400) << r.body;
    // One of them is served as before.
    EXPECT_EQ(h.post("/v1/completions", R"({"prompt":"x","max_tokens":2})", bearer("key-two")).status, 200);
}

// ---- HTTPS ------------------------------------------------------------------

namespace {

// A self-signed certificate for 127.0.0.1 (P-256), written as PEM files.
void make_certificate(const std::string& cert_path, const std::string& key_path) {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    ASSERT_NE(key, nullptr);
    X509* x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
    X509_set_issuer_name(x, name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
    X509_EXTENSION* san = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, "IP:127.0.0.1");
    X509_add_ext(x, san, -1);
    X509_EXTENSION_free(san);
    ASSERT_GT(X509_sign(x, key, EVP_sha256()), 0);
    FILE* c = std::fopen(cert_path.c_str(), "w");
    PEM_write_X509(c, x);
    std::fclose(c);
    FILE* k = std::fopen(key_path.c_str(), "w");
    PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(k);
    X509_free(x);
    EVP_PKEY_free(key);
}

}  // namespace

TEST(Https, RoundTripWithAVerifiedSelfSignedCertificate) {
    TempDir d;
    const std::string cert = d.path("cert.pem"), key = d.path("key.pem");
    make_certificate(cert, key);
    EngineHost h({"--ssl-cert-file", cert, "--ssl-key-file", key, "--api-key", "tls-key"}, {}, false);
    ASSERT_GT(h.port(), 0) << h.log();
    httplib::SSLClient cli("127.0.0.1", h.port());
    cli.set_ca_cert_path(cert.c_str());
    cli.enable_server_certificate_verification(true);
    cli.set_connection_timeout(5, 0);
    cli.set_read_timeout(20, 0);
    bool ready = false;
    for (int i = 0; i < 200 && !ready; ++i) {
        auto r = cli.Get("/health");
        ready = r && r->status == 200;
        if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ASSERT_TRUE(ready) << h.log();
    // Kept alive: several requests over one TLS connection, a stream among them.
    auto denied = cli.Post("/v1/chat/completions", chat_body(), "application/json");
    ASSERT_TRUE(denied);
    EXPECT_EQ(denied->status, 401);
    httplib::Headers auth = {{"Authorization", "Bearer tls-key"}};
    auto plain = cli.Post("/v1/chat/completions", auth, chat_body(5), "application/json");
    ASSERT_TRUE(plain);
    EXPECT_EQ(plain->status, 200) << plain->body;
    EXPECT_EQ(json::parse(plain->body)["choices"][0]["finish_reason"], "length");
    auto streamed = cli.Post("/v1/chat/completions", auth,
                             json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 5}, {"stream", true}}.dump(),
                             "application/json");
    ASSERT_TRUE(streamed);
    EXPECT_EQ(streamed->status, 200);
    EXPECT_NE(streamed->body.find("data: [DONE]"), std::string::npos) << streamed->body;

    // Plain HTTP on the TLS port gets no HTTP answer, and the server goes on.
    HttpResponse r;
    try {
        r = h.get("/health");
    } catch (...) {
    }
    EXPECT_EQ(r.status, 0);
    auto again = cli.Get("/health");
    ASSERT_TRUE(again);
    EXPECT_EQ(again->status, 200);
    EXPECT_NE(h.log().find("\"uri\":\"https://"), std::string::npos);
}

TEST(Https, UnusableCertificateFilesFailAtStartWithTheReason) {
    TempDir d;
    const std::string cert = d.path("cert.pem"), key = d.path("key.pem");
    make_certificate(cert, key);
    const std::string other_cert = d.path("other.pem"), other_key = d.path("other-key.pem");
    make_certificate(other_cert, other_key);
    {
        EngineHost h({"--ssl-cert-file", key, "--ssl-key-file", key}, {}, false);
        EXPECT_NE(h.wait_exit(10000), 0);
        EXPECT_NE(h.log().find("not a readable PEM certificate"), std::string::npos) << h.log();
    }
    {
        EngineHost h({"--ssl-cert-file", cert, "--ssl-key-file", other_key}, {}, false);
        EXPECT_NE(h.wait_exit(10000), 0);
        EXPECT_NE(h.log().find("does not match"), std::string::npos) << h.log();
    }
}
