// Model references: which text is a local path, a hub file or a hub repo.
#include <gtest/gtest.h>

#include "eh/error.hpp"
#include "eh/hub/ref.hpp"

using eh::hub::ModelRef;
using eh::hub::parse_ref;

namespace {

auto none = [](const std::string&) { return false; };

std::string error_of(const std::string& text) {
    try {
        parse_ref(text, none);
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), eh::Code::InvalidRequest);
        return e.what();
    }
    return "";
}

}  // namespace

TEST(HubRef, PathsStayPaths) {
    for (std::string p : {"/models/x.gguf", "./x", "../y/z", "~/m.gguf", "model.gguf", "a/b.gguf", "a/b/c", "plain"}) {
        ModelRef r = parse_ref(p, none);
        EXPECT_EQ(r.kind, ModelRef::Kind::LocalPath) << p;
        EXPECT_EQ(r.path, p);
    }
}

TEST(HubRef, AnExistingPathWinsOverOrgRepo) {
    ModelRef r = parse_ref("org/repo", [](const std::string& p) { return p == "org/repo"; });
    EXPECT_EQ(r.kind, ModelRef::Kind::LocalPath);
    EXPECT_EQ(parse_ref("org/repo", none).kind, ModelRef::Kind::HubRepo);
}

TEST(HubRef, OrgRepoWithAndWithoutQuant) {
    ModelRef r = parse_ref("Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", none);
    EXPECT_EQ(r.kind, ModelRef::Kind::HubRepo);
    EXPECT_EQ(r.org, "Qwen");
    EXPECT_EQ(r.repo, "Qwen2.5-0.5B-Instruct-GGUF");
    EXPECT_EQ(r.quant, "Q4_K_M");
    EXPECT_EQ(r.revision, "main");
    EXPECT_EQ(r.display(), "Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M");
    ModelRef n = parse_ref("org/repo", none);
    EXPECT_EQ(n.quant, "");
    EXPECT_EQ(n.repo_id(), "org/repo");
}

TEST(HubRef, HfFileUrls) {
    ModelRef r = parse_ref("hf://org/repo/sub/dir/model-Q8_0.gguf", none);
    EXPECT_EQ(r.kind, ModelRef::Kind::HubFile);
    EXPECT_EQ(r.repo_id(), "org/repo");
    EXPECT_EQ(r.file, "sub/dir/model-Q8_0.gguf");
    EXPECT_EQ(r.display(), "hf://org/repo/sub/dir/model-Q8_0.gguf");
}

TEST(HubRef, Revisions) {
    ModelRef r = parse_ref("org/repo@v1.2:Q8_0", none);
    EXPECT_EQ(r.kind, ModelRef::Kind::HubRepo);
    EXPECT_EQ(r.repo, "repo");
    EXPECT_EQ(r.revision, "v1.2");
    EXPECT_EQ(r.quant, "Q8_0");
    EXPECT_EQ(r.display(), "org/repo@v1.2:Q8_0");
    r = parse_ref("hf://org/repo@0123456789abcdef0123456789abcdef01234567/d/f.gguf", none);
    EXPECT_EQ(r.kind, ModelRef::Kind::HubFile);
    EXPECT_EQ(r.revision, "0123456789abcdef0123456789abcdef01234567");
    EXPECT_EQ(r.file, "d/f.gguf");
    EXPECT_EQ(parse_ref("org/repo@dev", none).revision, "dev");
    EXPECT_EQ(parse_ref("org/repo", none).revision, "main");
}

TEST(HubRef, BadReferencesSayWhy) {
    EXPECT_NE(error_of("").find("empty"), std::string::npos);
    EXPECT_NE(error_of(std::string(eh::hub::kMaxRefBytes + 1, 'a')).find("longer than 2048"), std::string::npos);
    EXPECT_NE(error_of("hf://org/repo").find("hf://ORG/REPO/FILE"), std::string::npos);
    EXPECT_NE(error_of("hf://org/repo/").find("no file"), std::string::npos);
    EXPECT_NE(error_of("hf://org/repo/a/../b.gguf").find("'..'"), std::string::npos);
    EXPECT_NE(error_of("hf://org/repo/a//b.gguf").find("empty path segment"), std::string::npos);
    EXPECT_NE(error_of("hf://o--x/repo/f.gguf").find("'--'"), std::string::npos);
    EXPECT_NE(error_of("hf://org/-repo/f.gguf").find("start or end"), std::string::npos);
    EXPECT_NE(error_of("hf://org/re po/f.gguf").find("letters, digits"), std::string::npos);
    EXPECT_NE(error_of("org/repo:").find("empty quantization"), std::string::npos);
    EXPECT_NE(error_of("org/repo:Q4.K").find("quantization may hold"), std::string::npos);
    EXPECT_NE(error_of("org/repo:" + std::string(33, 'Q')).find("longer than 32"), std::string::npos);
    EXPECT_NE(error_of("o..rg/repo:Q4_0").find("'..'"), std::string::npos);
    EXPECT_NE(error_of(std::string("a\0b", 3)).find("NUL"), std::string::npos);
    EXPECT_NE(error_of("org/repo@").find("empty revision"), std::string::npos);
    EXPECT_NE(error_of("org/repo@a..b:Q4_0").find("'..'"), std::string::npos);
    EXPECT_NE(error_of("hf://org/repo@x y/f.gguf").find("a revision may hold only"), std::string::npos);
    EXPECT_NE(error_of("org/repo@" + std::string(129, 'r')).find("longer than 128"), std::string::npos);
    EXPECT_NE(error_of("hf://org/" + std::string(97, 'r') + "/f.gguf").find("longer than 96"), std::string::npos);
}

// Issue 52, item 12f: FILE is percent-decoded before the segment rules apply,
// so an encoded '.', '..', '/' or control byte is refused as a plain one is.
TEST(HubRef, EncodedDotSegmentsAreRefused) {
    for (std::string t : {"hf://o/r/%2e%2e/%2e%2e/x.gguf", "hf://o/r/%2E%2E/x.gguf", "hf://o/r/a/%2E%2e/x.gguf",
                          "hf://o/r/.%2e/x.gguf", "hf://o/r/%2e./x.gguf", "hf://o/r/%2e/x.gguf",
                          "hf://o/r/a/%2E", "hf://o/r/a%2F..%2Fb.gguf", "hf://o/r@main/%2e%2e/x.gguf"})
        EXPECT_NE(error_of(t).find("'.' and '..' are not allowed in the file name"), std::string::npos) << t;
    for (std::string t : {"hf://o/r/a%2F%2Fb.gguf", "hf://o/r/%2Fetc/x.gguf", "hf://o/r/a%2f", "hf://o/r/%2F"})
        EXPECT_NE(error_of(t).find("an empty path segment in the file name"), std::string::npos) << t;
    for (std::string t : {"hf://o/r/a%00.gguf", "hf://o/r/a%0A.gguf", "hf://o/r/a%5C..%5Cb.gguf"})
        EXPECT_NE(error_of(t).find("control characters and '\\' are not allowed"), std::string::npos) << t;
    for (std::string t : {"hf://o/r/a%zz.gguf", "hf://o/r/a%2", "hf://o/r/a%", "hf://o/r/%%2e%2e"})
        EXPECT_NE(error_of(t).find("a '%' in the file name must start an escape"), std::string::npos) << t;
}

TEST(HubRef, EncodedFileNamesAreDecoded) {
    ModelRef r = parse_ref("hf://org/repo/dir%2Fsub/a%20b-Q4_K_M.gguf", none);
    EXPECT_EQ(r.kind, ModelRef::Kind::HubFile);
    EXPECT_EQ(r.file, "dir/sub/a b-Q4_K_M.gguf");
    EXPECT_EQ(parse_ref("hf://org/repo/x%2egguf", none).file, "x.gguf");
    // '%' itself is written %25, and display() writes it so again.
    r = parse_ref("hf://org/repo/100%25.gguf", none);
    EXPECT_EQ(r.file, "100%.gguf");
    EXPECT_EQ(r.display(), "hf://org/repo/100%25.gguf");
    EXPECT_EQ(parse_ref(r.display(), none).file, r.file);
    // ORG, REPO and REV are names, never decoded.
    EXPECT_NE(error_of("hf://o%2e/r/x.gguf").find("letters, digits"), std::string::npos);
    EXPECT_NE(error_of("hf://o/r@%2e%2e/x.gguf").find("a revision may hold only"), std::string::npos);
}
