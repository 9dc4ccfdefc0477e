// LoRA adapters through the whole product: engine-host serves stories260K
// with a forged adapter (--lora) on the CPU reference; a request picks it by
// `model: "<model>:<name>"` or by `lora`, /v1/models lists it, an unknown
// adapter is 404 ADAPTER_NOT_FOUND, a cached prefix is reused only by its own
// adapter, and adapters that cannot be served stop the start with their name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "../cpu_reference/lora_forge.hpp"
#include "engine_host_process.hpp"

using nlohmann::json;
using namespace eh::test;

namespace {

std::string write_temp(const std::vector<uint8_t>& bytes, const std::string& stem) {
    std::random_device rd;
    const auto p = std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(rd()) + ".gguf");
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return p.string();
}

struct TempFile {
    std::string path;
    ~TempFile() {
        std::error_code ec;
        std::filesystem::remove(path, ec);
    }
};

TempFile forged_adapter(uint32_t seed, std::vector<lora_forge::Target> targets = {}) {
    auto base = eh::model::ModelFile::open(stories_model());
    if (targets.empty())
        targets = {{"blk.0.attn_q.weight", 8}, {"blk.1.ffn_down.weight", 8}, {"blk.4.attn_v.weight", 8},
                   {"output.weight", 8}};
    return {write_temp(lora_forge::forge(*base, targets, 16.0f, seed, 0.5f).gguf(), "eh-lora")};
}

json completion(EngineHost& h, json body = json::object(), int want_status = 200) {
    // Longer than one KV block (16 tokens), the least the prefix cache reuses.
    body["prompt"] = "Once upon a time there was a little girl named Lily. She liked to play outside in the park "
                     "with her friends. One day she saw a big red ball under a tree and she";
    body["max_tokens"] = 12;
    body["temperature"] = 0;
    auto r = h.post("/v1/completions", body.dump());
    EXPECT_EQ(r.status, want_status) << r.body;
    return json::parse(r.body);
}

std::string text(const json& j) { return j["choices"][0]["text"]; }
int cached(const json& j) { return j["usage"]["prompt_tokens_details"]["cached_tokens"]; }

}  // namespace

TEST(LoraEndToEnd, ARequestPicksItsAdapterByModelOrLoraAndCachesStayApart) {
    TempFile a = forged_adapter(1), b = forged_adapter(2);
    EngineHost h({"--log-format", "text", "--lora", "tales=" + a.path, "--lora", "other=" + b.path, "--lora-scale",
                  "other=0.5"},
                 {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();

    json models = json::parse(h.get("/v1/models").body);
    std::vector<std::string> ids;
    for (const auto& m : models["data"]) ids.push_back(m["id"]);
    EXPECT_NE(std::find(ids.begin(), ids.end(), "stories260K:tales"), ids.end()) << models.dump();
    EXPECT_NE(std::find(ids.begin(), ids.end(), "stories260K:other"), ids.end()) << models.dump();
    for (const auto& m : models["data"])
        if (m["id"] == "stories260K:tales") {
            EXPECT_EQ(m["lora"], "tales");
            EXPECT_EQ(m["parent"], "stories260K");
        }

    EXPECT_EQ(json::parse(h.get("/health").body)["lora_adapters"], json::array({"tales", "other"}));
    // The model-server protocol's adapter gauge: both adapters loaded, none waited for.
    const std::string metrics = h.get("/metrics").body;
    EXPECT_NE(metrics.find("vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"tales,other\","
                           "waiting_lora_adapters=\"\"}"),
              std::string::npos)
        << metrics;

    // The base model first (nothing cached), then the adapter on the same
    // prompt: it must not reuse the base model's cached prefix.
    const json base1 = completion(h, {{"model", "stories260K"}});
    const json tales1 = completion(h, {{"model", "stories260K:tales"}});
    EXPECT_EQ(cached(tales1), 0) << "the adapter reused the base model's KV";
    EXPECT_NE(text(tales1), text(base1)) << "the adapter changed nothing";
    EXPECT_EQ(tales1["model"], "stories260K:tales");
    const json other1 = completion(h, {{"lora", "other"}});
    EXPECT_EQ(cached(other1), 0) << "one adapter reused another's KV";
    EXPECT_NE(text(other1), text(tales1));

    // Each again: its own prefix is reused and the text is the same.
    const json tales2 = completion(h, {{"lora", "tales"}});
    EXPECT_GT(cached(tales2), 0);
    EXPECT_EQ(text(tales2), text(tales1));
    const json base2 = completion(h);
    EXPECT_GT(cached(base2), 0);
    EXPECT_EQ(text(base2), text(base1));

    // Chat, Anthropic's Messages, the Responses API and /execute choose it the same way.
    auto chat = h.post("/v1/chat/completions",
                       json{{"model", "stories260K:tales"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                            {"max_tokens", 4}, {"temperature", 0}}.dump());
    EXPECT_EQ(chat.status, 200) << chat.body;
    auto msg = h.post("/v1/messages", json{{"model", "stories260K:tales"}, {"max_tokens", 4},
                                           {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}.dump());
    EXPECT_EQ(msg.status, 200) << msg.body;
    msg = h.post("/v1/messages", json{{"model", "stories260K:nope"}, {"max_tokens", 4},
                                      {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}.dump());
    EXPECT_EQ(msg.status, 404) << msg.body;
    auto resp = h.post("/v1/responses", json{{"model", "stories260K:nope"}, {"input", "Hi"}, {"max_output_tokens", 4}}.dump());
    EXPECT_EQ(resp.status, 404) << resp.body;
    resp = h.post("/v1/responses", json{{"model", "stories260K:tales"}, {"input", "Hi"}, {"max_output_tokens", 4}}.dump());
    EXPECT_EQ(resp.status, 200) << resp.body;
    auto ex = h.post("/execute", json{{"job_id", "x1"}, {"prompt", "Once"}, {"lora", "nope"}, {"max_tokens", 2}}.dump());
    EXPECT_EQ(ex.status, 404) << ex.body;

    // Unknown adapters, by either field; a contradiction between the two.
    json e = completion(h, {{"model", "stories260K:nope"}}, 404);
    EXPECT_EQ(e["error"]["code"], "ADAPTER_NOT_FOUND") << e.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find("'nope'"), std::string::npos) << e.dump();
    e = completion(h, {{"lora", "nope"}}, 404);
    EXPECT_EQ(e["error"]["code"], "ADAPTER_NOT_FOUND") << e.dump();
    e = completion(h, {{"model", "stories260K:tales"}, {"lora", "other"}}, 400);
    EXPECT_EQ(e["error"]["param"], "lora") << e.dump();
}

// --engine-process: the engine process loads the adapters beside its model
// (their flags travel on its command line) and sets them over the wire; the
// texts are the in-process server's.
// `loadgen --model A,B,C`: client c sends the (c mod 3)-th name, so the
// third client's requests (an adapter the server lacks) fail alone (exit 1,
// as for any failed request); a list with an empty name is a usage error.
TEST(LoraEndToEnd, LoadgenSpreadsItsClientsOverTheModelList) {
    TempFile a = forged_adapter(4);
    EngineHost h({"--log-format", "text", "--lora", "tales=" + a.path}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    const std::string cli = std::string(EH_ENGINE_HOST) + " loadgen --url http://127.0.0.1:" + std::to_string(h.port());
    const auto [status, out] =
        run_command(cli + " --model stories260K,stories260K:tales,stories260K:nope --levels 3 -n 3 --json 2>&1");
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;  // (some requests failed)
    const json j = json::parse(out);
    ASSERT_EQ(j["levels"].size(), 1u) << out;
    EXPECT_EQ(j["levels"][0]["requests"], 6) << out;
    EXPECT_EQ(j["levels"][0]["failed"], 2) << out;
    EXPECT_EQ(j["levels"][0]["completion_tokens"], 12) << out;
    EXPECT_NE(j["levels"][0]["first_error"].get<std::string>().find("nope"), std::string::npos) << out;
    for (const char* bad : {" --model a,,b", " --model a,", " --model ,a"}) {
        const auto [st, o] = run_command(cli + bad + " 2>&1");
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << bad << ": " << o;
    }
}

TEST(LoraEndToEnd, TheEngineProcessServesTheSameAdapters) {
    TempFile a = forged_adapter(1);
    std::vector<std::string> args = {"--log-format", "text", "--lora", "tales=" + a.path, "--lora-scale", "tales=0.75"};
    std::string in_process[2];
    {
        EngineHost h(args, {}, true, EH_PLUGIN_DIR);
        ASSERT_GT(h.port(), 0) << h.log();
        in_process[0] = text(completion(h, {{"lora", "tales"}}));
        in_process[1] = text(completion(h));
    }
    args.push_back("--engine-process");
    EngineHost h(args, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    EXPECT_EQ(text(completion(h, {{"model", "stories260K:tales"}})), in_process[0]);
    EXPECT_EQ(text(completion(h)), in_process[1]);
    EXPECT_NE(in_process[0], in_process[1]);
    const json again = completion(h, {{"lora", "tales"}});
    EXPECT_GT(cached(again), 0);  // its own prefix, from the engine process's cache
    EXPECT_EQ(text(again), in_process[0]);
    EXPECT_EQ(completion(h, {{"lora", "nope"}}, 404)["error"]["code"], "ADAPTER_NOT_FOUND");
}

TEST(LoraEndToEnd, WithoutAdaptersALoraFieldIsNotFound) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    json e = completion(h, {{"lora", "tales"}}, 404);
    EXPECT_EQ(e["error"]["code"], "ADAPTER_NOT_FOUND") << e.dump();
    // A `model` with a colon is a model name as before (any name is accepted here).
    completion(h, {{"model", "stories260K:tales"}}, 200);
    EXPECT_EQ(h.get("/metrics").body.find("vllm:lora_requests_info"), std::string::npos);  // no LoRA, no gauge
}

TEST(LoraEndToEnd, AnAdapterThatDoesNotFitStopsTheStartByName) {
    TempFile embd = forged_adapter(3, {{"token_embd.weight", 4}});
    EngineHost h({"--log-format", "text", "--lora", "emb=" + embd.path}, {}, false, EH_PLUGIN_DIR);
    EXPECT_NE(h.wait_exit(), 0);
    EXPECT_NE(h.log().find("LoRA adapter 'emb'"), std::string::npos) << h.log();
    EXPECT_NE(h.log().find("token_embd.weight"), std::string::npos) << h.log();

    EngineHost bad({"--log-format", "text", "--lora", "x y=/nonexistent"}, {}, false, EH_PLUGIN_DIR);
    EXPECT_EQ(bad.wait_exit(), 2);
    EXPECT_NE(bad.log().find("an adapter name is 1-64 letters"), std::string::npos) << bad.log();

    // A plugin without ABI 1.6's adapter calls (the test engine) is refused by name.
    TempFile ok = forged_adapter(4);
    EngineHost plain({"--log-format", "text", "--lora", "ok=" + ok.path}, {}, false);
    EXPECT_NE(plain.wait_exit(), 0);
    EXPECT_NE(plain.log().find("does not serve LoRA adapters"), std::string::npos) << plain.log();

    // What --lora cannot go with, as usage errors.
    for (std::vector<std::string> extra : {std::vector<std::string>{"--kv-events-endpoint", "tcp://127.0.0.1:1"},
                                           std::vector<std::string>{"--lora-scale", "ok=1e9"},
                                           std::vector<std::string>{"--lora-scale", "nope=1"}}) {
        std::vector<std::string> args = {"--log-format", "text", "--lora", "ok=" + ok.path};
        args.insert(args.end(), extra.begin(), extra.end());
        EngineHost h2(args, {}, false, EH_PLUGIN_DIR);
        EXPECT_EQ(h2.wait_exit(), 2) << extra[0] << "\n" << h2.log();
        EXPECT_NE(h2.log().find("--lora"), std::string::npos) << h2.log();
    }
}
