// Structured output end to end: engine-host serves stories260K and a
// random-weight llama through the CPU reference plugin (batched steps, so
// the allowed-token mask reaches its sampler), and whatever the model
// "wants", the output parses and validates against the schema — greedy and
// sampled, several seeds. A request cut by max_tokens is still a valid
// prefix (checked with a byte-level matcher of the same schema).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "eh/constrain/automaton.hpp"
#include "eh/constrain/grammar.hpp"
#include "engine_host_process.hpp"

using nlohmann::json;
using namespace eh::test;

namespace {

// Values that end: enums, booleans, integers, bounded arrays; strings only
// from enums, so a random model reaches the end within max_tokens.
const char* kSchema = R"({
  "type": "object",
  "properties": {
    "animal": {"enum": ["cat", "dog", "owl"]},
    "legs": {"type": "integer"},
    "happy": {"type": "boolean"},
    "friends": {"type": "array", "items": {"$ref": "#/$defs/friend"}, "maxItems": 2},
    "note": {"anyOf": [{"type": "null"}, {"const": "none"}]}
  },
  "required": ["animal", "legs", "happy", "friends", "note"],
  "additionalProperties": false,
  "$defs": {"friend": {"type": "object", "properties": {"name": {"enum": ["Tom", "Ann"]}, "age": {"type": ["integer", "null"]}},
                       "required": ["name"], "additionalProperties": false}}
})";

// The schema subset's rules, checked on a parsed value (independent of the
// grammar compiler).
bool validates(const json& v, const json& s, const json& root) {
    if (s.contains("$ref")) {
        const std::string ref = s["$ref"];
        return validates(v, root["$defs"][ref.substr(std::string("#/$defs/").size())], root);
    }
    if (s.contains("enum")) {
        for (const auto& e : s["enum"])
            if (e == v) return true;
        return false;
    }
    if (s.contains("const")) return s["const"] == v;
    if (s.contains("anyOf")) {
        for (const auto& a : s["anyOf"])
            if (validates(v, a, root)) return true;
        return false;
    }
    if (!s.contains("type")) return true;
    std::vector<std::string> types;
    if (s["type"].is_string()) types.push_back(s["type"]);
    else for (const auto& t : s["type"]) types.push_back(t);
    for (const auto& t : types) {
        if (t == "null" && v.is_null()) return true;
        if (t == "boolean" && v.is_boolean()) return true;
        if (t == "integer" && v.is_number_integer()) return true;
        if (t == "number" && v.is_number()) return true;
        if (t == "string" && v.is_string()) return true;
        if (t == "array" && v.is_array()) {
            if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
            for (const auto& x : v)
                if (s.contains("items") && !validates(x, s["items"], root)) return false;
            return true;
        }
        if (t == "object" && v.is_object()) {
            for (const auto& r : s.value("required", json::array()))
                if (!v.contains(r.get<std::string>())) return false;
            for (const auto& [k, x] : v.items()) {
                if (!s["properties"].contains(k)) return false;
                if (!validates(x, s["properties"][k], root)) return false;
            }
            return true;
        }
    }
    return false;
}

bool valid_prefix(const std::string& schema, const std::string& text) {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
    auto vocab = std::make_shared<const eh::constrain::TokenVocab>(std::move(bytes), std::vector<int32_t>{});
    eh::constrain::Matcher m(std::make_shared<eh::constrain::Automaton>(eh::constrain::json_schema_grammar(schema), vocab));
    return m.accept_bytes(text);
}

void run_schema_requests(EngineHost& h) {
    const json schema = json::parse(kSchema);
    int finished = 0, total = 0;
    for (double temperature : {0.0, 1.0}) {
        for (int seed = 1; seed <= (temperature == 0 ? 1 : 4); ++seed) {
            json body = {{"messages", {{{"role", "user"}, {"content", "Describe an animal as JSON."}}}},
                         {"max_tokens", 300}, {"temperature", temperature}, {"seed", seed},
                         {"response_format", {{"type", "json_schema"},
                                              {"json_schema", {{"name", "animal"}, {"strict", true}, {"schema", schema}}}}}};
            auto r = h.post("/v1/chat/completions", body.dump());
            ASSERT_EQ(r.status, 200) << r.body;
            json j = json::parse(r.body);
            const std::string content = j["choices"][0]["message"]["content"];
            const std::string finish = j["choices"][0]["finish_reason"];
            ++total;
            // (json sorts the schema's keys: properties come in that order)
            EXPECT_TRUE(valid_prefix(schema.dump(), content)) << content;
            if (finish == "length") {
                ADD_FAILURE() << "t=" << temperature << " seed=" << seed << " ran to max_tokens: " << content;
                continue;
            }
            ++finished;
            EXPECT_EQ(finish, "stop");
            ASSERT_TRUE(json::accept(content)) << "t=" << temperature << " seed=" << seed << ": " << content;
            EXPECT_TRUE(validates(json::parse(content), schema, schema)) << content;
        }
    }
    EXPECT_EQ(finished, total);
}

}  // namespace

TEST(StructuredOutput, SchemaOutputValidatesOnStories260K) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    run_schema_requests(h);
}

TEST(StructuredOutput, SchemaOutputValidatesOnARandomModel) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR,
                 std::string(EH_TESTDATA_DIR) + "/models/llama-2-tiny-random.gguf");
    ASSERT_GT(h.port(), 0) << h.log();
    run_schema_requests(h);
}

// n choices of one constrained prompt: each sibling walks the grammar with
// its own matcher.
TEST(StructuredOutput, EveryChoiceOfNMatches) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    const json schema = json::parse(kSchema);
    auto r = h.post("/v1/chat/completions",
                    json{{"messages", {{{"role", "user"}, {"content", "Animals?"}}}}, {"max_tokens", 300},
                         {"temperature", 1.0}, {"seed", 5}, {"n", 3},
                         {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}}}}}}
                        .dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body);
    ASSERT_EQ(j["choices"].size(), 3u);
    for (const auto& c : j["choices"]) {
        const std::string content = c["message"]["content"];
        ASSERT_TRUE(json::accept(content)) << content;
        EXPECT_TRUE(validates(json::parse(content), schema, schema)) << content;
        EXPECT_EQ(c["finish_reason"], "stop");
    }
}

TEST(StructuredOutput, JsonObjectModeGivesAnObject) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    for (int seed = 1; seed <= 3; ++seed) {
        auto r = h.post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 1.0},
                                                {"seed", seed}, {"response_format", {{"type", "json_object"}}}}.dump());
        ASSERT_EQ(r.status, 200) << r.body;
        json j = json::parse(r.body);
        const std::string text = j["choices"][0]["text"];
        if (j["choices"][0]["finish_reason"] == "stop") {
            ASSERT_TRUE(json::accept(text)) << text;
            EXPECT_TRUE(json::parse(text).is_object()) << text;
        } else {
            // Cut by max_tokens: still the start of an object.
            EXPECT_EQ(text.find_first_not_of(" \t\n"), text.find('{')) << text;
        }
    }
}

TEST(StructuredOutput, NativeGrammarEndsWhenComplete) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    const std::string grammar = "root ::= (\"yes\" | \"no\") \", \" [0-9] [0-9]? \" owls\"\n";
    for (double t : {0.0, 1.0}) {
        json body = {{"job_id", "g" + std::to_string(int(t))}, {"prompt", "Once upon a time"}, {"max_tokens", 50},
                     {"temperature", t}, {"seed", 3}, {"grammar", grammar}};
        auto r = h.post("/execute", body.dump());
        ASSERT_EQ(r.status, 200) << r.body;
        std::string text, reason;
        for (const auto& ev : parse_sse(r.body)) {
            json d = json::parse(ev.data);
            if (ev.event == "token") text += d["t"].get<std::string>();
            if (ev.event == "end") reason = d["stop_reason"];
            if (ev.event == "error") ADD_FAILURE() << ev.data;
        }
        EXPECT_EQ(reason, "grammar") << text;
        const bool yes = text.rfind("yes, ", 0) == 0, no = text.rfind("no, ", 0) == 0;
        ASSERT_TRUE(yes || no) << text;
        const std::string num = text.substr(yes ? 5 : 4, text.size() - (yes ? 5 : 4) - 5);
        EXPECT_TRUE(!num.empty() && num.size() <= 2 && num.find_first_not_of("0123456789") == std::string::npos) << text;
        EXPECT_EQ(text.substr(text.size() - 5), " owls") << text;
    }
    // The native json_schema field works the same way.
    auto s = h.post("/execute", json{{"job_id", "s"}, {"prompt", "Once"}, {"max_tokens", 40}, {"temperature", 0},
                                     {"json_schema", {{"enum", {"up", "down"}}}}}.dump());
    ASSERT_EQ(s.status, 200) << s.body;
    std::string text;
    for (const auto& ev : parse_sse(s.body))
        if (ev.event == "token") text += json::parse(ev.data)["t"].get<std::string>();
    const std::string value = text.substr(std::min(text.size(), text.find_first_not_of(" \t\n")));
    EXPECT_TRUE(value == "\"up\"" || value == "\"down\"") << text;
}

// vLLM's request fields constrain the same way: a regex and a list of
// choices on both OpenAI endpoints, greedy and sampled, end by themselves
// with a complete match.
TEST(StructuredOutput, VllmGuidedFieldsConstrainTheOutput) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    auto text_of = [](const json& j, bool chat) {
        return chat ? j["choices"][0]["message"]["content"].get<std::string>() : j["choices"][0]["text"].get<std::string>();
    };
    for (bool chat : {false, true}) {
        for (double t : {0.0, 1.0}) {
            json base = {{"max_tokens", 40}, {"temperature", t}, {"seed", 5}};
            if (chat) base["messages"] = json::array({{{"role", "user"}, {"content", "Once upon a time"}}});
            else base["prompt"] = "Once upon a time";
            json rx = base;
            rx["guided_regex"] = "(yes|no), [0-9]{1,2} owls";
            auto r = h.post(chat ? "/v1/chat/completions" : "/v1/completions", rx.dump());
            ASSERT_EQ(r.status, 200) << r.body;
            json j = json::parse(r.body);
            const std::string text = text_of(j, chat);
            EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << text;
            EXPECT_TRUE((text.rfind("yes, ", 0) == 0 || text.rfind("no, ", 0) == 0) && text.size() >= 10 &&
                        text.substr(text.size() - 5) == " owls") << text;
            json ch = base;
            ch["structured_outputs"] = {{"choice", {"red fox", "blue whale", "green frog"}}};
            r = h.post(chat ? "/v1/chat/completions" : "/v1/completions", ch.dump());
            ASSERT_EQ(r.status, 200) << r.body;
            const std::string pick = text_of(json::parse(r.body), chat);
            EXPECT_TRUE(pick == "red fox" || pick == "blue whale" || pick == "green frog") << pick;
        }
    }
    auto two = h.post("/v1/completions", json{{"prompt", "x"}, {"guided_choice", {"a"}},
                                              {"response_format", {{"type", "json_object"}}}}.dump());
    EXPECT_EQ(two.status, 400) << two.body;
    EXPECT_NE(two.body.find("at most one output constraint"), std::string::npos) << two.body;
}

TEST(StructuredOutput, RefusalsNameTheKeywordOrField) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    auto schema_req = [&](const json& schema) {
        return h.post("/v1/chat/completions",
                      json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
                           {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", schema}}}}}}
                          .dump());
    };
    // Keywords the grammar cannot enforce, and enforced ones with a malformed value.
    const std::vector<std::pair<std::string, json>> refused = {
        {"unevaluatedItems", {{"type", "array"}, {"contains", {{"type", "integer"}}}, {"unevaluatedItems", false}}},
        {"not", {{"type", "string"}, {"not", {{"pattern", "^a"}}}}},  // no negation of a pattern
        {"uniqueItems", {{"type", "array"}, {"items", {{"type", "object"}}}, {"uniqueItems", true}, {"minItems", 2}}},
        {"maxContains", {{"type", "array"}, {"contains", {{"type", "integer"}}}, {"maxContains", 2}}},
        {"pattern", {{"type", "string"}, {"pattern", 1}}},
        {"minimum", {{"type", "integer"}, {"minimum", "one"}}},
    };
    for (const auto& [kw, a] : refused) {
        auto r = schema_req(json{{"type", "object"}, {"properties", {{"a", a}}}});
        EXPECT_EQ(r.status, 400) << kw << ": " << r.body;
        EXPECT_NE(r.body.find("'" + kw + "'"), std::string::npos) << r.body;
        EXPECT_NE(r.body.find("/properties/a"), std::string::npos) << r.body;
    }
    auto bad_type = h.post("/v1/completions", json{{"prompt", "x"}, {"response_format", {{"type", "yaml"}}}}.dump());
    EXPECT_EQ(bad_type.status, 400) << bad_type.body;
    EXPECT_NE(bad_type.body.find("response_format"), std::string::npos);
    auto no_schema = h.post("/v1/completions", json{{"prompt", "x"}, {"response_format", {{"type", "json_schema"}}}}.dump());
    EXPECT_EQ(no_schema.status, 400) << no_schema.body;
    auto bad_grammar = h.post("/execute", json{{"job_id", "b"}, {"prompt", "x"}, {"grammar", "root ::= undefined-rule\n"}}.dump());
    EXPECT_EQ(bad_grammar.status, 400) << bad_grammar.body;
    EXPECT_NE(bad_grammar.body.find("undefined-rule"), std::string::npos) << bad_grammar.body;
    auto both = h.post("/execute", json{{"job_id", "c"}, {"prompt", "x"}, {"grammar", "root ::= \"a\"\n"},
                                        {"json_schema", json::object()}}.dump());
    EXPECT_EQ(both.status, 400) << both.body;
}

// The test engine is a 1.0 plugin: no batched step, so no place for the
// mask. A constrained request is refused, naming its field, never run
// unconstrained.
TEST(StructuredOutput, AnEngineWithoutBatchedStepsRefusesConstraints) {
    EngineHost h;
    ASSERT_GT(h.port(), 0) << h.log();
    auto r = h.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                                 {"response_format", {{"type", "json_object"}}}}.dump());
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("'response_format' is not available"), std::string::npos) << r.body;
    EXPECT_NE(r.body.find("runs no batched steps"), std::string::npos) << r.body;
    auto g = h.post("/execute", json{{"job_id", "g"}, {"prompt", "x"}, {"grammar", "root ::= \"a\"\n"}}.dump());
    EXPECT_EQ(g.status, 400) << g.body;
    EXPECT_NE(g.body.find("'grammar' is not available"), std::string::npos) << g.body;
    // Plain text is still fine.
    auto t = h.post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}, {"response_format", {{"type", "text"}}}}.dump());
    EXPECT_EQ(t.status, 200) << t.body;
}

// The official openai npm client (tests/http/openai-client/structured.mjs):
// json_schema, streamed, json_object, and the 400 for a keyword it cannot enforce.
TEST(StructuredOutput, OfficialNodeClient) {
    std::filesystem::path dir = std::filesystem::path(EH_HTTP_TEST_DIR) / "openai-client";
    if (!std::filesystem::exists(dir / "node_modules" / "openai"))
        GTEST_SKIP() << "openai npm package not installed: run `npm ci` in " << dir.string();
    if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    const std::string cmd = "node " + (dir / "structured.mjs").string() + " http://127.0.0.1:" + std::to_string(h.port()) + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << out;
    EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
}
