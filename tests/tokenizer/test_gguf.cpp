// GGUF vocab files through the project's GGUF reader: llama.cpp's vocab
// GGUFs and their expected ids, and a Qwen2 vocab GGUF the test writes from
// tokenizer.json (ggml-vocab-qwen2.gguf itself is not in the test data).
#include <gtest/gtest.h>
#include <simdjson.h>

#include "eh/error.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

namespace eh::tokenizer {
namespace {

using test::testdata;

using test::expect_vectors;
using test::ids_str;

std::unique_ptr<model::ModelFile> open_vocab(const std::string& name) {
    return model::ModelFile::open((testdata() / "vocab" / ("ggml-vocab-" + name + ".gguf")).string());
}

TEST(GgufConformance, Gpt2) {
    auto file = open_vocab("gpt-2");
    auto tok = Tokenizer::from_view(file->view());
    EXPECT_EQ(tok->kind(), "gguf-bpe");
    EXPECT_EQ(tok->vocab_size(), 50257u);
    EXPECT_EQ(tok->special().eos, 50256);
    EXPECT_FALSE(tok->add_bos());
    expect_vectors(*tok, "gpt-2", /*check_decode=*/true);
}

TEST(GgufConformance, LlamaSpm) {
    auto file = open_vocab("llama-spm");
    auto tok = Tokenizer::from_view(file->view());
    EXPECT_EQ(tok->kind(), "gguf-spm");
    EXPECT_EQ(tok->special().bos, 1);
    EXPECT_EQ(tok->special().eos, 2);
    EXPECT_TRUE(tok->add_bos());
    expect_vectors(*tok, "llama-spm", /*check_decode=*/true);
    // add_special puts BOS first.
    const auto ids = tok->encode("Hello", true, false);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
}

TEST(GgufConformance, Phi3) {
    auto file = open_vocab("phi-3");
    auto tok = Tokenizer::from_view(file->view());
    EXPECT_EQ(tok->kind(), "gguf-spm");
    EXPECT_EQ(tok->vocab_size(), 32064u);
    EXPECT_EQ(tok->special().eos, 32000);
    EXPECT_EQ(tok->special().eot, 32007);  // <|end|>
    EXPECT_TRUE(tok->is_eog(32007));
    EXPECT_FALSE(tok->chat_template().empty());
    expect_vectors(*tok, "phi-3", /*check_decode=*/true);
}

// ggml-vocab-llama-bpe.gguf is not in the test data (only its .inp/.out), so
// there is no llama-bpe conformance test; its split pattern is checked
// against Python's `regex` in the unit tests (data/split_vectors.json).

// tokenizer.json -> a GGUF vocab as llama.cpp's converter lays it out.
std::vector<uint8_t> gguf_from_tokenizer_json(const std::string& dir, const std::string& arch, const std::string& pre,
                                              uint32_t eos, uint32_t pad) {
    simdjson::padded_string json = simdjson::padded_string::load(
        (testdata() / "tokenizers" / dir / "tokenizer.json").string());
    simdjson::dom::parser parser;
    simdjson::dom::element root = parser.parse(json);
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    auto put = [&](int64_t id, std::string_view text, int32_t type) {
        if (size_t(id) >= tokens.size()) {
            tokens.resize(id + 1);
            types.resize(id + 1, 5);
        }
        tokens[id] = std::string(text);
        types[id] = type;
    };
    for (auto [k, v] : simdjson::dom::object(root["model"]["vocab"])) put(int64_t(v), k, 1);
    for (simdjson::dom::element a : simdjson::dom::array(root["added_tokens"]))
        put(int64_t(a["id"]), std::string_view(a["content"]), bool(a["special"]) ? 3 : 4);
    std::vector<std::string> merges;
    for (simdjson::dom::element m : simdjson::dom::array(root["model"]["merges"])) {
        if (m.is_string()) {
            merges.emplace_back(std::string_view(m));
        } else {  // ["a", "b"]
            simdjson::dom::array pair = m;
            merges.push_back(std::string(std::string_view(pair.at(0))) + " " + std::string(std::string_view(pair.at(1))));
        }
    }

    model::GgufWriter w;
    w.set("general.architecture", model::GgufValue::string(arch));
    w.set("tokenizer.ggml.model", model::GgufValue::string("gpt2"));
    w.set("tokenizer.ggml.pre", model::GgufValue::string(pre));
    w.set("tokenizer.ggml.tokens", model::GgufValue::string_array(tokens));
    w.set("tokenizer.ggml.token_type", model::GgufValue::array(std::span<const int32_t>(types)));
    w.set("tokenizer.ggml.merges", model::GgufValue::string_array(merges));
    w.set("tokenizer.ggml.eos_token_id", model::GgufValue::u32(eos));
    w.set("tokenizer.ggml.padding_token_id", model::GgufValue::u32(pad));
    w.set("tokenizer.ggml.add_bos_token", model::GgufValue::boolean(false));
    return w.to_bytes();
}

TEST(GgufConformance, Qwen2WrittenFromTokenizerJson) {
    const auto bytes = gguf_from_tokenizer_json("qwen2.5", "qwen2", "qwen2", 151645, 151643);
    auto file = model::ModelFile::open_gguf_buffer(bytes.data(), bytes.size(), "qwen2-vocab");
    auto tok = Tokenizer::from_view(file->view());
    EXPECT_EQ(tok->kind(), "gguf-bpe");
    EXPECT_EQ(tok->vocab_size(), 151665u);
    EXPECT_EQ(tok->special().eot, 151645);
    EXPECT_TRUE(tok->is_eog(151645));
    EXPECT_FALSE(tok->add_bos());
    expect_vectors(*tok, "qwen2", /*check_decode=*/true);
    // Special-token parsing on and off.
    EXPECT_EQ(tok->encode("<|im_start|>user", false, true), (std::vector<int32_t>{151644, 872}));
    EXPECT_NE(tok->encode("<|im_start|>user", false, false)[0], 151644);
}

// gpt-oss's o200k vocabulary as a GGUF (pre "gpt-4o") encodes the
// multilingual corpus exactly as its tokenizer.json does.
TEST(GgufConformance, GptOssGgufMatchesTokenizerJson) {
    const auto bytes = gguf_from_tokenizer_json("gpt-oss-20b", "gpt-oss", "gpt-4o", 200002, 199999);
    auto file = model::ModelFile::open_gguf_buffer(bytes.data(), bytes.size(), "gpt-oss-vocab");
    auto gguf = Tokenizer::from_view(file->view());
    auto json = Tokenizer::from_hf_json(testdata() / "tokenizers/gpt-oss-20b");
    EXPECT_EQ(gguf->kind(), "gguf-bpe");
    EXPECT_EQ(gguf->vocab_size(), json->vocab_size());
    const std::filesystem::path data = EH_TOKENIZER_TEST_DATA;
    const auto corpus = test::read_vocab_vectors(data / "multilingual.inp", data / "multilingual.inp");
    ASSERT_GE(corpus.size(), 30u);
    for (const auto& v : corpus) {
        EXPECT_EQ(ids_str(gguf->encode(v.text, false, false)), ids_str(json->encode(v.text, false, false))) << v.text;
        EXPECT_EQ(gguf->decode(gguf->encode(v.text, false, false)), v.text);
    }
    EXPECT_EQ(gguf->encode("<|start|>user<|message|>", false, true), json->encode("<|start|>user<|message|>", false, true));
    EXPECT_TRUE(gguf->is_eog(200002));
    EXPECT_FALSE(gguf->is_eog(200007));
}

TEST(GgufConformance, SameIdsAsTokenizerJson) {
    auto gguf = Tokenizer::from_view(open_vocab("gpt-2")->view());
    auto json = Tokenizer::from_hf_json(testdata() / "tokenizers/gpt2");
    const std::string text = "Mixed: naïve café 😶‍🌫️ <|endoftext|> 12345 \t\n end";
    EXPECT_EQ(gguf->encode(text, false, true), json->encode(text, false, true));
    EXPECT_EQ(gguf->encode(text, false, false), json->encode(text, false, false));
}

TEST(GgufErrors, MissingModelKeyNamesIt) {
    model::GgufWriter w;
    w.set("general.architecture", model::GgufValue::string("llama"));
    const auto bytes = w.to_bytes();
    auto file = model::ModelFile::open_gguf_buffer(bytes.data(), bytes.size());
    try {
        Tokenizer::from_view(file->view());
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::ModelLoadFailed);
        EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model"), std::string::npos);
    }
}

TEST(GgufErrors, UnsupportedPreNamesIt) {
    model::GgufWriter w;
    w.set("tokenizer.ggml.model", model::GgufValue::string("gpt2"));
    w.set("tokenizer.ggml.pre", model::GgufValue::string("deepseek-coder"));
    w.set("tokenizer.ggml.tokens", model::GgufValue::string_array({"a", "b"}));
    w.set("tokenizer.ggml.merges", model::GgufValue::string_array({"a b"}));
    const auto bytes = w.to_bytes();
    auto file = model::ModelFile::open_gguf_buffer(bytes.data(), bytes.size());
    EXPECT_THROW(
        {
            try {
                Tokenizer::from_view(file->view());
            } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find("deepseek-coder"), std::string::npos);
                throw;
            }
        },
        Error);
}

}  // namespace
}  // namespace eh::tokenizer
