// Malformed and hostile requests against a running engine-host: each gets
// the right status and a JSON error envelope, and the server stays healthy.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine_host_process.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

struct Case {
    std::string name;
    std::string raw;       // the whole request, bytes as sent
    int status;            // expected status; 0 = any 4xx
    std::string code;      // expected error code ("" = not checked)
};

std::string post(const std::string& path, const std::string& body, const std::string& ctype = "application/json") {
    return build_request("POST", path, body, {{"Content-Type", ctype}});
}

std::string exec(const std::string& fields) { return post("/execute", "{" + fields + "}"); }

std::vector<Case> cases() {
    const std::string ok = R"("job_id":"h","prompt":"x")";
    std::vector<Case> c = {
        {"empty body", post("/execute", ""), 400, "INVALID_REQUEST"},
        {"whitespace body", post("/execute", "  \n "), 400, "INVALID_REQUEST"},
        {"not json", post("/execute", "hello"), 400, "INVALID_REQUEST"},
        {"truncated object", post("/execute", R"({"job_id":"h","prompt":)"), 400, "INVALID_REQUEST"},
        {"trailing garbage", post("/execute", R"({"job_id":"h","prompt":"x"} xyz)"), 400, "INVALID_REQUEST"},
        {"array body", post("/execute", "[]"), 400, "INVALID_REQUEST"},
        {"string body", post("/execute", "\"x\""), 400, "INVALID_REQUEST"},
        {"number body", post("/execute", "42"), 400, "INVALID_REQUEST"},
        {"null body", post("/execute", "null"), 400, "INVALID_REQUEST"},
        {"single quotes", post("/execute", "{'job_id':'h'}"), 400, "INVALID_REQUEST"},
        {"trailing comma", post("/execute", R"({"job_id":"h","prompt":"x",})"), 400, "INVALID_REQUEST"},
        {"comment", post("/execute", R"({/*c*/"job_id":"h","prompt":"x"})"), 400, "INVALID_REQUEST"},
        {"NaN literal", exec(ok + R"(,"temperature":NaN)"), 400, "INVALID_REQUEST"},
        {"Infinity literal", exec(ok + R"(,"temperature":Infinity)"), 400, "INVALID_REQUEST"},
        {"huge exponent", exec(ok + R"(,"temperature":1e999)"), 400, "INVALID_REQUEST"},
        {"deep nesting", post("/execute", std::string(5000, '[') + std::string(5000, ']')), 400, "INVALID_REQUEST"},
        {"deep nested field", exec(ok + ",\"x\":" + std::string(3000, '[') + std::string(3000, ']')), 400, "INVALID_REQUEST"},
        {"raw NUL byte in string", post("/execute", std::string("{\"job_id\":\"h\",\"prompt\":\"a\0b\"}", 29)), 400, "INVALID_REQUEST"},
        {"escaped NUL in prompt", exec(R"("job_id":"h","prompt":"a\u0000b")"), 400, "INVALID_REQUEST"},
        {"NUL in job_id", exec(R"("job_id":"a\u0000","prompt":"x")"), 400, "INVALID_REQUEST"},
        {"invalid UTF-8 in prompt", post("/execute", "{\"job_id\":\"h\",\"prompt\":\"\xff\xfe\"}"), 400, "INVALID_REQUEST"},
        {"overlong UTF-8", post("/execute", "{\"job_id\":\"h\",\"prompt\":\"\xc0\xaf\"}"), 400, "INVALID_REQUEST"},
        {"UTF-8 surrogate", post("/execute", "{\"job_id\":\"h\",\"prompt\":\"\xed\xa0\x80\"}"), 400, "INVALID_REQUEST"},
        {"truncated UTF-8", post("/execute", "{\"job_id\":\"h\",\"prompt\":\"\xe2\x82\"}"), 400, "INVALID_REQUEST"},
        {"lone surrogate escape", exec(R"("job_id":"h","prompt":"\ud800")"), 400, "INVALID_REQUEST"},
        {"bad escape", exec(R"("job_id":"h","prompt":"\q")"), 400, "INVALID_REQUEST"},
        {"control char in string", post("/execute", "{\"job_id\":\"h\",\"prompt\":\"a\x01\"}"), 400, "INVALID_REQUEST"},
        {"missing job_id", exec(R"("prompt":"x")"), 400, "INVALID_REQUEST"},
        {"missing prompt", exec(R"("job_id":"h")"), 400, "INVALID_REQUEST"},
        {"empty prompt", exec(R"("job_id":"h","prompt":"")"), 400, "INVALID_REQUEST"},
        {"empty job_id", exec(R"("job_id":"","prompt":"x")"), 400, "INVALID_REQUEST"},
        {"huge job_id", exec("\"job_id\":\"" + std::string(1000, 'j') + "\",\"prompt\":\"x\""), 400, "INVALID_REQUEST"},
        {"prompt over 32768 chars", exec("\"job_id\":\"h\",\"prompt\":\"" + std::string(32769, 'a') + "\""), 400, "INVALID_REQUEST"},
        {"prompt is number", exec(R"("job_id":"h","prompt":5)"), 400, "INVALID_REQUEST"},
        {"prompt is array", exec(R"("job_id":"h","prompt":["x"])"), 400, "INVALID_REQUEST"},
        {"prompt is object", exec(R"("job_id":"h","prompt":{})"), 400, "INVALID_REQUEST"},
        {"job_id is bool", exec(R"("job_id":true,"prompt":"x")"), 400, "INVALID_REQUEST"},
        {"max_tokens negative", exec(ok + R"(,"max_tokens":-5)"), 400, "INVALID_REQUEST"},
        {"max_tokens zero", exec(ok + R"(,"max_tokens":0)"), 400, "INVALID_REQUEST"},
        {"max_tokens huge", exec(ok + R"(,"max_tokens":99999999999999999999)"), 400, "INVALID_REQUEST"},
        {"max_tokens float", exec(ok + R"(,"max_tokens":2.5)"), 400, "INVALID_REQUEST"},
        {"max_tokens string", exec(ok + R"(,"max_tokens":"10")"), 400, "INVALID_REQUEST"},
        {"temperature string", exec(ok + R"(,"temperature":"hot")"), 400, "INVALID_REQUEST"},
        {"temperature too high", exec(ok + R"(,"temperature":3)"), 400, "INVALID_REQUEST"},
        {"top_p negative", exec(ok + R"(,"top_p":-1)"), 400, "INVALID_REQUEST"},
        {"top_k float", exec(ok + R"(,"top_k":1.5)"), 400, "INVALID_REQUEST"},
        {"min_p over 1", exec(ok + R"(,"min_p":1.01)"), 400, "INVALID_REQUEST"},
        {"repetition_penalty 5", exec(ok + R"(,"repetition_penalty":5)"), 400, "INVALID_REQUEST"},
        {"stop five strings", exec(ok + R"(,"stop":["a","b","c","d","e"])"), 400, "INVALID_REQUEST"},
        {"stop number", exec(ok + R"(,"stop":7)"), 400, "INVALID_REQUEST"},
        {"stop nested array", exec(ok + R"(,"stop":[["a"]])"), 400, "INVALID_REQUEST"},
        {"stop empty string", exec(ok + R"(,"stop":"")"), 400, "INVALID_REQUEST"},
        {"seed negative", exec(ok + R"(,"seed":-1)"), 400, "INVALID_REQUEST"},
        {"seed too big", exec(ok + R"(,"seed":18446744073709551616)"), 400, "INVALID_REQUEST"},
        {"seed string", exec(ok + R"(,"seed":"1")"), 400, "INVALID_REQUEST"},
        {"unknown field", exec(ok + R"(,"temprature":1)"), 400, "INVALID_REQUEST"},
        {"duplicate key", exec(ok + R"(,"prompt":"y")"), 400, "INVALID_REQUEST"},
        {"body just over the limit", post("/execute", "{\"job_id\":\"h\",\"prompt\":\"" + std::string((1 << 20) + 10, 'a') + "\"}"), 413, "INVALID_REQUEST"},
        {"cancel without job_id", post("/cancel", "{}"), 400, "INVALID_REQUEST"},
        {"cancel bad json", post("/cancel", "{"), 400, "INVALID_REQUEST"},
        {"cancel job_id number", post("/cancel", R"({"job_id":1})"), 400, "INVALID_REQUEST"},
        {"tokenize missing text", post("/tokenize", "{}"), 400, "INVALID_REQUEST"},
        {"detokenize negative id", post("/detokenize", R"({"tokens":[-1]})"), 400, "INVALID_REQUEST"},
        {"detokenize string ids", post("/detokenize", R"({"tokens":["a"]})"), 400, "INVALID_REQUEST"},
        {"detokenize not array", post("/detokenize", R"({"tokens":5})"), 400, "INVALID_REQUEST"},
        {"chat no messages", post("/v1/chat/completions", R"({"model":"m"})"), 400, "INVALID_REQUEST"},
        {"chat bad role", post("/v1/chat/completions", R"({"messages":[{"role":"robot","content":"x"}]})"), 400, "INVALID_REQUEST"},
        {"chat content number", post("/v1/chat/completions", R"({"messages":[{"role":"user","content":5}]})"), 400, "INVALID_REQUEST"},
        {"chat image part", post("/v1/chat/completions", R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})"), 400, "INVALID_REQUEST"},
        {"chat n=17", post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":17})"), 400, "INVALID_REQUEST"},
        {"chat stream not bool", post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})"), 400, "INVALID_REQUEST"},
        {"completions no prompt", post("/v1/completions", R"({"model":"m"})"), 400, "INVALID_REQUEST"},
        {"completions prompt batch", post("/v1/completions", R"({"prompt":["a","b"]})"), 400, "INVALID_REQUEST"},
        {"completions max_tokens 0", post("/v1/completions", R"({"prompt":"a","max_tokens":0})"), 400, "INVALID_REQUEST"},
        {"unknown route", build_request("GET", "/nope", ""), 404, "NOT_FOUND"},
        {"GET on POST route", build_request("GET", "/execute", ""), 404, "NOT_FOUND"},
        {"path traversal", build_request("GET", "/../../etc/passwd", ""), 0, ""},
        {"form content type", post("/execute", "job_id=h&prompt=x", "application/x-www-form-urlencoded"), 400, "INVALID_REQUEST"},
        {"TLS hello on plain HTTP", std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 15), 0, ""},
        {"bad content-length", "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\nConnection: close\r\n\r\n{}", 0, ""},
    };
    return c;
}

}  // namespace

TEST(Hostile, EveryMalformedRequestIsAnsweredAndTheServerStaysHealthy) {
    EngineHost h;
    auto all = cases();
    ASSERT_GE(all.size(), 50u);
    for (const auto& c : all) {
        SCOPED_TRACE(c.name);
        HttpResponse r;
        ASSERT_NO_THROW(r = http_raw(h.port(), c.raw));
        if (c.status == 0) {
            EXPECT_TRUE(r.status == 0 || (r.status >= 400 && r.status < 500)) << r.status;
        } else {
            EXPECT_EQ(r.status, c.status) << r.body.substr(0, 300);
        }
        if (!c.code.empty()) {
            json j = json::parse(r.body, nullptr, false);
            ASSERT_FALSE(j.is_discarded()) << r.body.substr(0, 300);
            EXPECT_EQ(j["error"]["code"], c.code) << r.body.substr(0, 300);
            EXPECT_TRUE(j["error"]["message"].is_string());
            EXPECT_TRUE(j["error"]["correlation_id"].is_string());
        }
        ASSERT_TRUE(h.running()) << "server died on: " << c.name;
    }
    EXPECT_EQ(h.get("/health").status, 200);
    auto ok = h.post("/execute", R"({"job_id":"after","prompt":"still fine","max_tokens":3})");
    EXPECT_EQ(ok.status, 200);
    EXPECT_EQ(parse_sse(ok.body).back().event, "end");
}

TEST(Hostile, SlowAndAbandonedConnectionsDoNotBlockOthers) {
    EngineHost h;
    // Half a request, then silence; and a connection that sends nothing.
    int a = connect_local(h.port());
    send_all(a, "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"job");
    int b = connect_local(h.port());
    EXPECT_EQ(h.get("/health").status, 200);
    ::close(a);
    ::close(b);
    EXPECT_EQ(h.get("/health").status, 200);
}
