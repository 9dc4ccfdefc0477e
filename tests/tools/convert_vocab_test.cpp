// The converter's vocabularies through the host tokenizer: a SentencePiece-
// style BPE tokenizer.json (byte fallback, "▁" for spaces: Llama 2, Phi-3)
// becomes an SPM vocabulary (tokenizer.ggml.model = "llama", scores, token
// types) that encodes llama.cpp's test strings as the original does.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tokenizer/tokenizer.hpp"
#include "eh/tools/vocab.hpp"
#include "tools_test_util.hpp"

using namespace eh::tools;

namespace {

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct Case {
    std::string text;
    std::vector<int32_t> ids;
};

// llama.cpp's vocab test files: texts separated by "\n__ggml_vocab_test__\n",
// one line of ids per text.
std::vector<Case> read_cases(const std::string& inp, const std::string& out) {
    const std::string sep = "\n__ggml_vocab_test__\n", in = slurp(inp);
    std::vector<Case> cases;
    for (size_t i = 0, j; (j = in.find(sep, i)) != std::string::npos; i = j + sep.size()) cases.push_back({in.substr(i, j - i), {}});
    std::istringstream lines(slurp(out));
    std::string line;
    for (auto& c : cases) {
        if (!std::getline(lines, line)) break;
        std::istringstream nums(line);
        for (int32_t id; nums >> id;) c.ids.push_back(id);
    }
    return cases;
}

std::unique_ptr<eh::model::ModelFile> vocab_file(const Vocab& v) {
    eh::model::GgufWriter w;
    w.set("general.architecture", eh::model::GgufValue::string("phi3"));
    for (const auto& [k, val] : v.kv) w.set(k, val);
    const auto bytes = w.to_bytes();
    return eh::model::ModelFile::open_gguf_buffer(bytes.data(), bytes.size(), "phi-3 vocab");
}

}  // namespace

TEST(ConvertVocab, Phi3TokenizerJsonBecomesSpmAndEncodesLikeTheOriginal) {
    const std::string tok = test::testdata("tokenizers/phi-3-mini/tokenizer.json");
    const Vocab v = load_vocab(tok, 32064, "default", {});
    auto f = vocab_file(v);
    EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 32064u);
    EXPECT_EQ(f->get_f32_array("tokenizer.ggml.scores").size(), 32064u);
    EXPECT_FALSE(f->has("tokenizer.ggml.merges"));
    const auto types = f->get_i32_array("tokenizer.ggml.token_type");
    ASSERT_EQ(types.size(), 32064u);
    EXPECT_EQ(types[3], 6);      // <0x00>: byte
    EXPECT_EQ(types[260], 1);    // "▁t": normal
    EXPECT_EQ(types[32007], 3);  // <|end|>: control
    EXPECT_EQ(f->get_uint("tokenizer.ggml.unknown_token_id"), 0u);
    EXPECT_EQ(f->get_uint("tokenizer.ggml.eos_token_id"), 32000u);  // tokenizer_config.json's eos_token
    EXPECT_EQ(f->get_bool("tokenizer.ggml.add_space_prefix"), true);

    auto t = eh::tokenizer::Tokenizer::from_view(f->view());
    EXPECT_EQ(t->kind(), "gguf-spm");
    const std::string dir = test::testdata("vocab/ggml-vocab-phi-3.gguf");
    const auto cases = read_cases(dir + ".inp", dir + ".out");
    ASSERT_GT(cases.size(), 40u);
    size_t ok = 0;
    for (const auto& c : cases) {
        const auto got = t->encode(c.text, false, false);
        EXPECT_EQ(got, c.ids) << "text: \"" << c.text << "\"";
        ok += got == c.ids;
    }
    std::printf("phi-3 tokenizer.json -> SPM vocab: %zu/%zu vectors match\n", ok, cases.size());
}

TEST(ConvertVocab, ByteLevelBpeStaysGpt2) {
    const Vocab v = load_vocab(test::testdata("tokenizers/qwen2.5/tokenizer.json"), 0, "qwen2", {});
    auto f = vocab_file(v);
    EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_FALSE(f->has("tokenizer.ggml.scores"));
    EXPECT_GT(f->get_string_array("tokenizer.ggml.merges").size(), 0u);
}
