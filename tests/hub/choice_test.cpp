// Choosing a repository's GGUF by quantization; split names; settings from
// the environment; the cache layout's paths and links.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "eh/error.hpp"
#include "eh/hub/cache.hpp"
#include "eh/hub/gguf_choice.hpp"
#include "eh/hub/http_client.hpp"
#include "eh/hub/http_headers.hpp"
#include "eh/hub/settings.hpp"

namespace fs = std::filesystem;
using namespace eh::hub;

namespace {

std::string choice_error(const std::vector<std::string>& files, const std::string& quant, eh::Code want) {
    try {
        choose_gguf(files, quant, "org/repo");
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), want) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
}

const std::vector<std::string> kRepo = {
    "README.md", "model-Q4_K.gguf", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "model.IQ4_XS.gguf",
    "mmproj-model-f16.gguf", "big/model-F16-00001-of-00002.gguf", "big/model-F16-00002-of-00002.gguf"};

}  // namespace

TEST(HubChoice, QuantIsAWholeTokenCaseInsensitive) {
    EXPECT_EQ(choose_gguf(kRepo, "Q4_K", "org/repo"), "model-Q4_K.gguf");
    EXPECT_EQ(choose_gguf(kRepo, "q4_k_m", "org/repo"), "model-Q4_K_M.gguf");
    EXPECT_EQ(choose_gguf(kRepo, "IQ4_XS", "org/repo"), "model.IQ4_XS.gguf");
    EXPECT_EQ(choose_gguf(kRepo, "F16", "org/repo"), "big/model-F16-00001-of-00002.gguf");
}

TEST(HubChoice, NoQuantTakesTheOnlyGgufElseQ4KM) {
    EXPECT_EQ(choose_gguf({"a.txt", "only-Q5_0.gguf"}, "", "org/repo"), "only-Q5_0.gguf");
    EXPECT_EQ(choose_gguf(kRepo, "", "org/repo"), "model-Q4_K_M.gguf");
    std::string e = choice_error({"m-Q8_0.gguf", "m-Q6_K.gguf"}, "", eh::Code::InvalidRequest);
    EXPECT_NE(e.find("has 2 GGUF files; name one as org/repo:QUANT"), std::string::npos) << e;
    EXPECT_NE(e.find("Q6_K       m-Q6_K.gguf"), std::string::npos) << e;
}

TEST(HubChoice, MissingAndAmbiguousListTheChoices) {
    std::string e = choice_error(kRepo, "Q2_K", eh::Code::NotFound);
    EXPECT_NE(e.find("no GGUF file of quantization 'Q2_K'"), std::string::npos) << e;
    EXPECT_NE(e.find("model-Q8_0.gguf"), std::string::npos) << e;
    EXPECT_EQ(e.find("mmproj"), std::string::npos) << e;
    EXPECT_EQ(e.find("00002-of"), std::string::npos) << "later shards are not choices: " << e;
    e = choice_error({"a-Q4_0.gguf", "b-Q4_0.gguf", "c-Q8_0.gguf"}, "Q4_0", eh::Code::InvalidRequest);
    EXPECT_NE(e.find("org/repo:Q4_0 is ambiguous: 2 files match; use hf://org/repo/FILE"), std::string::npos) << e;
    EXPECT_EQ(e.find("c-Q8_0"), std::string::npos) << e;
    e = choice_error({"README.md"}, "", eh::Code::NotFound);
    EXPECT_NE(e.find("has no GGUF file"), std::string::npos) << e;
}

TEST(HubChoice, TheVisionProjectorBesideTheModel) {
    EXPECT_EQ(choose_mmproj(kRepo, "model-Q4_K_M.gguf"), "mmproj-model-f16.gguf");
    // Only the model's folder: a split set's shards live in big/, which has none.
    EXPECT_EQ(choose_mmproj(kRepo, "big/model-F16-00001-of-00002.gguf"), std::nullopt);
    EXPECT_EQ(choose_mmproj({"m-Q4_K_M.gguf", "README.md"}, "m-Q4_K_M.gguf"), std::nullopt);
    // F16 (the converter's default), then BF16, F32, Q8_0, else the first by name; any case.
    const std::vector<std::string> many = {"m-Q4_K_M.gguf", "MMPROJ-F32.gguf", "mmproj-BF16.gguf", "mmproj-x-f16.gguf",
                                           "vision/mmproj-F16.gguf"};
    EXPECT_EQ(choose_mmproj(many, "m-Q4_K_M.gguf"), "mmproj-x-f16.gguf");
    EXPECT_EQ(choose_mmproj({"m.gguf", "MMPROJ-F32.gguf", "mmproj-BF16.gguf"}, "m.gguf"), "mmproj-BF16.gguf");
    EXPECT_EQ(choose_mmproj({"m.gguf", "mmproj-Q4_0.gguf", "mmproj-b.gguf"}, "m.gguf"), "mmproj-Q4_0.gguf");
    EXPECT_EQ(choose_mmproj({"d/m.gguf", "d/mmproj-F16.gguf", "mmproj-F16.gguf"}, "d/m.gguf"), "d/mmproj-F16.gguf");
    EXPECT_EQ(choose_mmproj({"d/m.gguf", "d/mmproj.txt", "d/e/mmproj-F16.gguf"}, "d/m.gguf"), std::nullopt);
}

TEST(HubChoice, SplitNames) {
    auto s = parse_split("d/m-00002-of-00005.gguf");
    ASSERT_TRUE(s);
    EXPECT_EQ(s->prefix, "d/m");
    EXPECT_EQ(s->index, 2);
    EXPECT_EQ(s->count, 5);
    EXPECT_FALSE(parse_split("m-00006-of-00005.gguf"));
    EXPECT_FALSE(parse_split("m-00000-of-00005.gguf"));
    EXPECT_FALSE(parse_split("m-0000a-of-00005.gguf"));
    EXPECT_FALSE(parse_split("-00001-of-00002.gguf"));
    EXPECT_EQ(shard_set("m-00002-of-00003.gguf"),
              (std::vector<std::string>{"m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"}));
    EXPECT_EQ(shard_set("single.gguf"), std::vector<std::string>{"single.gguf"});
    EXPECT_THROW(shard_set("m-00001-of-01001.gguf"), eh::Error);
}

TEST(HubHeaders, ContentRangeLinkAndEtag) {
    auto r = parse_content_range("bytes 100-999/1000");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->start, 100u);
    EXPECT_EQ(r->total, 1000u);
    EXPECT_EQ(parse_content_range("bytes 5-9/*")->total, 0u);
    for (const char* bad : {"", "bytes", "bytes 9-5/10", "bytes 0-10/10", "items 0-1/2", "bytes -1/2", "bytes 0-1/2x"})
        EXPECT_FALSE(parse_content_range(bad)) << bad;
    EXPECT_EQ(next_link("<https://h/a?cursor=x>; rel=\"next\""), "https://h/a?cursor=x");
    EXPECT_EQ(next_link("<https://h/p>; rel=\"prev\", <https://h/n>; rel=\"next\""), "https://h/n");
    EXPECT_EQ(next_link("<https://h/p>; rel=\"prev\""), "");
    EXPECT_EQ(next_link("<unclosed"), "");
    EXPECT_EQ(unquote_etag("W/\"abc\""), "abc");
    EXPECT_EQ(unquote_etag("\"abc\""), "abc");
    EXPECT_EQ(unquote_etag("\""), "\"");
}

TEST(HubUrl, ParseResolveEncode) {
    auto u = parse_url("https://huggingface.co/org/repo/resolve/main/f.gguf");
    ASSERT_TRUE(u);
    EXPECT_EQ(u->origin(), "https://huggingface.co");
    EXPECT_EQ(u->target, "/org/repo/resolve/main/f.gguf");
    u = parse_url("http://[::1]:8080");
    ASSERT_TRUE(u);
    EXPECT_EQ(u->host, "::1");
    EXPECT_EQ(u->origin(), "http://[::1]:8080");
    EXPECT_EQ(u->target, "/");
    for (const char* bad : {"ftp://h/x", "https://", "http://h:0/", "http://h:99999/", "http://user@h/", "h/x"})
        EXPECT_FALSE(parse_url(bad)) << bad;
    auto cdn = resolve_location(*parse_url("https://hub/a/b"), "https://cdn.example/x?sig=1");
    EXPECT_EQ(cdn->origin(), "https://cdn.example");
    EXPECT_EQ(resolve_location(*parse_url("https://hub:8443/a/b"), "/c/d")->str(), "https://hub:8443/c/d");
    EXPECT_EQ(resolve_location(*parse_url("https://hub/a"), "//other/x")->origin(), "https://other");
    EXPECT_FALSE(resolve_location(*parse_url("https://hub/a"), "relative/x"));
    EXPECT_EQ(encode_path("dir/a b+c%.gguf"), "dir/a%20b%2Bc%25.gguf");
}

TEST(HubSettings, CacheTokenEndpointOfflineFromTheEnvironment) {
    std::map<std::string, std::string> env;
    auto get = [&](const char* n) -> std::optional<std::string> {
        auto it = env.find(n);
        return it == env.end() ? std::nullopt : std::optional(it->second);
    };
    env["HOME"] = "/home/u";
    Settings s = settings_from_env(get);
    EXPECT_EQ(s.cache, fs::path("/home/u/.cache/huggingface/hub"));
    EXPECT_EQ(s.endpoint, "https://huggingface.co");
    EXPECT_FALSE(s.offline);
    env["XDG_CACHE_HOME"] = "/xdg";
    EXPECT_EQ(settings_from_env(get).cache, fs::path("/xdg/huggingface/hub"));
    env["HF_HOME"] = "/hf";
    EXPECT_EQ(settings_from_env(get).cache, fs::path("/hf/hub"));
    env["HF_HUB_CACHE"] = "/cache";
    env["HF_ENDPOINT"] = "http://mirror:8080//";
    env["HF_HUB_OFFLINE"] = "True";
    env["HF_TOKEN"] = " hf_abc\n";
    s = settings_from_env(get);
    EXPECT_EQ(s.cache, fs::path("/cache"));
    EXPECT_EQ(s.endpoint, "http://mirror:8080");
    EXPECT_TRUE(s.offline);
    EXPECT_EQ(s.token, "hf_abc");
    env["HF_HUB_OFFLINE"] = "0";
    EXPECT_FALSE(settings_from_env(get).offline);
}

TEST(HubSettings, TokenFileWhenNoVariable) {
    fs::path dir = fs::temp_directory_path() / ("eh_hub_token_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "token") << "hf_fromfile\n";
    auto get = [&](const char* n) -> std::optional<std::string> {
        if (std::string(n) == "HF_HOME") return dir.string();
        return std::nullopt;
    };
    EXPECT_EQ(settings_from_env(get).token, "hf_fromfile");
    fs::remove_all(dir);
}

TEST(HubCache, LayoutAndRelativeLinks) {
    fs::path root = fs::temp_directory_path() / ("eh_hub_cache_" + std::to_string(::getpid()));
    fs::remove_all(root);
    RepoCache c(root, "org", "repo");
    EXPECT_EQ(c.dir(), root / "models--org--repo");
    std::string commit(40, 'a'), etag(64, 'b');
    fs::create_directories(c.blob(etag).parent_path());
    std::ofstream(c.blob(etag)) << "x";
    fs::path at = c.link(commit, "sub/f.gguf", etag);
    EXPECT_EQ(at, root / "models--org--repo/snapshots" / commit / "sub/f.gguf");
    EXPECT_EQ(fs::read_symlink(at), fs::path("../../../blobs") / etag);
    EXPECT_TRUE(fs::exists(at));
    EXPECT_EQ(c.snapshot_files(commit), std::vector<std::string>{"sub/f.gguf"});
    EXPECT_FALSE(c.commit_for("main"));
    c.write_ref("main", commit);
    EXPECT_EQ(c.commit_for("main"), commit);
    EXPECT_EQ(c.commit_for(std::string(40, 'c')), std::string(40, 'c'));
    fs::remove_all(root);
}
