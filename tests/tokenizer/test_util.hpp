// Shared helpers for the tokenizer tests: the llama.cpp vocab test format
// (.inp strings separated by "__ggml_vocab_test__" lines, .out ids per line).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace eh::tokenizer::test {

inline std::filesystem::path testdata() { return EH_TESTDATA_DIR; }

inline std::string read_file(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Vector {
    std::string text;
    std::vector<int32_t> ids;
};

inline std::vector<Vector> read_vocab_vectors(const std::filesystem::path& inp, const std::filesystem::path& out) {
    const std::string sep = "\n__ggml_vocab_test__\n";
    const std::string in = read_file(inp);
    std::vector<std::string> texts;
    size_t i = 0;
    while (true) {
        const size_t j = in.find(sep, i);
        if (j == std::string::npos) break;
        texts.push_back(in.substr(i, j - i));
        i = j + sep.size();
    }
    std::vector<Vector> v;
    std::istringstream lines(read_file(out));
    std::string line;
    for (const auto& t : texts) {
        if (!std::getline(lines, line)) break;
        Vector x{t, {}};
        std::istringstream nums(line);
        int32_t id;
        while (nums >> id) x.ids.push_back(id);
        v.push_back(std::move(x));
    }
    return v;
}

inline std::string ids_str(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += " " + std::to_string(id);
    return s;
}

// Encodes every string of ggml-vocab-<name>.gguf.inp and compares with the
// .out ids; with `check_decode`, decoding must give the string back.
template <class Tok>
void expect_vectors(const Tok& tok, const std::string& vocab_name, bool check_decode = false) {
    const auto dir = testdata() / "vocab";
    const auto vectors = read_vocab_vectors(dir / ("ggml-vocab-" + vocab_name + ".gguf.inp"),
                                            dir / ("ggml-vocab-" + vocab_name + ".gguf.out"));
    ASSERT_EQ(vectors.size(), 46u);
    size_t ok = 0;
    for (const auto& v : vectors) {
        const auto got = tok.encode(v.text, false, false);
        EXPECT_EQ(ids_str(got), ids_str(v.ids)) << "text: \"" << v.text << "\"";
        ok += got == v.ids;
        // The vector strings are NFC already, so decoding gives them back.
        if (check_decode) {
            EXPECT_EQ(tok.decode(got), v.text);
        }
    }
    std::printf("[%s via %s] %zu/%zu vectors match\n", vocab_name.c_str(), std::string(tok.kind()).c_str(), ok,
                vectors.size());
}

}  // namespace eh::tokenizer::test
