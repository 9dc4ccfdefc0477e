#include <gtest/gtest.h>

#include "eh/loader/manifest.hpp"

using eh::loader::parse_manifest;

namespace {
const char* kGood = R"({
  "manifest_version": 1, "name": "x", "version": "1.2.3", "engine": "x",
  "abi": {"major": 1, "minor": 0}, "library": "libeh-x.so",
  "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
  "platform": "linux-x86_64", "formats": ["gguf"], "architectures": ["llama"],
  "quant_kinds": ["Q4_K", "F32"], "device": {"kind": "cuda", "min_compute_capability": 80},
  "priority": 5 })";
}

TEST(Manifest, ParsesEveryField) {
    std::vector<std::string> problems;
    auto m = parse_manifest(kGood, problems);
    ASSERT_TRUE(problems.empty()) << problems.front();
    EXPECT_EQ(m.caps.name, "x");
    EXPECT_EQ(m.caps.version, "1.2.3");
    EXPECT_EQ(m.abi_major, 1u);
    EXPECT_EQ(m.library, "libeh-x.so");
    EXPECT_EQ(m.caps.quant_kinds, (std::vector<std::string>{"Q4_K", "F32"}));
    EXPECT_EQ(m.caps.device_kind, "cuda");
    EXPECT_EQ(m.caps.min_compute_capability, 80u);
    EXPECT_EQ(m.caps.priority, 5);
}

TEST(Manifest, HostileInputsNeverThrowAndAlwaysExplain) {
    const char* bad[] = {"", "null", "[]", "{", "{\"name\": 1}", "\"x\"", "{\"abi\": []}",
                         "{\"manifest_version\": 99999999999999999999}",
                         "{\"formats\": [1,2]}", "{\"device\": {\"kind\": \"tpu\"}}",
                         "{\"sha256\": \"XYZ\"}", "{\"library\": \"../../etc/passwd\"}"};
    for (const char* text : bad) {
        std::vector<std::string> problems;
        EXPECT_NO_THROW(parse_manifest(text, problems)) << text;
        EXPECT_FALSE(problems.empty()) << text;
    }
}

TEST(Manifest, UnsupportedManifestVersionIsNamed) {
    std::string text = kGood;
    text.replace(text.find("\"manifest_version\": 1"), 21, "\"manifest_version\": 2");
    std::vector<std::string> problems;
    parse_manifest(text, problems);
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_EQ(problems[0], "manifest_version 2 is not supported (this host reads version 1)");
}
