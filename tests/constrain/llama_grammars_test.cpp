// The grammars users already have: every .gbnf file in llama.cpp's
// grammars/ folder (the peer's source in ../shared/peers, unpacked at test
// time) compiles through `grammar` and constrains as llama.cpp does, checked
// on a few strings each grammar must and must not match.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unistd.h>

#include "constrain_test_util.hpp"

#ifndef EH_TESTDATA_DIR
#define EH_TESTDATA_DIR ""
#endif

namespace eh::constrain {
namespace {

namespace fs = std::filesystem;
using test::matches;

struct Samples {
    std::vector<std::string> match, no_match;
};

// What llama.cpp's own grammars mean, string by string.
const std::map<std::string, Samples>& samples() {
    static const std::map<std::string, Samples> s = {
        {"arithmetic.gbnf", {{"1+2=3\n", "(a *b2) =x\n", "1=1\n2=2\n"}, {"1+=3\n", "1=2", "A=1\n"}}},
        {"c.gbnf",
         {{"int main(){return 0;}", "float f(int x){x = x*2;while(x<10){x = x+1;}}", "char c(){// note\n}"},
          {"int main(){return 0}", "main(){}", "int main(){return 0;}}"}}},
        {"chess.gbnf", {{"1. e4 e5\n2. Nf3 Nc6\n", "1. O-O exd5+\n2. a8=Q# Kxh1\n"}, {"1. e9 e5\n", "1. e4\n", "2. e4 e5\n"}}},
        {"english.gbnf", {{"Hello, world!", "a b\tc"}, {"h\xC3\xA9llo", "two  spaces", ""}}},
        {"japanese.gbnf",
         {{"\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF", "\xE6\x97\xA5\xE6\x9C\xAC \xE3\x80\x82"},
          {"abc", "\xE3\x81\x93 "}}},
        {"json.gbnf",
         {{R"({"a": [1, 2.5, "x\n", true, null], "b": {}})", "{}", "{\n  \"k\": -0.5e+12\n}"},
          {R"({"a" 1})", "[1]", R"({"a": 01})", R"({"a": "x)"}}},
        {"json_arr.gbnf", {{"[\n1,\n{\"a\": [true]}]", "[\n]"}, {"[1]", "[\n1,2]", "{}"}}},
        {"list.gbnf", {{"- milk\n- eggs\n", "- a b c\n"}, {"- \n", "milk\n", "- milk"}}},
    };
    return s;
}

TEST(LlamaGrammars, EveryGbnfFileCompilesAndConstrainsAsLlamaCppDoes) {
    const fs::path shared = fs::path(EH_TESTDATA_DIR).parent_path();
    if (!fs::exists(shared)) GTEST_SKIP() << "no ../shared folder at " << shared << " (the peers live there)";
    const fs::path archive = shared / "peers" / "llama.cpp" / "src.tar.xz";
    ASSERT_TRUE(fs::exists(archive)) << "../shared is there but llama.cpp's source archive is not: " << archive;
    const fs::path dir = fs::temp_directory_path() / ("eh-llama-grammars-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string cmd = "tar -xJf '" + archive.string() + "' -C '" + dir.string() + "' ./grammars";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir / "grammars"))
        if (e.path().extension() == ".gbnf") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    EXPECT_GE(files.size(), 8u);
    size_t sampled = 0;
    for (const auto& f : files) {
        std::ifstream in(f);
        std::stringstream text;
        text << in.rdbuf();
        const std::string name = f.filename().string();
        std::shared_ptr<const Grammar> g;
        try {
            g = gbnf_grammar(text.str());
        } catch (const GrammarError& e) {
            ADD_FAILURE() << name << " is refused: " << e.what();
            continue;
        }
        auto it = samples().find(name);
        if (it == samples().end()) continue;
        ++sampled;
        for (const auto& s : it->second.match) EXPECT_TRUE(matches(g, s)) << name << " should match: " << s;
        for (const auto& s : it->second.no_match) EXPECT_FALSE(matches(g, s)) << name << " should not match: " << s;
    }
    EXPECT_EQ(sampled, samples().size()) << "a grammar with samples is missing from the archive";
    fs::remove_all(dir);
}

}  // namespace
}  // namespace eh::constrain
