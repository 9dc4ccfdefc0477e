// GGUF vocab files through the project's GGUF reader: llama.cpp's vocab
// GGUFs and their expected ids, and a Qwen2 vocab GGUF the test writes from
// tokenizer.json (ggml-vocab-qwen2.gguf itself is not in the test data).
#include <gtest/gtest.h>
#include <algorithm>
#include <cstdio>
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

// Gemma's vocabulary as llama.cpp's converter writes it: SentencePiece
// ("llama") with add_space_prefix false, <pad>/<eos>/<bos> at 0/1/2 (Gemma's
// order, not Llama's), control and user-defined turn markers, byte
// fallback. No Gemma vocabulary is in the test data: this one is forged
// with just the pieces the checks need.
TEST(GgufConformance, GemmaStyleSpm) {
    std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"};
    std::vector<int32_t> types = {3, 3, 3, 2, 3, 4};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        tokens.emplace_back(name);
        types.push_back(6);
    }
    const std::vector<std::string> pieces = {"H", "e", "l", "o", "w", "r", "d", "u", "s", "\xE2\x96\x81", "\n", "He",
                                             "ll", "llo", "Hello", "\xE2\x96\x81w", "\xE2\x96\x81wo", "\xE2\x96\x81wor",
                                             "\xE2\x96\x81worl", "\xE2\x96\x81world", "us", "use", "user"};
    for (const auto& p : pieces) {
        tokens.push_back(p);
        types.push_back(1);
    }
    std::vector<float> scores(tokens.size(), 0.0f);
    for (size_t i = 0; i < tokens.size(); ++i)
        if (types[i] == 1) scores[i] = static_cast<float>(tokens[i].size());  // longer pieces win
    model::GgufWriter w;
    w.set("general.architecture", model::GgufValue::string("gemma3"));
    w.set("tokenizer.ggml.model", model::GgufValue::string("llama"));
    w.set("tokenizer.ggml.tokens", model::GgufValue::string_array(tokens));
    w.set("tokenizer.ggml.scores", model::GgufValue::array(std::span<const float>(scores)));
    w.set("tokenizer.ggml.token_type", model::GgufValue::array(std::span<const int32_t>(types)));
    w.set("tokenizer.ggml.bos_token_id", model::GgufValue::u32(2));
    w.set("tokenizer.ggml.eos_token_id", model::GgufValue::u32(1));
    w.set("tokenizer.ggml.unknown_token_id", model::GgufValue::u32(3));
    w.set("tokenizer.ggml.padding_token_id", model::GgufValue::u32(0));
    w.set("tokenizer.ggml.add_bos_token", model::GgufValue::boolean(true));
    w.set("tokenizer.ggml.add_space_prefix", model::GgufValue::boolean(false));
    const auto bytes = w.to_bytes();
    auto file = model::ModelFile::open_gguf_buffer(bytes.data(), bytes.size(), "gemma-style-vocab");
    auto tok = Tokenizer::from_view(file->view());
    auto id = [&](const std::string& t) { return static_cast<int32_t>(std::find(tokens.begin(), tokens.end(), t) - tokens.begin()); };
    const std::string sp = "\xE2\x96\x81";

    EXPECT_EQ(tok->kind(), "gguf-spm");
    EXPECT_EQ(tok->special().bos, 2);
    EXPECT_EQ(tok->special().eos, 1);
    EXPECT_FALSE(tok->strips_leading_space());
    // a model turn ends generation at <end_of_turn>, as at <eos>
    EXPECT_EQ(tok->special().eot, 5);
    EXPECT_TRUE(tok->is_eog(5));
    EXPECT_TRUE(tok->is_eog(1));
    EXPECT_FALSE(tok->is_eog(4));
    // no "▁" before the first word; BOS first
    EXPECT_EQ(tok->encode("Hello world", true, false), (std::vector<int32_t>{2, id("Hello"), id(sp + "world")}));
    EXPECT_EQ(tok->encode(" world", false, false), (std::vector<int32_t>{id(sp + "world")}));
    // a turn: the marker as one id (control: only when parsing special
    // text), then the role with no space prefix after it
    EXPECT_EQ(tok->encode("<start_of_turn>user\nHello", false, true),
              (std::vector<int32_t>{4, id("user"), id("\n"), id("Hello")}));
    const auto plain = tok->encode("<start_of_turn>user", false, false);
    EXPECT_EQ(std::find(plain.begin(), plain.end(), 4), plain.end());
    // user-defined <end_of_turn> is matched either way
    EXPECT_EQ(tok->encode("Hello<end_of_turn>", false, false), (std::vector<int32_t>{id("Hello"), 5}));
    // a character with no piece falls back to its UTF-8 bytes
    EXPECT_EQ(tok->encode("\xC3\xA9", false, false), (std::vector<int32_t>{id("<0xC3>"), id("<0xA9>")}));
    // decoding keeps a leading space (nothing was added to strip)
    EXPECT_EQ(tok->decode(std::vector<int32_t>{id(sp + "world")}), " world");
    EXPECT_EQ(tok->decode(std::vector<int32_t>{id("Hello"), id(sp + "world"), id("<0xC3>"), id("<0xA9>")}),
              "Hello world\xC3\xA9");
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
