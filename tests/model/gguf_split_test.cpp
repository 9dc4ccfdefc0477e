// Split GGUF files (PREFIX-00001-of-0000N.gguf, llama.cpp's gguf-split
// convention) open as one model. The shards are written here, at test time,
// with the project's own GGUF writer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "eh/error.hpp"
#include "eh/model/gguf_split.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"

namespace fs = std::filesystem;
using namespace eh::model;

namespace {

struct Tensor {
    std::string name;
    std::vector<float> data;
};

// Five F32 tensors of different sizes, each filled with its own pattern.
std::vector<Tensor> tensors() {
    std::vector<Tensor> out;
    for (int i = 0; i < 5; ++i) {
        Tensor t{"blk." + std::to_string(i) + ".w", std::vector<float>(size_t(8 * (i + 1)))};
        for (size_t k = 0; k < t.data.size(); ++k) t.data[k] = float(i * 1000 + int(k));
        out.push_back(std::move(t));
    }
    return out;
}

void set_model_metadata(GgufWriter& w) {
    w.set("general.architecture", GgufValue::string("llama"));
    w.set("llama.context_length", GgufValue::u32(64));
}

void add(GgufWriter& w, const Tensor& t) { w.add_tensor(t.name, EH_TYPE_F32, {uint64_t(t.data.size())}, t.data.data()); }

class SplitGguf : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("eh-split-" + std::to_string(::getpid()) + "-" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string shard(int i, int n) const { return (dir_ / split_file_name("m", i, n)).string(); }

    // The tensors spread over `n` shards: shard k holds those listed in
    // `placement[k]` (indexes into tensors()); the first shard holds the
    // model's metadata. `no_override`/`count_override` forge the split keys.
    void write_split(const std::vector<std::vector<int>>& placement, int tensors_count = -1,
                     std::map<int, int> no_override = {}) {
        const int n = int(placement.size());
        const auto ts = tensors();
        int total = 0;
        for (const auto& p : placement) total += int(p.size());
        for (int k = 0; k < n; ++k) {
            GgufWriter w;
            if (k == 0) set_model_metadata(w);
            w.set("split.no", GgufValue::u16(uint16_t(no_override.count(k) ? no_override[k] : k)));
            w.set("split.count", GgufValue::u16(uint16_t(n)));
            if (k == 0) w.set("split.tensors.count", GgufValue::i32(tensors_count < 0 ? total : tensors_count));
            for (int t : placement[size_t(k)]) add(w, ts[size_t(t)]);
            w.write(shard(k + 1, n));
        }
    }

    std::string message_of(const std::string& path) {
        try {
            ModelFile::open(path);
        } catch (const eh::Error& e) {
            EXPECT_EQ(e.code(), eh::Code::ModelLoadFailed);
            return e.what();
        }
        return "(opened)";
    }

    fs::path dir_;
};

TEST_F(SplitGguf, ShardsOpenAsOneModelEqualToTheWholeFile) {
    const std::string whole = (dir_ / "whole.gguf").string();
    {
        GgufWriter w;
        set_model_metadata(w);
        const auto ts = tensors();  // the writer borrows the bytes until write()
        for (const auto& t : ts) add(w, t);
        w.write(whole);
    }
    // gguf-split --no-tensor-in-metadata puts no tensor in the first shard.
    write_split({{}, {0, 1}, {2}, {3, 4}});
    auto a = ModelFile::open(whole);
    auto b = ModelFile::open(shard(1, 4));
    EXPECT_EQ(b->architecture(), "llama");
    EXPECT_EQ(b->get_uint("llama.context_length"), 64u);
    ASSERT_EQ(b->tensors().size(), a->tensors().size());
    ASSERT_EQ(b->view().n_tensors, 5u);
    for (const eh_tensor& t : a->tensors()) {
        const eh_tensor* u = b->find_tensor(to_sv(t.name));
        ASSERT_NE(u, nullptr) << to_sv(t.name);
        ASSERT_EQ(u->nbytes, t.nbytes);
        EXPECT_EQ(std::memcmp(u->data, t.data, t.nbytes), 0) << to_sv(t.name);
    }
    ASSERT_EQ(b->weight_files().size(), 4u);
    EXPECT_EQ(b->weight_files()[3], shard(4, 4));
    uint64_t sizes = 0;
    for (int i = 1; i <= 4; ++i) sizes += fs::file_size(shard(i, 4));
    EXPECT_EQ(b->file_size(), sizes);
}

TEST_F(SplitGguf, ALaterShardIsRefusedNamingTheFirst) {
    write_split({{0}, {1, 2, 3, 4}});
    std::string m = message_of(shard(2, 2));
    EXPECT_NE(m.find("shard 2 of 2"), std::string::npos) << m;
    EXPECT_NE(m.find("m-00001-of-00002.gguf"), std::string::npos) << m;
}

TEST_F(SplitGguf, AMissingShardIsNamed) {
    write_split({{0}, {1}, {2, 3, 4}});
    fs::remove(shard(2, 3));
    std::string m = message_of(shard(1, 3));
    EXPECT_NE(m.find("shard 2 of 3 is missing"), std::string::npos) << m;
}

TEST_F(SplitGguf, TensorCountMustMatch) {
    write_split({{0}, {1, 2, 3, 4}}, 7);
    std::string m = message_of(shard(1, 2));
    EXPECT_NE(m.find("hold 5 tensors but split.tensors.count says 7"), std::string::npos) << m;
}

TEST_F(SplitGguf, AShardWithTheWrongNumberIsRefused) {
    write_split({{0}, {1}, {2, 3, 4}}, -1, {{2, 1}});  // the third file says it is the second
    std::string m = message_of(shard(1, 3));
    EXPECT_NE(m.find("is not shard 3 of 3"), std::string::npos) << m;
}

TEST_F(SplitGguf, ATensorInTwoShardsIsRefused) {
    write_split({{0, 1}, {1, 2, 3, 4}});
    std::string m = message_of(shard(1, 2));
    EXPECT_NE(m.find("tensor 'blk.1.w'"), std::string::npos) << m;
    EXPECT_NE(m.find("also in an earlier shard"), std::string::npos) << m;
}

TEST_F(SplitGguf, AFirstShardWithoutTheNamingConventionIsRefused) {
    write_split({{0}, {1, 2, 3, 4}});
    const std::string renamed = (dir_ / "model.gguf").string();
    fs::rename(shard(1, 2), renamed);
    std::string m = message_of(renamed);
    EXPECT_NE(m.find("is not named PREFIX-00001-of-00002.gguf"), std::string::npos) << m;
}

TEST_F(SplitGguf, OneShardSetsAndPlainFilesAreOrdinaryFiles) {
    write_split({{0, 1, 2, 3, 4}});  // split.count 1
    EXPECT_EQ(ModelFile::open(shard(1, 1))->tensors().size(), 5u);
}

// parse_split's cases are in tests/hub/choice_test.cpp (the hub uses it too).
TEST(SplitNames, BuiltNamesParseBack) {
    auto s = parse_split(split_file_name("d/m", 2, 5));
    ASSERT_TRUE(s);
    EXPECT_EQ(s->prefix + "|" + std::to_string(s->index) + "|" + std::to_string(s->count), "d/m|2|5");
}

}  // namespace
