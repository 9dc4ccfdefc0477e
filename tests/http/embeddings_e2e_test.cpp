// /v1/embeddings and /v1/rerank through the whole server: engine-host serves
// the tiny random llama with the CPU reference in --embedding or --rerank
// mode, and every answer is checked against the plugin's own forward pass
// run here in the test (the last token's final hidden state; for rerank the
// LM head's "yes" and "no" logits), through the official openai client too.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <cstring>
#include <filesystem>

#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tools/vocab.hpp"
#include "eh/service/pooling.hpp"
#include "eh/service/seq_engine.hpp"
#include "engine_host_process.hpp"

using nlohmann::json;
using namespace eh::test;

namespace {

std::string tiny_llama() { return std::string(EH_TESTDATA_DIR) + "/models/llama-2-tiny-random.gguf"; }

EngineHost serve(std::vector<std::string> args) {
    args.insert(args.begin(), {"--log-format", "text"});
    return EngineHost(args, {}, true, EH_PLUGIN_DIR, tiny_llama());
}

// The CPU reference plugin in this process: the forward pass the server's
// answers must equal.
class CpuForward {
public:
    CpuForward() {
        auto rec = eh::loader::load_plugin(std::string(EH_PLUGIN_DIR) + "/cpu-reference.manifest.json");
        if (!rec.accepted) throw std::runtime_error("cpu-reference rejected");
        std::shared_ptr<eh::model::ModelFile> file = eh::model::ModelFile::open(tiny_llama());
        model_ = eh::EngineModel::load(rec.api, tiny_llama(), &file->view(), file, {});
        eh::service::KvBudget b;
        b.max_seqs = 2;
        b.max_step_tokens = 1024;
        b.max_seq_tokens = 1024;
        engine_ = eh::service::make_seq_engine(model_, b);
    }
    // Its last token's final hidden state, or (logits) its raw logits.
    std::vector<float> run(const std::vector<int32_t>& tokens, bool logits = false) {
        const eh::service::SeqId s = engine_->create();
        std::vector<eh::service::StepItem> items(1);
        items[0].seq = s;
        items[0].tokens = tokens;
        items[0].hidden = !logits;
        items[0].logits = logits;
        EXPECT_TRUE(engine_->step(items));
        auto out = logits ? engine_->logits(s) : engine_->hidden(s);
        std::vector<float> v(out.begin(), out.end());
        engine_->release(s);
        return v;
    }

private:
    std::shared_ptr<eh::EngineModel> model_;
    std::unique_ptr<eh::service::SeqEngine> engine_;
};

// The tiny llama again at `path`, with `keys` added and `extra` tensors
// (F32, {n_embd, rows}) beside its own: a GGUF as llama.cpp's converter
// writes an embedding model or a reranker.
void write_variant(const std::string& path, const std::vector<std::pair<std::string, eh::model::GgufValue>>& keys,
                   const std::vector<std::pair<std::string, std::vector<float>>>& extra = {}) {
    auto mf = eh::model::ModelFile::open(tiny_llama());
    eh::model::GgufWriter w;
    for (const auto& kv : mf->metadata()) {
        const std::string key(eh::model::to_sv(kv.key));
        if (key != "general.alignment") w.set(key, eh::tools::to_gguf_value(kv.value));
    }
    for (const auto& [k, v] : keys) w.set(k, v);
    for (const auto& t : mf->tensors())
        w.add_tensor(std::string(eh::model::to_sv(t.name)), t.type, std::vector<uint64_t>(t.dims, t.dims + t.n_dims),
                     t.data);
    for (const auto& [name, v] : extra) w.add_tensor(name, EH_TYPE_F32, {8, v.size() / 8}, v.data());
    w.write(path);
}

std::vector<int32_t> tokenize(EngineHost& h, const std::string& text, bool add_special, bool parse_special = false) {
    auto r = h.post("/tokenize", json{{"text", text}, {"add_special", add_special}, {"parse_special", parse_special}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["tokens"].get<std::vector<int32_t>>();
}

json post_json(EngineHost& h, const std::string& path, const json& body, int want_status = 200) {
    auto r = h.post(path, body.dump());
    EXPECT_EQ(r.status, want_status) << r.body;
    return json::parse(r.body);
}

std::vector<float> vec(const json& item) { return item["embedding"].get<std::vector<float>>(); }

// eh_engine_steps_total from /metrics.
double engine_steps(EngineHost& h) {
    const std::string m = h.get("/metrics").body;
    const std::string name = "\neh_engine_steps_total ";
    const size_t at = m.find(name);
    EXPECT_NE(at, std::string::npos) << m;
    return at == std::string::npos ? 0 : std::atof(m.c_str() + at + name.size());
}

std::string message(const json& err) { return err["error"]["message"].get<std::string>(); }

}  // namespace

TEST(Embeddings, LastTokenStateOfTheCpuForwardL2Normalised) {
    EngineHost h = serve({"--embedding"});
    ASSERT_GT(h.port(), 0) << h.log();
    CpuForward cpu;
    const std::vector<std::vector<int32_t>> inputs = {{1, 450, 4996, 17354}, {1, 263}, {1, 29871, 13, 100, 200, 300}};
    json body = post_json(h, "/v1/embeddings", {{"input", inputs}, {"encoding_format", "float"}});
    ASSERT_EQ(body["data"].size(), inputs.size()) << body.dump();
    EXPECT_EQ(body["object"], "list");
    EXPECT_EQ(body["model"], "llama-2-tiny-random");
    EXPECT_EQ(body["usage"]["prompt_tokens"], 12);
    EXPECT_EQ(body["usage"]["total_tokens"], 12);
    for (size_t i = 0; i < inputs.size(); ++i) {
        const json& item = body["data"][i];
        EXPECT_EQ(item["object"], "embedding");
        EXPECT_EQ(item["index"], i);
        const std::vector<float> raw = cpu.run(inputs[i]);
        ASSERT_EQ(raw.size(), 8u);  // the tiny llama's n_embd
        EXPECT_EQ(vec(item), eh::service::l2_normalized(raw)) << "input " << i;
        double norm = 0;
        for (float x : vec(item)) norm += double(x) * x;
        EXPECT_NEAR(norm, 1.0, 1e-6);
        double raw_norm = 0;
        for (float x : raw) raw_norm += double(x) * x;
        EXPECT_GT(std::abs(raw_norm - 1.0), 1e-3) << "the raw state is not unit length: normalisation did something";
    }
}

TEST(Embeddings, ManyInputsInOneRequestEqualEachAlone) {
    EngineHost h = serve({"--embedding"});
    ASSERT_GT(h.port(), 0) << h.log();
    std::vector<std::string> texts;
    for (int i = 0; i < 24; ++i) texts.push_back("input number " + std::to_string(i) + std::string(size_t(i % 5), '!'));
    const double steps_before = engine_steps(h);
    json all = post_json(h, "/v1/embeddings", {{"input", texts}});
    ASSERT_EQ(all["data"].size(), texts.size());
    // They ran batched: a few steps for all 24 (one each would be 24).
    const double steps = engine_steps(h) - steps_before;
    EXPECT_GE(steps, 1.0);
    EXPECT_LE(steps, 4.0);
    for (size_t i = 0; i < texts.size(); ++i) {
        json one = post_json(h, "/v1/embeddings", {{"input", texts[i]}});
        EXPECT_EQ(vec(one["data"][0]), vec(all["data"][i])) << "input " << i;
    }
    // Text is tokenized as /tokenize does (BOS, no control tokens), so its
    // ids give the same vector.
    json by_ids = post_json(h, "/v1/embeddings", {{"input", tokenize(h, texts[3], true)}});
    EXPECT_EQ(vec(by_ids["data"][0]), vec(all["data"][3]));
}

TEST(Embeddings, Base64IsTheLittleEndianFloats) {
    EngineHost h = serve({"--embedding"});
    ASSERT_GT(h.port(), 0) << h.log();
    json f = post_json(h, "/v1/embeddings", {{"input", "the cat"}, {"encoding_format", "float"}});
    json b = post_json(h, "/v1/embeddings", {{"input", "the cat"}, {"encoding_format", "base64"}});
    const std::vector<float> v = vec(f["data"][0]);
    EXPECT_EQ(b["data"][0]["embedding"].get<std::string>(), eh::service::base64_floats(v));
    // base64 of 8 floats = 32 bytes = 44 characters; the first 4 bytes are v[0].
    EXPECT_EQ(b["data"][0]["embedding"].get<std::string>().size(), 44u);
    EXPECT_EQ(eh::service::base64_floats(std::vector<float>{1.0f}), "AACAPw==");
}

TEST(Embeddings, EachModeRefusesTheOthersRoutes) {
    EngineHost e = serve({"--embedding"});
    ASSERT_GT(e.port(), 0) << e.log();
    EXPECT_EQ(message(post_json(e, "/v1/completions", {{"prompt", "hi"}}, 400)),
              "this server serves embeddings (started with --embedding): it generates no text; use /v1/embeddings");
    EXPECT_EQ(message(post_json(e, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}, 400)),
              "this server serves embeddings (started with --embedding): it generates no text; use /v1/embeddings");
    EXPECT_EQ(message(post_json(e, "/v1/rerank", {{"query", "q"}, {"documents", {"d"}}}, 400)),
              "/v1/rerank is not served: this server runs in embedding mode (/v1/embeddings)");

    EngineHost t = serve({});
    ASSERT_GT(t.port(), 0) << t.log();
    EXPECT_EQ(message(post_json(t, "/v1/embeddings", {{"input", "x"}}, 400)),
              "/v1/embeddings is not served: this server generates text; start it with --embedding and an embedding model");
    EXPECT_EQ(message(post_json(t, "/rerank", {{"query", "q"}, {"documents", {"d"}}}, 400)),
              "/v1/rerank is not served: this server generates text; start it with --rerank and a reranker model");
}

TEST(Embeddings, LimitsAnswer400WithTheirNumbers) {
    EngineHost h = serve({"--embedding", "--ctx-size", "32"});
    ASSERT_GT(h.port(), 0) << h.log();
    json many = json::array();
    for (int i = 0; i < 2049; ++i) many.push_back("x");
    json r = post_json(h, "/v1/embeddings", {{"input", many}}, 400);
    EXPECT_EQ(message(r), "'input' holds more than 2048 inputs; the limit is 2048 per request");
    EXPECT_EQ(r["error"]["param"], "input");
    std::vector<int32_t> long_ids(33, 100);
    EXPECT_EQ(message(post_json(h, "/v1/embeddings", {{"input", {std::vector<int32_t>{1, 2}, long_ids}}}, 400)),
              "'input[1]' is 33 tokens; the context holds 32 (start the server with a larger --ctx-size)");
    EXPECT_EQ(message(post_json(h, "/v1/embeddings", {{"input", std::vector<int32_t>{1, 32000}}}, 400)),
              "'input[0]' holds token id 32000, outside the vocabulary (0..31999)");
    EXPECT_EQ(message(post_json(h, "/v1/embeddings", {{"input", "hi"}, {"dimensions", 4}}, 400)),
              "'dimensions' 4 is not supported: this model's embeddings have 8 dimensions (omit the field, or send 8)");
    post_json(h, "/v1/embeddings", {{"input", "hi"}, {"dimensions", 8}}, 200);
    // A context's worth fits.
    post_json(h, "/v1/embeddings", {{"input", std::vector<int32_t>(32, 100)}}, 200);
}

TEST(Embeddings, StartingWithoutHiddenStatesFailsNamingThePlugin) {
    // The deterministic test engine (ABI 1.5 table, seq_hidden NULL).
    EngineHost h({"--log-format", "text", "--embedding"}, {}, false);
    EXPECT_EQ(h.wait_exit(), 4) << h.log();
    EXPECT_NE(h.log().find("plugin test-engine cannot serve embeddings (--embedding): it hands out no final hidden "
                           "states (ABI 1.5 seq_hidden)"),
              std::string::npos)
        << h.log();
    // The engine wire carries no hidden states: an engine process cannot serve them.
    EngineHost child({"--log-format", "text", "--rerank", "--engine-process"}, {}, false, EH_PLUGIN_DIR, tiny_llama());
    EXPECT_EQ(child.wait_exit(), 4) << child.log();
    EXPECT_NE(child.log().find("plugin cpu-reference cannot serve rerank scores (--rerank): the engine process does not "
                               "carry hidden states (serve it without --engine-process)"),
              std::string::npos)
        << child.log();
    EngineHost both({"--log-format", "text", "--embedding", "--rerank"}, {}, false);
    EXPECT_EQ(both.wait_exit(), 2);
    EXPECT_NE(both.log().find("--embedding and --rerank are two modes: pass one"), std::string::npos) << both.log();
}

TEST(Rerank, ScoresAreTheYesNoSoftmaxOfTheForwardAndSorted) {
    EngineHost h = serve({"--rerank"});
    ASSERT_GT(h.port(), 0) << h.log();
    CpuForward cpu;
    const std::string query = "where do cats sleep";
    const std::vector<std::string> docs = {"cats sleep in boxes", "the bond market fell", "a cat naps on the sofa",
                                           "rain", "kittens"};
    const auto yes = tokenize(h, "yes", false), no = tokenize(h, "no", false);
    ASSERT_EQ(yes.size(), 1u);
    ASSERT_EQ(no.size(), 1u);
    // What the server must compute: Qwen3-Reranker's prompt, then
    // P(yes) = softmax over the "yes" and "no" logits at its last position.
    std::vector<double> want;
    for (const auto& d : docs) {
        std::vector<eh::service::TextSpan> literal;
        const std::string prompt = eh::service::render_rerank(eh::service::kQwen3RerankTemplate, query, d, literal);
        const auto lg = cpu.run(tokenize(h, prompt, false, true), true);
        const double a = lg[size_t(yes[0])], b = lg[size_t(no[0])];
        want.push_back(std::exp(a) / (std::exp(a) + std::exp(b)));
    }
    json r = post_json(h, "/v1/rerank", {{"model", "llama-2-tiny-random"}, {"query", query}, {"documents", docs},
                                         {"return_documents", true}});
    ASSERT_EQ(r["results"].size(), docs.size()) << r.dump();
    EXPECT_EQ(r["model"], "llama-2-tiny-random");
    EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), 0);
    double prev = 2;
    std::set<size_t> seen;
    for (const auto& item : r["results"]) {
        const size_t i = item["index"];
        seen.insert(i);
        EXPECT_NEAR(item["relevance_score"].get<double>(), want[i], 1e-5) << "document " << i;
        EXPECT_LE(item["relevance_score"].get<double>(), prev) << "results are sorted, highest first";
        prev = item["relevance_score"];
        EXPECT_EQ(item["document"]["text"], docs[i]);
    }
    EXPECT_EQ(seen.size(), docs.size());
    // top_n keeps the best; /rerank is the same route; documents as objects.
    json top = post_json(h, "/rerank", {{"query", query}, {"top_n", 2},
                                        {"documents", {{{"text", docs[0]}}, {{"text", docs[1]}}, {{"text", docs[2]}}}}});
    ASSERT_EQ(top["results"].size(), 2u);
    EXPECT_FALSE(top["results"][0].contains("document"));
    const size_t best = std::max_element(want.begin(), want.begin() + 3) - want.begin();
    EXPECT_EQ(top["results"][0]["index"], best);
    // A query that holds control-token text is the user's text, never a control token.
    json odd = post_json(h, "/v1/rerank", {{"query", "<|im_end|>"}, {"documents", {"x"}}});
    EXPECT_EQ(odd["results"].size(), 1u);
}

TEST(Embeddings, OfficialNodeClientEmbeddingsCreate) {
    std::filesystem::path dir = std::filesystem::path(EH_HTTP_TEST_DIR) / "openai-client";
    if (!std::filesystem::exists(dir / "node_modules" / "openai"))
        GTEST_SKIP() << "openai npm package not installed: run `npm ci` in " << dir.string();
    if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
    EngineHost h = serve({"--embedding"});
    ASSERT_GT(h.port(), 0) << h.log();
    auto [rc, out] = run_command("node " + (dir / "embeddings.mjs").string() + " http://127.0.0.1:" +
                                 std::to_string(h.port()) + " 2>&1");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
}

// The mode comes from the GGUF's <arch>.pooling_type when no flag names it.
TEST(PoolingType, LastServesEmbeddingsMeanAndClsAreRefused) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("eh-pooling-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    using eh::model::GgufValue;
    write_variant((dir / "last.gguf").string(), {{"llama.pooling_type", GgufValue::u32(3)}});
    write_variant((dir / "mean.gguf").string(), {{"llama.pooling_type", GgufValue::u32(1)}});
    write_variant((dir / "cls.gguf").string(), {{"llama.pooling_type", GgufValue::u32(2)}});
    std::vector<float> want;
    {
        EngineHost flagged = serve({"--embedding"});
        want = vec(post_json(flagged, "/v1/embeddings", {{"input", "the same weights"}})["data"][0]);
    }
    {
        EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR, (dir / "last.gguf").string());
        ASSERT_GT(h.port(), 0) << h.log();
        EXPECT_EQ(vec(post_json(h, "/v1/embeddings", {{"input", "the same weights"}})["data"][0]), want);
        EXPECT_EQ(post_json(h, "/v1/completions", {{"prompt", "hi"}}, 400)["error"]["code"], "INVALID_REQUEST");
        // --rerank on an embedding model is refused by name.
        EngineHost r({"--log-format", "text", "--rerank"}, {}, false, EH_PLUGIN_DIR, (dir / "last.gguf").string());
        EXPECT_EQ(r.wait_exit(), 4);
        EXPECT_NE(r.log().find("the model is an embedding model (llama.pooling_type = 3, last): serve it with --embedding"),
                  std::string::npos)
            << r.log();
    }
    for (const char* kind : {"mean", "cls"}) {
        EngineHost h({"--log-format", "text"}, {}, false, EH_PLUGIN_DIR, (dir / (std::string(kind) + ".gguf")).string());
        EXPECT_EQ(h.wait_exit(), 4) << h.log();
        EXPECT_NE(h.log().find(std::string("the model's pooling type is ") + kind + " (llama.pooling_type = " +
                               (kind == std::string("mean") ? "1" : "2") +
                               "): only last-token pooling is served (a step hands out the last position's hidden "
                               "state, ABI 1.5)"),
                  std::string::npos)
            << h.log();
    }
    fs::remove_all(dir);
}

// A reranker as llama.cpp's converter writes it: pooling_type 4, the yes/no
// rows as cls.output.weight with their labels, its prompt in
// tokenizer.chat_template.rerank. The score is sigmoid((yes - no) . h).
TEST(PoolingType, RankScoresWithClsOutputWeightAndTheGgufsPrompt) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("eh-rank-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    using eh::model::GgufValue;
    // Labels in the other order than the converter's: the host reads them.
    // "yes" = 2 x unit vector 0, "no" = unit vector 1: score = sigmoid(2 h0 - h1).
    std::vector<float> rows(16, 0.0f);
    rows[8 + 0] = 2.0f;  // row 1: yes
    rows[0 + 1] = 1.0f;  // row 0: no
    write_variant((dir / "rank.gguf").string(),
                  {{"llama.pooling_type", GgufValue::u32(4)},
                   {"llama.classifier.output_labels", GgufValue::string_array({"no", "yes"})},
                   {"tokenizer.chat_template.rerank", GgufValue::string("query: {query} document: {document}")}},
                  {{"cls.output.weight", rows}});
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR, (dir / "rank.gguf").string());
    ASSERT_GT(h.port(), 0) << h.log();
    EXPECT_NE(h.log().find("rerank_head=cls.output.weight"), std::string::npos) << h.log();
    CpuForward cpu;
    const std::vector<std::string> docs = {"one", "two words", "three little words"};
    json r = post_json(h, "/v1/rerank", {{"query", "q"}, {"documents", docs}});
    ASSERT_EQ(r["results"].size(), 3u) << r.dump();
    for (const auto& item : r["results"]) {
        const size_t i = item["index"];
        const auto hs = cpu.run(tokenize(h, "query: q document: " + docs[i], false, true));
        const double want = 1.0 / (1.0 + std::exp(-(2.0 * hs[0] - hs[1])));
        EXPECT_NEAR(item["relevance_score"].get<double>(), want, 1e-6) << "document " << i;
    }
    EngineHost e({"--log-format", "text", "--embedding"}, {}, false, EH_PLUGIN_DIR, (dir / "rank.gguf").string());
    EXPECT_EQ(e.wait_exit(), 4);
    EXPECT_NE(e.log().find("the model is a reranker (llama.pooling_type = 4, rank): serve it with --rerank"),
              std::string::npos)
        << e.log();
    fs::remove_all(dir);
}
