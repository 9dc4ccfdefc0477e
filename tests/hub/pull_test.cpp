// pull() against the loopback hub (fake_hub.hpp): the cache layout, reuse,
// resume, hash checks, offline mode, redirects and the tree API.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "eh/error.hpp"
#include "eh/hub/http_client.hpp"
#include "eh/hub/pull.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "fake_hub.hpp"

namespace fs = std::filesystem;
using namespace eh::hub;
using eh::hub::test::FakeHub;
using eh::hub::test::FakeRepo;
using eh::hub::test::sha256_hex;

namespace {

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";

std::string blob_of(size_t n, char seed) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = char(seed + i * 7 + (i >> 9));
    return s;
}

std::string read(const fs::path& p) { return eh::hub::test::read_file(p.string()); }

class HubPull : public ::testing::Test {
protected:
    void SetUp() override {
        cache = fs::temp_directory_path() /
                ("eh_hub_pull_" + std::to_string(::getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(cache);
        FakeRepo r;
        r.commit = kCommit;
        r.files["README.md"] = {"# a model\n", false};
        r.files["m-Q4_K_M.gguf"] = {blob_of(300000, 1), true};
        r.files["m-Q8_0.gguf"] = {blob_of(200000, 2), true};
        r.files["x-Q8_0.gguf"] = {blob_of(1000, 3), true};
        r.files["big/m-F16-00001-of-00003.gguf"] = {blob_of(5000, 4), true};
        r.files["big/m-F16-00002-of-00003.gguf"] = {blob_of(6000, 5), true};
        r.files["big/m-F16-00003-of-00003.gguf"] = {blob_of(7000, 6), true};
        r.files["small.gguf"] = {"GGUF tiny, not an LFS file", false};
        hub.add("org/repo", r);
        FakeRepo vision;  // a Gemma 3 upload: the model and its projectors
        vision.commit = kCommit;
        vision.files["g-Q4_K_M.gguf"] = {blob_of(4000, 7), true};
        vision.files["mmproj-g-f16.gguf"] = {blob_of(3000, 8), true};
        vision.files["mmproj-g-f32.gguf"] = {blob_of(5000, 9), true};
        hub.add("org/vision", vision);
        FakeRepo moved;
        moved.renamed_to = "org/repo";
        hub.add("old/name", moved);
        FakeRepo gated = r;
        gated.gated = true;
        hub.add("org/gated", gated);
        opt.settings.endpoint = hub.endpoint();
        opt.settings.cache = cache;
        opt.log = [this](const std::string& l) { logs.push_back(l); };
    }
    void TearDown() override { fs::remove_all(cache); }

    PullResult pull_text(const std::string& ref) { return pull(parse_ref(ref), opt); }
    fs::path repo_dir() const { return cache / "models--org--repo"; }
    std::string error_of(const std::string& ref, eh::Code want) {
        try {
            pull_text(ref);
        } catch (const eh::Error& e) {
            EXPECT_EQ(e.code(), want) << e.what();
            return e.what();
        }
        ADD_FAILURE() << "no error for " << ref;
        return "";
    }

    FakeHub hub;
    fs::path cache;
    PullOptions opt;
    std::vector<std::string> logs;
};

}  // namespace

TEST_F(HubPull, ByQuantIntoTheHubCacheLayout) {
    PullResult r = pull_text("org/repo:Q4_K_M");
    const std::string content = "m-Q4_K_M.gguf";
    std::string sha = sha256_hex(blob_of(300000, 1));
    EXPECT_EQ(r.commit, kCommit);
    EXPECT_EQ(r.path, repo_dir() / "snapshots" / kCommit / content);
    EXPECT_EQ(fs::read_symlink(r.path), fs::path("../../blobs") / sha);
    EXPECT_EQ(read(r.path), blob_of(300000, 1));
    EXPECT_EQ(read(repo_dir() / "refs/main"), kCommit);
    EXPECT_FALSE(fs::exists(repo_dir() / "blobs" / (sha + ".incomplete")));
    EXPECT_EQ(hub.tree_gets.load(), 1);
    EXPECT_EQ(hub.cdn_gets.load(), 1);
}

// A repository reference fetches the vision projector beside the model (the
// F16 one of two), online and then from the cache offline; a repository
// without one, or a reference to one file, fetches no projector.
TEST_F(HubPull, TheVisionProjectorComesBesideTheModel) {
    PullResult r = pull_text("org/vision:Q4_K_M");
    const fs::path snap = cache / "models--org--vision" / "snapshots" / kCommit;
    EXPECT_EQ(r.path, snap / "g-Q4_K_M.gguf");
    EXPECT_EQ(r.mmproj, snap / "mmproj-g-f16.gguf");
    EXPECT_EQ(read(r.mmproj), blob_of(3000, 8));
    EXPECT_EQ(r.files, (std::vector<std::string>{"g-Q4_K_M.gguf", "mmproj-g-f16.gguf"}));
    EXPECT_FALSE(fs::exists(snap / "mmproj-g-f32.gguf"));
    EXPECT_EQ(hub.cdn_gets.load(), 2);
    bool said = false;
    for (const auto& l : logs) said = said || l.find("vision projector (serve --mmproj ") != std::string::npos;
    EXPECT_TRUE(said);
    opt.settings.offline = true;
    PullResult again = pull_text("org/vision:Q4_K_M");
    EXPECT_TRUE(again.offline);
    EXPECT_EQ(again.mmproj, r.mmproj);
    EXPECT_EQ(hub.cdn_gets.load(), 2);
    opt.settings.offline = false;
    EXPECT_TRUE(pull_text("hf://org/vision/g-Q4_K_M.gguf").mmproj.empty());
    EXPECT_TRUE(pull_text("org/repo:Q4_K_M").mmproj.empty());
}

TEST_F(HubPull, CachedFilesAreNotFetchedAgain) {
    pull_text("hf://org/repo/m-Q8_0.gguf");
    ASSERT_EQ(hub.cdn_gets.load(), 1);
    PullResult again = pull_text("hf://org/repo/m-Q8_0.gguf");
    EXPECT_EQ(hub.cdn_gets.load(), 1);
    EXPECT_EQ(read(again.path), blob_of(200000, 2));
    ASSERT_FALSE(logs.empty());
    EXPECT_NE(logs.back().find("already in the cache"), std::string::npos);
}

TEST_F(HubPull, ABlobAnotherToolFetchedIsReused) {
    // The layout huggingface_hub writes: blobs/<sha256>, the snapshot link, refs/main.
    std::string sha = sha256_hex(blob_of(200000, 2));
    fs::create_directories(repo_dir() / "blobs");
    std::ofstream(repo_dir() / "blobs" / sha, std::ios::binary) << blob_of(200000, 2);
    PullResult r = pull_text("hf://org/repo/m-Q8_0.gguf");
    EXPECT_EQ(hub.cdn_gets.load(), 0);
    EXPECT_EQ(read(r.path), blob_of(200000, 2));
}

TEST_F(HubPull, ADroppedConnectionIsResumedWithARangeRequest) {
    hub.drop_after = 120000;
    hub.drops_left = 2;  // twice in a row: 0..120000, then nothing new, then the rest
    PullResult r = pull_text("hf://org/repo/m-Q4_K_M.gguf");
    EXPECT_EQ(read(r.path), blob_of(300000, 1));
    EXPECT_EQ(sha256_hex(read(r.path)), sha256_hex(blob_of(300000, 1)));
    auto ranges = hub.ranges_seen();
    ASSERT_GE(ranges.size(), 1u);
    EXPECT_EQ(ranges.front(), "bytes=120000-");
    EXPECT_EQ(hub.cdn_gets.load(), 3);
}

TEST_F(HubPull, AnIncompleteFileFromAnEarlierRunIsResumed) {
    std::string content = blob_of(300000, 1), sha = sha256_hex(content);
    fs::create_directories(repo_dir() / "blobs");
    std::ofstream(repo_dir() / "blobs" / (sha + ".incomplete"), std::ios::binary) << content.substr(0, 77777);
    PullResult r = pull_text("hf://org/repo/m-Q4_K_M.gguf");
    EXPECT_EQ(read(r.path), content);
    ASSERT_EQ(hub.ranges_seen().size(), 1u);
    EXPECT_EQ(hub.ranges_seen().front(), "bytes=77777-");
}

TEST_F(HubPull, AConnectionThatKeepsDroppingGivesUpClearly) {
    hub.drop_after = 0;
    hub.drops_left = 1000;
    std::string e = error_of("hf://org/repo/m-Q8_0.gguf", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("the download stopped at 0 of 200000 bytes"), std::string::npos) << e;
    EXPECT_NE(e.find("run the command again to resume"), std::string::npos) << e;
}

TEST_F(HubPull, AWrongShaFailsAndLeavesNothingInSnapshots) {
    hub.lie_about_sha = true;
    std::string e = error_of("hf://org/repo/m-Q8_0.gguf", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("sha256 mismatch"), std::string::npos) << e;
    EXPECT_NE(e.find(sha256_hex(blob_of(200000, 2))), std::string::npos) << "names the actual hash: " << e;
    EXPECT_FALSE(fs::exists(repo_dir() / "snapshots" / kCommit / "m-Q8_0.gguf"));
    for (const auto& b : fs::directory_iterator(repo_dir() / "blobs"))
        ADD_FAILURE() << "left behind: " << b.path();
}

TEST_F(HubPull, AnEtagThatIsNotAPlainNameIsRefused) {
    hub.etag_override = "../../../../tmp/x";
    std::string e = error_of("hf://org/repo/m-Q8_0.gguf", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("no usable ETag"), std::string::npos) << e;
    EXPECT_EQ(hub.cdn_gets.load(), 0);
}

TEST_F(HubPull, ANonLfsFileIsCheckedByItsGitHash) {
    PullResult r = pull_text("hf://org/repo/small.gguf");
    EXPECT_EQ(read(r.path), "GGUF tiny, not an LFS file");
    EXPECT_EQ(hub.cdn_gets.load(), 0);
    EXPECT_EQ(fs::read_symlink(r.path), fs::path("../../blobs") / eh::hub::test::git_sha1_hex(read(r.path)));
}

TEST_F(HubPull, OfflineUsesTheCacheOnly) {
    opt.settings.offline = true;
    std::string e = error_of("org/repo:Q4_K_M", eh::Code::NotFound);
    EXPECT_NE(e.find("is not in the hub cache"), std::string::npos) << e;
    EXPECT_NE(e.find("offline mode is on"), std::string::npos) << e;
    opt.settings.offline = false;
    pull_text("org/repo:Q4_K_M");
    int heads = hub.heads, trees = hub.tree_gets;
    opt.settings.offline = true;
    PullResult r = pull_text("org/repo:Q4_K_M");
    EXPECT_TRUE(r.offline);
    EXPECT_EQ(read(r.path), blob_of(300000, 1));
    EXPECT_EQ(hub.heads.load(), heads);
    EXPECT_EQ(hub.tree_gets.load(), trees);
    // Offline choice by quant sees only what is cached.
    e = error_of("org/repo:Q8_0", eh::Code::NotFound);
    EXPECT_NE(e.find("no GGUF file of quantization 'Q8_0'"), std::string::npos) << e;
}

TEST_F(HubPull, AnUnreachableHubFallsBackToTheCache) {
    pull_text("hf://org/repo/m-Q8_0.gguf");
    opt.settings.endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
    PullResult r = pull_text("hf://org/repo/m-Q8_0.gguf");
    EXPECT_TRUE(r.offline);
    EXPECT_NE(logs.back().find("the hub cannot be reached"), std::string::npos);
    std::string e = error_of("hf://org/repo/m-Q4_K_M.gguf", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("127.0.0.1:1"), std::string::npos) << e;
}

TEST_F(HubPull, AmbiguousAndMissingQuantsListTheChoices) {
    std::string e = error_of("org/repo:Q8_0", eh::Code::InvalidRequest);
    EXPECT_NE(e.find("ambiguous"), std::string::npos) << e;
    EXPECT_NE(e.find("m-Q8_0.gguf"), std::string::npos) << e;
    EXPECT_NE(e.find("x-Q8_0.gguf"), std::string::npos) << e;
    e = error_of("org/repo:Q3_K_S", eh::Code::NotFound);
    EXPECT_NE(e.find("m-Q4_K_M.gguf"), std::string::npos) << e;
    EXPECT_EQ(hub.cdn_gets.load(), 0);
}

TEST_F(HubPull, SplitGgufsAreFetchedWhole) {
    PullResult r = pull_text("org/repo:F16");
    ASSERT_EQ(r.files.size(), 3u);
    EXPECT_EQ(r.path, repo_dir() / "snapshots" / kCommit / "big/m-F16-00001-of-00003.gguf");
    for (int i = 1; i <= 3; ++i)
        EXPECT_EQ(read(repo_dir() / "snapshots" / kCommit / ("big/m-F16-0000" + std::to_string(i) + "-of-00003.gguf")),
                  blob_of(4000 + 1000 * i, char(3 + i)));
    // A later shard named directly brings the whole set too.
    fs::remove_all(cache);
    r = pull_text("hf://org/repo/big/m-F16-00003-of-00003.gguf");
    EXPECT_EQ(r.files.size(), 3u);
    EXPECT_EQ(r.path.filename(), "m-F16-00001-of-00003.gguf");
}

// Pulled into the cache (snapshot entries that link to blobs), the first
// shard of a real split GGUF opens the whole set as one model.
TEST_F(HubPull, APulledSplitGgufOpensAsOneModel) {
    const std::vector<float> w0(16, 1.0f), w1(32, 2.0f);
    auto shard = [&](int no, const std::vector<float>* t, const char* name) {
        eh::model::GgufWriter w;
        if (no == 0) w.set("general.architecture", eh::model::GgufValue::string("llama"));
        w.set("split.no", eh::model::GgufValue::u16(uint16_t(no)));
        w.set("split.count", eh::model::GgufValue::u16(2));
        if (no == 0) w.set("split.tensors.count", eh::model::GgufValue::i32(2));
        w.add_tensor(name, EH_TYPE_F32, {uint64_t(t->size())}, t->data());
        auto bytes = w.to_bytes();
        return std::string(bytes.begin(), bytes.end());
    };
    FakeRepo r;
    r.commit = kCommit;
    r.files["q-F32-00001-of-00002.gguf"] = {shard(0, &w0, "a"), true};
    r.files["q-F32-00002-of-00002.gguf"] = {shard(1, &w1, "b"), true};
    hub.add("org/split", r);
    PullResult got = pull(parse_ref("org/split:F32"), opt);
    auto m = eh::model::ModelFile::open(got.path.string());
    EXPECT_EQ(m->tensors().size(), 2u);
    ASSERT_NE(m->find_tensor("b"), nullptr);
    EXPECT_EQ(static_cast<const float*>(m->find_tensor("b")->data)[31], 2.0f);
    EXPECT_EQ(m->weight_files().size(), 2u);
}

TEST_F(HubPull, AListedPathThatWouldLeaveTheSnapshotIsIgnored) {
    FakeRepo evil;
    evil.commit = kCommit;
    evil.files["../../../escape-Q2_K.gguf"] = {"x", true};
    evil.files["ok-Q8_0.gguf"] = {"y", true};
    hub.add("evil/repo", evil);
    std::string e = error_of("evil/repo:Q2_K", eh::Code::NotFound);
    EXPECT_NE(e.find("no GGUF file of quantization 'Q2_K'"), std::string::npos) << e;
    EXPECT_EQ(e.find("escape"), std::string::npos) << e;
}

TEST_F(HubPull, TheTreeApiIsReadPageByPage) {
    hub.tree_page_size = 2;
    auto files = list_repo_files(opt, "org/repo", "main");
    EXPECT_EQ(files.size(), 8u);
    EXPECT_EQ(hub.tree_gets.load(), 4);
    EXPECT_EQ(std::count(files.begin(), files.end(), "subdir"), 0) << "directories are not files";
}

TEST_F(HubPull, TheTokenGoesToTheHubNeverToTheCdn) {
    opt.settings.token = "hf_secret";
    pull_text("hf://org/repo/m-Q8_0.gguf");
    for (const auto& a : hub.auth_at_hub()) EXPECT_EQ(a, "Bearer hf_secret");
    ASSERT_FALSE(hub.auth_at_cdn().empty());
    for (const auto& a : hub.auth_at_cdn()) EXPECT_EQ(a, "");
}

TEST_F(HubPull, ARenamedRepoIsFollowed) {
    PullResult r = pull_text("hf://old/name/m-Q8_0.gguf");
    EXPECT_EQ(read(r.path), blob_of(200000, 2));
    EXPECT_EQ(r.path, cache / "models--old--name" / "snapshots" / kCommit / "m-Q8_0.gguf");
}

TEST_F(HubPull, ARevisionPinsTheCommit) {
    PullResult r = pull_text("org/repo@" + kCommit + ":Q4_K_M");
    EXPECT_EQ(r.path, repo_dir() / "snapshots" / kCommit / "m-Q4_K_M.gguf");
    EXPECT_FALSE(fs::exists(repo_dir() / "refs" / kCommit)) << "a commit needs no ref";
    opt.settings.offline = true;
    EXPECT_EQ(pull_text("org/repo@" + kCommit + ":Q4_K_M").path, r.path);
    EXPECT_NE(error_of("org/repo@dev:Q4_K_M", eh::Code::NotFound).find("not in the hub cache"), std::string::npos);
    opt.settings.offline = false;
    std::string e = error_of("org/repo@dev:Q4_K_M", eh::Code::NotFound);
    EXPECT_NE(e.find("revision not found"), std::string::npos) << e;
    e = error_of("hf://org/repo@dev/m-Q8_0.gguf", eh::Code::NotFound);
    EXPECT_NE(e.find("revision not found"), std::string::npos) << e;
}

TEST_F(HubPull, HubRefusalsSayWhatIsWrong) {
    std::string e = error_of("hf://no/such/f.gguf", eh::Code::NotFound);
    EXPECT_NE(e.find("repository not found (a private one needs HF_TOKEN)"), std::string::npos) << e;
    e = error_of("hf://org/repo/absent.gguf", eh::Code::NotFound);
    EXPECT_NE(e.find("org/repo/absent.gguf: file not found"), std::string::npos) << e;
    e = error_of("hf://org/gated/m-Q8_0.gguf", eh::Code::NotFound);
    EXPECT_NE(e.find("gated"), std::string::npos) << e;
    e = error_of("no/such", eh::Code::NotFound);
    EXPECT_NE(e.find("repository not found"), std::string::npos) << e;
}

TEST_F(HubPull, ResolveModelPassesLocalPathsThrough) {
    EXPECT_EQ(resolve_model("/no/such/model.gguf", opt), "/no/such/model.gguf");
    EXPECT_EQ(hub.heads.load(), 0);
    EXPECT_EQ(fs::path(resolve_model("org/repo:Q4_K_M", opt)).filename(), "m-Q4_K_M.gguf");
}

// Issue 52, item 4: the tree API's next-page link names another host. The
// page is not asked for at all, so the token cannot reach that host.
TEST_F(HubPull, ANextPageOnAnotherHostIsRefusedAndNeverGetsTheToken) {
    opt.settings.token = "hf_secret";
    hub.tree_page_size = 2;
    hub.tree_next_on_cdn = true;
    std::string e = error_of("org/repo:Q4_K_M", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("org/repo: the hub's file list points its next page at another host (" + hub.cdn_origin() + ")"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("only " + hub.endpoint() + " (HF_ENDPOINT)"), std::string::npos) << e;
    EXPECT_TRUE(hub.auth_at_cdn().empty()) << "the other host was asked";
    EXPECT_EQ(hub.tree_gets.load(), 1);
    EXPECT_EQ(hub.cdn_gets.load(), 0);
}

// The token goes to the configured origin only, whichever URL a request
// starts from; the same host on another port or scheme is another origin.
TEST_F(HubPull, TheTokenGoesOnlyToTheEndpointsOrigin) {
    HttpOptions o;
    o.token = "hf_secret";
    o.token_origin = parse_url(hub.endpoint())->origin();
    HttpClient http(o);
    auto at_cdn = parse_url(hub.cdn_origin() + "/api/models/org/repo/tree/main?recursive=true");
    ASSERT_TRUE(at_cdn);
    EXPECT_EQ(http.get_text(*at_cdn).status, 200);
    ASSERT_EQ(hub.auth_at_cdn().size(), 1u);
    EXPECT_EQ(hub.auth_at_cdn().front(), "");
    auto at_hub = parse_url(hub.endpoint() + "/org/repo/resolve/main/README.md");
    ASSERT_TRUE(at_hub);
    EXPECT_EQ(http.head(*at_hub).status, 200);
    ASSERT_FALSE(hub.auth_at_hub().empty());
    EXPECT_EQ(hub.auth_at_hub().back(), "Bearer hf_secret");
    // A host name differs from the endpoint's only in case: the same origin.
    EXPECT_EQ(parse_url("HTTP://LocalHost:80/x")->origin(), "http://localhost");
}

namespace {

size_t files_in(const fs::path& dir) {
    std::error_code ec;
    size_t n = 0;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) ++n;
    return n;
}

}  // namespace

// Issue 52, item 5: the hub announces 4096 bytes; the CDN claims 10^12 and
// streams on. Nothing is written past the announced size, and nothing stays.
TEST_F(HubPull, AContentLengthOverTheAnnouncedSizeIsRefusedAndNothingStays) {
    uint64_t most = 0;
    opt.progress = [&](const std::string&, uint64_t done, uint64_t) { most = std::max(most, done); };
    hub.linked_size = "4096";
    hub.cdn_content_length = 1'000'000'000'000;
    hub.cdn_body_bytes = 16 << 20;
    std::string e = error_of("hf://org/repo/m-Q8_0.gguf", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("m-Q8_0.gguf: the server sends more than the 4096 bytes the hub announced; the download was "
                     "removed"),
              std::string::npos)
        << e;
    EXPECT_LE(most, 4096u);
    EXPECT_EQ(hub.cdn_gets.load(), 1) << "not retried";
    EXPECT_EQ(files_in(repo_dir() / "blobs"), 0u) << "a partial file stayed";
    EXPECT_FALSE(fs::exists(repo_dir() / "snapshots" / kCommit / "m-Q8_0.gguf"));
}

// A body with no length that goes on past the announced size: cut at it.
TEST_F(HubPull, ABodyLongerThanAnnouncedIsCutThereAndRemoved) {
    uint64_t most = 0;
    opt.progress = [&](const std::string&, uint64_t done, uint64_t) { most = std::max(most, done); };
    hub.cdn_body_bytes = 16 << 20;  // the file's 200000 bytes, then filler, chunked
    std::string e = error_of("hf://org/repo/m-Q8_0.gguf", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("the server sends more than the 200000 bytes the hub announced"), std::string::npos) << e;
    EXPECT_LE(most, 200000u);
    EXPECT_EQ(files_in(repo_dir() / "blobs"), 0u) << "a partial file stayed";
    // An earlier run's .incomplete is removed too when this one fails so.
    std::string sha = sha256_hex(blob_of(200000, 2));
    std::ofstream(repo_dir() / "blobs" / (sha + ".incomplete"), std::ios::binary) << blob_of(200000, 2).substr(0, 5000);
    e = error_of("hf://org/repo/m-Q8_0.gguf", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("the server sends more than the 200000 bytes the hub announced"), std::string::npos) << e;
    EXPECT_EQ(files_in(repo_dir() / "blobs"), 0u);
}

// An announced size the disk cannot hold is refused before a byte is fetched.
TEST_F(HubPull, AFileThatCannotFitIsRefusedBeforeItIsFetched) {
    hub.linked_size = "1000000000000000000";  // 1 EB
    std::string e = error_of("hf://org/repo/m-Q8_0.gguf", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("m-Q8_0.gguf: not enough disk space: the hub announces 1000000000000000000 bytes"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("are free in " + (repo_dir() / "blobs").string()), std::string::npos) << e;
    EXPECT_EQ(hub.cdn_gets.load(), 0);
    EXPECT_EQ(files_in(repo_dir() / "blobs"), 0u);
}

// A size that is not a number bounds nothing: nothing is fetched.
TEST_F(HubPull, AnAnswerWithoutAUsableSizeIsRefused) {
    hub.linked_size = "12abc";
    std::string e = error_of("hf://org/repo/m-Q8_0.gguf", eh::Code::ModelLoadFailed);
    EXPECT_NE(e.find("org/repo/m-Q8_0.gguf: the hub's answer has no usable size (X-Linked-Size or Content-Length)"),
              std::string::npos)
        << e;
    EXPECT_EQ(hub.cdn_gets.load(), 0);
}
