// Encodings against vectors produced by implementations no one here wrote
// (llama.cpp's test-tokenizer-0 .out files, made with HF tokenizers).
#include <gtest/gtest.h>

#include "eh/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

namespace eh::tokenizer {
namespace {

using test::testdata;

using test::expect_vectors;
using test::ids_str;

TEST(HfJsonConformance, Gpt2MatchesGgufVectors) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/gpt2");
    expect_vectors(*tok, "gpt-2");
}

TEST(HfJsonConformance, Qwen25MatchesQwen2Vectors) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/qwen2.5/tokenizer.json");
    expect_vectors(*tok, "qwen2");
}

TEST(HfJsonConformance, Phi3MatchesPhi3Vectors) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/phi-3-mini");
    expect_vectors(*tok, "phi-3");
}

// Expected ids from HF tokenizers (make_gptoss_vectors.py, run where the
// `tokenizers` package is installed) for the o200k harmony vocabulary.
TEST(HfJsonConformance, GptOssMatchesReferenceVectors) {
    const std::filesystem::path data = EH_TOKENIZER_TEST_DATA;
    if (!std::filesystem::exists(data / "multilingual.gptoss.out"))
        GTEST_SKIP() << "tests/tokenizer/data/multilingual.gptoss.out does not exist yet: run "
                        "tests/tokenizer/make_gptoss_vectors.py where the Python `tokenizers` package is installed";
    const auto vectors = test::read_vocab_vectors(data / "multilingual.inp", data / "multilingual.gptoss.out");
    ASSERT_GE(vectors.size(), 30u);
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/gpt-oss-20b");
    size_t ok = 0;
    for (const auto& v : vectors) {
        const auto got = tok->encode(v.text, false, false);
        EXPECT_EQ(ids_str(got), ids_str(v.ids)) << "text: \"" << v.text << "\"";
        ok += got == v.ids;
    }
    std::printf("[gpt-oss via hf-json] %zu/%zu vectors match\n", ok, vectors.size());
}

}  // namespace
}  // namespace eh::tokenizer
