// Shared helpers for the tokenizer tests: the llama.cpp vocab test format
// (.inp strings separated by "__ggml_vocab_test__" lines, .out ids per line).
#pragma once

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

}  // namespace eh::tokenizer::test
