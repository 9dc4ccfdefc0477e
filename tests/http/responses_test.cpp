// The OpenAI Responses API over real HTTP: stories260K through the CPU
// reference plugin (a real model and tokenizer), the test engine scripted to
// write tool calls and reasoning with Qwen2.5's and gpt-oss's real chat
// templates, and the official `openai` npm client.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "engine_host_process.hpp"
#include "model_fixtures.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

EngineHost& stories_host() {
    static EngineHost host({"--log-content"}, {}, true, EH_PLUGIN_DIR);
    return host;
}

json request(int max_output_tokens, bool stream = false) {
    return {{"model", "test-model"},
            {"instructions", "You tell short stories."},
            {"input", "Once upon a time"},
            {"max_output_tokens", max_output_tokens},
            {"temperature", 0},
            {"stream", stream}};
}

json with(json j, const json& extra) {
    for (auto& [k, v] : extra.items()) j[k] = v;
    return j;
}

HttpResponse send(EngineHost& h, const std::string& method, const std::string& path, const std::string& body = "",
                  const std::string& key = "") {
    std::map<std::string, std::string> headers;
    if (!key.empty()) headers["Authorization"] = "Bearer " + key;
    return http(h.port(), method, path, body, headers);
}

json post(EngineHost& h, const json& body, int want = 200, const std::string& key = "") {
    auto r = send(h, "POST", "/v1/responses", body.dump(), key);
    EXPECT_EQ(r.status, want) << r.body;
    return json::parse(r.body, nullptr, false);
}

// The prompt a job ran with (the host runs with --log-content).
std::string prompt_of(EngineHost& h, const std::string& job_id) {
    for (const auto& e : h.log_events())
        if (e.value("event", "") == "execute_start" && e.value("job_id", "") == job_id) return e.value("prompt", "");
    return "";
}

struct Event {
    std::string type;
    json data;
};
// A streamed response's events, each checked to carry its own name as
// "type" and the next sequence_number.
std::vector<Event> events_of(const HttpResponse& r) {
    std::vector<Event> out;
    for (const auto& e : parse_sse(r.body)) {
        json d = json::parse(e.data);
        EXPECT_EQ(d["type"], e.event) << e.data;
        EXPECT_EQ(d["sequence_number"], out.size()) << e.data;
        out.push_back({e.event, d});
    }
    return out;
}

std::string output_text(const json& response) {
    std::string out;
    for (const auto& item : response["output"])
        if (item["type"] == "message")
            for (const auto& part : item["content"]) out += part["text"].get<std::string>();
    return out;
}

}  // namespace

TEST(Responses, ResponseHasTheResponsesShape) {
    auto& h = stories_host();
    ASSERT_GT(h.port(), 0) << h.log();
    json r = post(h, request(12));
    const std::string id = r["id"];
    EXPECT_EQ(id.rfind("resp_", 0), 0u);
    EXPECT_EQ(r["object"], "response");
    EXPECT_EQ(r["model"], "test-model");
    EXPECT_EQ(r["status"], "incomplete");
    EXPECT_EQ(r["incomplete_details"], (json{{"reason", "max_output_tokens"}}));
    EXPECT_TRUE(r["error"].is_null());
    EXPECT_GT(r["created_at"].get<int64_t>(), 1700000000);
    ASSERT_EQ(r["output"].size(), 1u) << r.dump();
    const json& msg = r["output"][0];
    EXPECT_EQ(msg["type"], "message");
    EXPECT_EQ(msg["role"], "assistant");
    EXPECT_EQ(msg["status"], "incomplete");
    EXPECT_EQ(msg["id"].get<std::string>().rfind("msg_", 0), 0u);
    ASSERT_EQ(msg["content"].size(), 1u);
    EXPECT_EQ(msg["content"][0]["type"], "output_text");
    EXPECT_EQ(msg["content"][0]["annotations"], json::array());
    EXPECT_FALSE(output_text(r).empty());
    EXPECT_EQ(r["usage"]["output_tokens"], 12);
    EXPECT_GT(r["usage"]["input_tokens"].get<int>(), 5);
    EXPECT_EQ(r["usage"]["total_tokens"], r["usage"]["input_tokens"].get<int>() + 12);
    EXPECT_EQ(r["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
    EXPECT_TRUE(r["usage"]["input_tokens_details"].contains("cached_tokens"));
    // The request's settings, echoed.
    EXPECT_EQ(r["instructions"], "You tell short stories.");
    EXPECT_EQ(r["max_output_tokens"], 12);
    EXPECT_EQ(r["temperature"], 0);
    EXPECT_EQ(r["store"], true);
    EXPECT_TRUE(r["previous_response_id"].is_null());
    // The instructions and the input reach the template.
    const std::string prompt = prompt_of(h, id);
    EXPECT_NE(prompt.find("You tell short stories."), std::string::npos) << prompt;
    EXPECT_NE(prompt.find("Once upon a time"), std::string::npos) << prompt;

    // Stored: GET returns it as POST did; DELETE removes it.
    auto got = send(h, "GET", "/v1/responses/" + id);
    ASSERT_EQ(got.status, 200) << got.body;
    EXPECT_EQ(json::parse(got.body), r);
    auto replay = send(h, "GET", "/v1/responses/" + id + "?stream=true");
    EXPECT_EQ(replay.status, 400) << replay.body;
    EXPECT_EQ(json::parse(replay.body)["error"]["param"], "stream");
    auto del = send(h, "DELETE", "/v1/responses/" + id);
    ASSERT_EQ(del.status, 200) << del.body;
    EXPECT_EQ(json::parse(del.body), (json{{"id", id}, {"object", "response"}, {"deleted", true}}));
    auto gone = send(h, "GET", "/v1/responses/" + id);
    EXPECT_EQ(gone.status, 404) << gone.body;
    EXPECT_EQ(json::parse(gone.body)["error"]["code"], "NOT_FOUND");
    EXPECT_EQ(send(h, "DELETE", "/v1/responses/" + id).status, 404);
}

TEST(Responses, StreamedEventsInOrderAndSameAsNotStreamed) {
    auto& h = stories_host();
    json whole = post(h, request(16));
    auto r = send(h, "POST", "/v1/responses", request(16, true).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.header("content-type").find("text/event-stream"), std::string::npos);
    auto evs = events_of(r);
    ASSERT_GE(evs.size(), 9u) << r.body;
    const std::vector<std::string> head = {"response.created", "response.in_progress", "response.output_item.added",
                                           "response.content_part.added"};
    const std::vector<std::string> tail = {"response.output_text.done", "response.content_part.done",
                                           "response.output_item.done", "response.incomplete"};
    for (size_t i = 0; i < head.size(); ++i) EXPECT_EQ(evs[i].type, head[i]);
    for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(evs[evs.size() - tail.size() + i].type, tail[i]);
    const json& created = evs[0].data["response"];
    EXPECT_EQ(created["status"], "in_progress");
    EXPECT_EQ(created["output"], json::array());
    EXPECT_TRUE(created["usage"].is_null());
    const std::string item_id = evs[2].data["item"]["id"];
    std::string text;
    for (size_t i = head.size(); i + tail.size() < evs.size(); ++i) {
        ASSERT_EQ(evs[i].type, "response.output_text.delta");
        EXPECT_EQ(evs[i].data["item_id"], item_id);
        EXPECT_EQ(evs[i].data["output_index"], 0);
        EXPECT_EQ(evs[i].data["content_index"], 0);
        text += evs[i].data["delta"].get<std::string>();
    }
    EXPECT_EQ(text, output_text(whole));
    EXPECT_EQ(evs[evs.size() - 4].data["text"], text);
    const json& final = evs.back().data["response"];
    EXPECT_EQ(final["status"], "incomplete");
    EXPECT_EQ(output_text(final), text);
    EXPECT_EQ(final["usage"]["output_tokens"], 16);
    EXPECT_EQ(final["usage"]["input_tokens"], whole["usage"]["input_tokens"]);
    // The streamed response is stored as its final event shows it.
    auto got = send(h, "GET", "/v1/responses/" + final["id"].get<std::string>());
    ASSERT_EQ(got.status, 200);
    EXPECT_EQ(json::parse(got.body), final);
}

// text.format constrains the output as response_format does on the chat
// route (stories260K on the CPU reference engine: batched steps, so the
// token mask reaches its sampler).
TEST(Responses, TextFormatJsonSchemaConstrainsTheOutput) {
    auto& h = stories_host();
    const json schema = json::parse(R"({"type":"object","properties":{"animal":{"enum":["cat","dog","owl"]},)"
                                    R"("happy":{"type":"boolean"}},"required":["animal","happy"],"additionalProperties":false})");
    json r = post(h, with(request(300), {{"text", {{"format", {{"type", "json_schema"}, {"name", "pet"}, {"schema", schema},
                                                               {"strict", true}}}}}}));
    ASSERT_EQ(r["status"], "completed") << r.dump();
    const json v = json::parse(output_text(r), nullptr, false);
    ASSERT_TRUE(v.is_object()) << output_text(r);
    EXPECT_TRUE(v["animal"] == "cat" || v["animal"] == "dog" || v["animal"] == "owl") << v.dump();
    EXPECT_TRUE(v["happy"].is_boolean()) << v.dump();
    EXPECT_EQ(v.size(), 2u) << v.dump();
    EXPECT_EQ(r["text"]["format"]["name"], "pet");
    // A schema the compiler refuses is a 400 naming `text`.
    json bad = post(h, with(request(8), {{"text", {{"format", {{"type", "json_schema"}, {"name", "x"},
                                                                 {"schema", {{"type", 5}}}}}}}}),
                    400);
    EXPECT_EQ(bad["error"]["param"], "text") << bad.dump();
}

// previous_response_id: the earlier input and output come before the new
// input; its instructions do not (each request brings its own).
TEST(Responses, PreviousResponseIdContinuesTheConversation) {
    auto& h = stories_host();
    json first = post(h, request(8));
    json second = post(h, {{"previous_response_id", first["id"]}, {"input", "The end."}, {"max_output_tokens", 4}});
    EXPECT_EQ(second["previous_response_id"], first["id"]);
    const std::string prompt = prompt_of(h, second["id"]);
    const std::string earlier = output_text(first);
    const size_t a = prompt.find("Once upon a time"), b = prompt.find(earlier), c = prompt.find("The end.");
    EXPECT_NE(a, std::string::npos) << prompt;
    EXPECT_NE(b, std::string::npos) << prompt;
    EXPECT_NE(c, std::string::npos) << prompt;
    EXPECT_TRUE(a < b && b < c) << prompt;
    EXPECT_EQ(prompt.find("You tell short stories."), std::string::npos) << "instructions are not carried over: " << prompt;
    // A chain of three: the first turn is still there.
    json third = post(h, {{"previous_response_id", second["id"]}, {"input", "Again."}, {"max_output_tokens", 2}});
    EXPECT_NE(prompt_of(h, third["id"]).find("Once upon a time"), std::string::npos);

    // store: false keeps nothing to continue from or read.
    json unstored = post(h, with(request(4), {{"store", false}}));
    EXPECT_EQ(unstored["store"], false);
    EXPECT_EQ(send(h, "GET", "/v1/responses/" + unstored["id"].get<std::string>()).status, 404);
    json refused = post(h, {{"previous_response_id", unstored["id"]}, {"input", "x"}}, 400);
    EXPECT_EQ(refused["error"]["param"], "previous_response_id");
    EXPECT_NE(refused["error"]["message"].get<std::string>().find("not found"), std::string::npos);
    // An id that never existed reads the same.
    json never = post(h, {{"previous_response_id", "resp_0123"}, {"input", "x"}}, 400);
    EXPECT_EQ(never["error"]["param"], "previous_response_id");
}

// The store keeps --responses-max responses; the least recently used go.
TEST(Responses, EvictedResponsesAreNotFound) {
    EngineHost h({"--responses-max", "2"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    std::vector<std::string> ids;
    for (int i = 0; i < 3; ++i) ids.push_back(post(h, request(2))["id"]);
    EXPECT_EQ(send(h, "GET", "/v1/responses/" + ids[0]).status, 404);
    json refused = post(h, {{"previous_response_id", ids[0]}, {"input", "x"}, {"max_output_tokens", 2}}, 400);
    EXPECT_EQ(refused["error"]["param"], "previous_response_id");
    EXPECT_NE(refused["error"]["message"].get<std::string>().find("evicted (the server keeps the 2 most recently used"),
              std::string::npos)
        << refused.dump();
    EXPECT_EQ(send(h, "GET", "/v1/responses/" + ids[1]).status, 200);
    post(h, {{"previous_response_id", ids[2]}, {"input", "x"}, {"max_output_tokens", 2}});
    // Continuing from ids[2] made it the most recently used, and the new
    // response pushed out ids[1] (read before that, so now the oldest).
    EXPECT_EQ(send(h, "GET", "/v1/responses/" + ids[1]).status, 404);
    EXPECT_EQ(send(h, "GET", "/v1/responses/" + ids[2]).status, 200);
}

// With --served-model-name, `model` must name a served model, as on the
// chat routes.
TEST(Responses, UnservedModelIs404) {
    EngineHost h({"--served-model-name", "story"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    json e = post(h, {{"model", "other"}, {"input", "x"}, {"max_output_tokens", 2}}, 404);
    EXPECT_EQ(e["error"]["code"], "NOT_FOUND");
    json ok = post(h, {{"model", "story"}, {"input", "x"}, {"max_output_tokens", 2}});
    EXPECT_EQ(ok["model"], "story");
}

TEST(Responses, StoreLimitsOutOfRangeExit2) {
    for (const char* flag : {"--responses-max 1000001", "--responses-max-mb 0", "--responses-max-mb 65537"}) {
        SCOPED_TRACE(flag);
        auto [rc, out] = run_command(std::string(EH_ENGINE_HOST) + " serve --port 0 --model " + stories_model() + " " +
                                     flag + " 2>&1");
        EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
        EXPECT_NE(out.find("--responses-max must be between 0 and 1000000"), std::string::npos) << out;
    }
}

// One key's responses are invisible to another: not readable, not
// continuable, not deletable, and answered as ids that never existed.
TEST(Responses, StoredResponsesStayWithTheirKey) {
    EngineHost h({"--api-key", "key-one", "--api-key", "key-two"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    json mine = post(h, request(4), 200, "key-one");
    const std::string id = mine["id"];
    EXPECT_EQ(send(h, "GET", "/v1/responses/" + id, "", "key-two").status, 404);
    EXPECT_EQ(send(h, "DELETE", "/v1/responses/" + id, "", "key-two").status, 404);
    json theirs = post(h, {{"previous_response_id", id}, {"input", "x"}, {"max_output_tokens", 2}}, 400, "key-two");
    EXPECT_EQ(theirs["error"]["param"], "previous_response_id");
    EXPECT_EQ(send(h, "GET", "/v1/responses/" + id).status, 401) << "no key";
    EXPECT_EQ(send(h, "GET", "/v1/responses/" + id, "", "key-one").status, 200);
    post(h, {{"previous_response_id", id}, {"input", "x"}, {"max_output_tokens", 2}}, 200, "key-one");
    EXPECT_EQ(send(h, "DELETE", "/v1/responses/" + id, "", "key-one").status, 200);
}

TEST(Responses, BadInputIsA400NamingTheField) {
    auto& h = stories_host();
    struct Case {
        json body;
        const char* param;
        const char* says;
    };
    const std::vector<Case> cases = {
        {{{"model", "m"}}, "input", "'input' is required"},
        {with(request(4), {{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}}), "input",
         "\"input_image\" is not supported"},
        {with(request(4), {{"tools", {{{"type", "web_search_preview"}}}}}), "tools", "\"web_search_preview\" is not supported"},
        {with(request(4), {{"background", true}}), "background", "not supported"},
        {with(request(4), {{"max_output_tokens", 0}}), "max_output_tokens", "max_output_tokens"},
        {with(request(4), {{"tools", {{{"type", "function"}, {"name", "f"}}}}}), "tools", "no tool-call format"},
        {with(request(4), {{"input", {{{"type", "function_call_output"}, {"call_id", "c"}, {"output", "x"}}}}}), "input",
         "no tool-call format"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.body.dump());
        json e = post(h, c.body, 400);
        EXPECT_EQ(e["error"]["param"], c.param);
        EXPECT_EQ(e["error"]["type"], "invalid_request_error");
        EXPECT_NE(e["error"]["message"].get<std::string>().find(c.says), std::string::npos) << e.dump();
    }
    auto r = send(h, "POST", "/v1/responses", "{");
    EXPECT_EQ(r.status, 400) << r.body;
}

// A job that fails mid-stream ends the stream with response.failed.
TEST(Responses, MidStreamErrorIsResponseFailed) {
    EngineHost h({"--inference-timeout-sec", "1"}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    auto r = send(h, "POST", "/v1/responses", R"({"input":"x","max_output_tokens":2000,"stream":true})");
    auto evs = events_of(r);
    ASSERT_GE(evs.size(), 3u) << r.body;
    EXPECT_EQ(evs.back().type, "response.failed");
    const json& failed = evs.back().data["response"];
    EXPECT_EQ(failed["status"], "failed");
    EXPECT_EQ(failed["error"]["code"], "INFERENCE_TIMEOUT");
    // What was written before the failure is in its output.
    std::string streamed;
    for (const auto& e : evs)
        if (e.type == "response.output_text.delta") streamed += e.data["delta"].get<std::string>();
    EXPECT_FALSE(streamed.empty());
    ASSERT_EQ(failed["output"].size(), 1u) << failed.dump();
    EXPECT_EQ(failed["output"][0]["status"], "in_progress");
    EXPECT_EQ(output_text(failed), streamed);
    EXPECT_EQ(send(h, "GET", "/v1/responses/" + failed["id"].get<std::string>()).status, 404) << "a failed response is not kept";
}

// A model whose chat template was rejected at load: the chat routes' error,
// never a transcript the model was not trained on.
TEST(Responses, RejectedTemplateIsChatTemplateUnusable) {
    TemplatedModel m("{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}");
    EngineHost h({}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", m.path);
    ASSERT_GT(h.port(), 0) << h.log();
    for (bool stream : {false, true}) {
        json e = post(h, {{"input", "hi"}, {"max_output_tokens", 3}, {"stream", stream}}, 400);
        EXPECT_EQ(e["error"]["code"], "CHAT_TEMPLATE_UNUSABLE") << e.dump();
    }
}

TEST(Responses, LoadingIs503) {
    EngineHost h({}, {{"EH_TEST_ENGINE_LOAD_DELAY_MS", "3000"}}, false);
    ASSERT_GT(h.port(), 0) << h.log();
    auto r = send(h, "POST", "/v1/responses", R"({"input":"x"})");
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "MODEL_LOADING");
}

// Browser tools on localhost (--cors) may delete stored responses: the
// preflight allows DELETE.
TEST(Responses, CorsPreflightAllowsDelete) {
    EngineHost h({"--cors"}, {});
    ASSERT_GT(h.port(), 0) << h.log();
    auto r = http(h.port(), "OPTIONS", "/v1/responses/resp_1", "",
                  {{"Origin", "http://localhost:3000"}, {"Access-Control-Request-Method", "DELETE"}});
    EXPECT_EQ(r.status, 204) << r.body;
    EXPECT_NE(r.header("access-control-allow-methods").find("DELETE"), std::string::npos)
        << r.header("access-control-allow-methods");
}

// A streamed response whose job fails before it starts (still queued when
// the server shuts down) still opens with response.created, as clients
// (the SDK's ResponseStream) expect, then ends with response.failed.
TEST(Responses, FailureBeforeTheStartStillOpensTheStream) {
    EngineHost h({"--parallel", "1", "--shutdown-grace-ms", "300"}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    ASSERT_GT(h.port(), 0) << h.log();
    std::thread first([&] { send(h, "POST", "/v1/responses", R"({"input":"x","max_output_tokens":300})"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    HttpResponse queued;
    std::thread second([&] {
        queued = send(h, "POST", "/v1/responses", R"({"input":"y","max_output_tokens":5,"stream":true})");
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    h.stop();
    first.join();
    second.join();
    auto evs = events_of(queued);
    ASSERT_GE(evs.size(), 3u) << queued.body;
    EXPECT_EQ(evs[0].type, "response.created");
    EXPECT_EQ(evs[1].type, "response.in_progress");
    EXPECT_EQ(evs.back().type, "response.failed");
    EXPECT_EQ(evs.back().data["response"]["status"], "failed");
}

// ---- tools and reasoning (the test engine, scripted) --------------------------------

namespace {

std::string read_file(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
std::string qwen_template() {
    return json::parse(read_file(std::string(EH_TESTDATA_DIR) + "/tokenizers/qwen2.5/tokenizer_config.json"))["chat_template"];
}
std::string gptoss_template() { return read_file(std::string(EH_TESTDATA_DIR) + "/tokenizers/gpt-oss-20b/chat_template.jinja"); }

const json kTools = json::parse(R"([{"type":"function","name":"get_weather","description":"Weather now",)"
                                R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}])");

}  // namespace

// A call comes back as a function_call item (whole and streamed, its
// arguments as function_call_arguments deltas); its output sent back with
// previous_response_id renders exactly as the chat route renders the same
// history.
TEST(ResponsesTools, FunctionCallRoundTrip) {
    TemplatedModel model(qwen_template());
    ScriptedHost s(model.path,
                   "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                   {"--log-content"});
    ASSERT_TRUE(s->running()) << s->log();
    const json ask = {{"input", "Weather in Paris?"}, {"tools", kTools}, {"max_output_tokens", 200}};
    json r = post(*s, ask);
    EXPECT_EQ(r["status"], "completed");
    ASSERT_EQ(r["output"].size(), 2u) << r.dump();
    EXPECT_EQ(r["output"][0]["type"], "message");
    EXPECT_EQ(output_text(r), " Let me look.");
    const json call = r["output"][1];
    EXPECT_EQ(call["type"], "function_call");
    EXPECT_EQ(call["status"], "completed");
    EXPECT_EQ(call["name"], "get_weather");
    EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), (json{{"city", "Paris"}}));
    const std::string call_id = call["call_id"];
    EXPECT_EQ(call_id.rfind("call_", 0), 0u);
    EXPECT_EQ(r["tools"], kTools);

    // Streamed: the call's item, its arguments in pieces, then done.
    auto st = send(*s, "POST", "/v1/responses", with(ask, {{"stream", true}}).dump());
    auto evs = events_of(st);
    std::string args;
    size_t arg_deltas = 0;
    json done_call;
    for (const auto& e : evs) {
        if (e.type == "response.function_call_arguments.delta") {
            EXPECT_EQ(e.data["output_index"], 1);
            args += e.data["delta"].get<std::string>(), ++arg_deltas;
        }
        if (e.type == "response.function_call_arguments.done") EXPECT_EQ(e.data["arguments"], args);
        if (e.type == "response.output_item.done" && e.data["item"]["type"] == "function_call") done_call = e.data["item"];
    }
    EXPECT_GT(arg_deltas, 3u) << "arguments stream as the model writes them";
    EXPECT_EQ(done_call["arguments"], args);
    EXPECT_EQ(evs.back().type, "response.completed");

    // The call's output, continued from the stored response.
    json next = post(*s, {{"previous_response_id", r["id"]}, {"tools", kTools}, {"max_output_tokens", 200},
                          {"input", {{{"type", "function_call_output"}, {"call_id", call_id}, {"output", "sunny"}}}}});
    const std::string prompt = prompt_of(*s, next["id"]);
    // The same history sent to the chat route.
    // (Its tools in the order the Responses route hands them to the
    // template: type, then the function's name, description, parameters.)
    const nlohmann::ordered_json chat = {
        {"max_tokens", 200},
        {"tools", {{{"type", "function"},
                    {"function", {{"name", "get_weather"}, {"description", "Weather now"},
                                  {"parameters", nlohmann::ordered_json(kTools[0]["parameters"])}}}}}},
        {"messages",
         {{{"role", "user"}, {"content", "Weather in Paris?"}},
          {{"role", "assistant"},
           {"content", " Let me look."},
           {"tool_calls", {{{"id", call_id}, {"type", "function"},
                            {"function", {{"name", "get_weather"}, {"arguments", call["arguments"].get<std::string>()}}}}}}},
          {{"role", "tool"}, {"tool_call_id", call_id}, {"content", "sunny"}}}}};
    auto c = s->post("/v1/chat/completions", chat.dump());
    ASSERT_EQ(c.status, 200) << c.body;
    EXPECT_EQ(prompt, prompt_of(*s, json::parse(c.body)["id"]));
    EXPECT_NE(prompt.find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << prompt;

    // The same turn sent whole, as input items (what a client without the
    // store sends): the same prompt.
    json stateless = post(*s, {{"tools", kTools}, {"max_output_tokens", 200}, {"store", false},
                               {"input", {{{"role", "user"}, {"content", "Weather in Paris?"}}, r["output"][0], call,
                                          {{"type", "function_call_output"}, {"call_id", call_id}, {"output", "sunny"}}}}});
    EXPECT_EQ(prompt_of(*s, stateless["id"]), prompt);
}

// gpt-oss's analysis channel is a reasoning item (reasoning_text content,
// streamed as reasoning_text deltas) before the message; passed back as an
// input item it is the template's `thinking` of that turn.
TEST(ResponsesTools, HarmonyReasoningIsAReasoningItem) {
    TemplatedModel model(gptoss_template());
    ScriptedHost s(model.path,
                   "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                   "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
                   {"--log-content"});
    ASSERT_TRUE(s->running()) << s->log();
    const json ask = {{"input", "Weather in Paris?"}, {"tools", kTools}, {"max_output_tokens", 200},
                      {"reasoning", {{"effort", "low"}}}};
    json r = post(*s, ask);
    ASSERT_EQ(r["output"].size(), 2u) << r.dump();
    EXPECT_EQ(r["output"][0]["type"], "reasoning");
    EXPECT_EQ(r["output"][0]["content"], json::parse(R"([{"type":"reasoning_text","text":"Need the weather."}])"));
    EXPECT_EQ(r["output"][1]["type"], "function_call");
    EXPECT_EQ(r["output"][1]["arguments"], "{\"city\":\"Paris\"}");
    EXPECT_GT(r["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
    EXPECT_EQ(r["reasoning"]["effort"], "low");
    EXPECT_NE(prompt_of(*s, r["id"]).find("Reasoning: low"), std::string::npos);

    auto st = send(*s, "POST", "/v1/responses", with(ask, {{"stream", true}}).dump());
    std::string reasoning;
    std::vector<std::string> types;
    for (const auto& e : events_of(st)) {
        types.push_back(e.type);
        if (e.type == "response.reasoning_text.delta") reasoning += e.data["delta"].get<std::string>();
    }
    EXPECT_EQ(reasoning, "Need the weather.");
    ASSERT_GE(types.size(), 4u);
    EXPECT_EQ(types[2], "response.output_item.added");
    EXPECT_EQ(types[3], "response.content_part.added");

    // Passed back: the reasoning reaches the template with its call (gpt-oss
    // keeps the analysis of a turn that ends in a call).
    json next = post(*s, {{"tools", kTools}, {"max_output_tokens", 200},
                          {"input", {{{"role", "user"}, {"content", "Weather in Paris?"}}, r["output"][0], r["output"][1],
                                     {{"type", "function_call_output"}, {"call_id", r["output"][1]["call_id"]},
                                      {"output", "sunny"}}}}});
    const std::string prompt = prompt_of(*s, next["id"]);
    EXPECT_NE(prompt.find("Need the weather."), std::string::npos) << prompt;
}

// ---- the official client -------------------------------------------------------------

namespace {

// Why the npm client's scripts (tests/http/openai-client; `npm ci` there
// installs the client, as CI does) cannot run, "" when they can.
std::string node_client_missing() {
    const std::filesystem::path dir = std::filesystem::path(EH_HTTP_TEST_DIR) / "openai-client";
    if (!std::filesystem::exists(dir / "node_modules" / "openai"))
        return "openai npm package not installed: run `npm ci` in " + dir.string();
    if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not installed";
    return "";
}

// Runs `script` with `args`; it prints {"ok":true,...} when every check passed.
void expect_node_client_passes(const std::string& script, const std::string& args) {
    const std::filesystem::path dir = std::filesystem::path(EH_HTTP_TEST_DIR) / "openai-client";
    auto [rc, out] = run_command("node " + (dir / script).string() + " " + args + " 2>&1");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
}

}  // namespace

TEST(Responses, OfficialNodeClient) {
    if (auto why = node_client_missing(); !why.empty()) GTEST_SKIP() << why;
    EngineHost h({"--api-key", "sdk-key"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    expect_node_client_passes("responses.mjs", "http://127.0.0.1:" + std::to_string(h.port()) + " sdk-key");
}

TEST(ResponsesTools, OfficialNodeClient) {
    if (auto why = node_client_missing(); !why.empty()) GTEST_SKIP() << why;
    TemplatedModel model(qwen_template());
    ScriptedHost s(model.path,
                   "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    ASSERT_TRUE(s->running()) << s->log();
    expect_node_client_passes("responses_tools.mjs", "http://127.0.0.1:" + std::to_string(s->port()));
}
