// The GGUF reader against files it writes itself: a full round trip of every
// value type, and every malformed header it must reject with a clean
// MODEL_LOAD_FAILED naming the fault.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <unistd.h>

#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "gguf_test_files.hpp"

using eh::model::ModelFile;
using eh::model::to_sv;
using eh::model::testing::Bytes;
using eh::model::testing::small_model_bytes;

namespace {

std::unique_ptr<ModelFile> open_bytes(const std::vector<uint8_t>& b) {
    return ModelFile::open_gguf_buffer(b.data(), b.size(), "test.gguf");
}

// Opening must fail with ModelLoadFailed and a message containing `needle`.
void expect_load_error(const std::vector<uint8_t>& b, const std::string& needle) {
    try {
        open_bytes(b);
        ADD_FAILURE() << "opened a file that should fail with: " << needle;
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), eh::Code::ModelLoadFailed);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
    }
}

TEST(GgufRoundTrip, EveryValueType) {
    auto f = open_bytes(small_model_bytes());
    EXPECT_EQ(f->gguf_version(), 3u);
    EXPECT_EQ(f->architecture(), "llama");
    EXPECT_EQ(f->get_uint("test.u8"), 200u);
    EXPECT_EQ(f->get_int("test.i8"), -100);
    EXPECT_EQ(f->get_uint("test.u16"), 60000u);
    EXPECT_EQ(f->get_int("test.i16"), -30000);
    EXPECT_EQ(f->get_int("test.i32"), -2000000000);
    EXPECT_EQ(f->get_uint("test.u64"), uint64_t(1) << 40);
    EXPECT_EQ(f->get_int("test.i64"), -(int64_t(1) << 40));
    EXPECT_EQ(f->get_float("test.f64"), 0.125);
    EXPECT_EQ(f->get_bool("test.bool"), true);
    EXPECT_NEAR(*f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-10);
    auto s = f->get_string("test.string_with_nul");
    ASSERT_TRUE(s);
    EXPECT_EQ(*s, std::string_view("a\0b", 3));
    EXPECT_THROW(f->get_uint("test.i8"), eh::Error);  // negative

    auto scores = f->get_f32_array("tokenizer.ggml.scores");
    ASSERT_EQ(scores.size(), 3u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(scores.data()) % alignof(float), 0u);
    EXPECT_EQ(scores[1], -1.0f);
    auto types = f->get_i32_array("tokenizer.ggml.token_type");
    ASSERT_EQ(types.size(), 3u);
    EXPECT_EQ(types[2], 6);
    auto ints = f->get_int_array("tokenizer.ggml.token_type");
    ASSERT_TRUE(ints);
    EXPECT_EQ((*ints)[1], 3);
    auto tokens = f->get_string_array("tokenizer.ggml.tokens");
    ASSERT_EQ(tokens.size(), 3u);
    EXPECT_EQ(to_sv(tokens[1]), "hello");
    EXPECT_EQ(tokens[2].size, 0u);
    EXPECT_EQ(tokens[2].data[0], '\0');
    auto bools = f->get_array("test.bool_array");
    ASSERT_TRUE(bools);
    EXPECT_EQ(bools->elem_type, uint32_t(EH_VALUE_BOOL));
    EXPECT_EQ(bools->as<uint8_t>()[1], 0);

    auto nested = f->get_array("test.nested");
    ASSERT_TRUE(nested);
    ASSERT_EQ(nested->elem_type, uint32_t(EH_VALUE_ARRAY));
    ASSERT_EQ(nested->count, 3u);
    auto outer = nested->as<eh_value>();
    EXPECT_EQ(outer[0].elem_type, uint32_t(EH_VALUE_U16));
    EXPECT_EQ(static_cast<const uint16_t*>(outer[0].v.array)[1], 2);
    EXPECT_EQ(outer[1].elem_type, uint32_t(EH_VALUE_STRING));
    EXPECT_EQ(to_sv(static_cast<const eh_string*>(outer[1].v.array)[1]), "yz");
    ASSERT_EQ(outer[2].elem_type, uint32_t(EH_VALUE_ARRAY));
    const eh_value* inner = static_cast<const eh_value*>(outer[2].v.array);
    EXPECT_EQ(static_cast<const double*>(inner[0].v.array)[0], 1.5);

    ASSERT_EQ(f->tensors().size(), 4u);
    const eh_tensor* q = f->find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, uint32_t(EH_TYPE_Q8_0));
    EXPECT_EQ(q->nbytes, 32u * 34u);
    EXPECT_EQ(static_cast<const uint8_t*>(q->data)[0], 0x3c);
    for (const eh_tensor& t : f->tensors())
        EXPECT_EQ((static_cast<const uint8_t*>(t.data) - static_cast<const uint8_t*>(f->tensors()[0].data)) % 32, 0);
}

TEST(GgufRoundTrip, CustomAlignment) {
    auto b = small_model_bytes(64);
    auto f = open_bytes(b);
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(f->data_offset() % 64, 0u);
    EXPECT_EQ(f->get_uint("general.alignment"), 64u);
}

TEST(GgufRoundTrip, WriteToDiskAndOpen) {
    auto path = std::filesystem::temp_directory_path() / "eh_model_writer_test.gguf";
    eh::model::testing::small_model_writer().write(path.string());
    auto f = ModelFile::open(path.string());
    EXPECT_EQ(f->tensors().size(), 4u);
    EXPECT_EQ(f->file_size(), std::filesystem::file_size(path));
    f.reset();
    std::filesystem::remove(path);
}

TEST(GgufRoundTrip, Version2Accepted) {
    auto b = small_model_bytes();
    b[4] = 2;
    EXPECT_EQ(open_bytes(b)->gguf_version(), 2u);
}

TEST(GgufHostile, EveryTruncationFailsCleanly) {
    auto b = small_model_bytes();
    for (size_t n = 0; n < b.size(); ++n) {
        std::vector<uint8_t> prefix(b.begin(), b.begin() + static_cast<long>(n));
        EXPECT_THROW(open_bytes(prefix), eh::Error) << "prefix " << n;
    }
}

TEST(GgufHostile, VersionsAndMagic) {
    expect_load_error(Bytes().header(1, 0, 0).b, "unsupported GGUF version 1");
    expect_load_error(Bytes().header(4, 0, 0).b, "unsupported GGUF version 4");
    Bytes be;
    be.raw("GGUF", 4).u32(0x03000000).u64(0).u64(0);
    expect_load_error(be.b, "big-endian");
    Bytes fugg;
    fugg.raw("FUGG", 4).u32(0x03000000).u64(0).u64(0);
    expect_load_error(fugg.b, "big-endian");
    expect_load_error(Bytes().raw("GGML", 4).u32(3).b, "bad magic");
    expect_load_error({}, "too short");
}

TEST(GgufHostile, EmptyHeaderIsValid) {
    auto f = open_bytes(Bytes().header(3, 0, 0).b);
    EXPECT_EQ(f->tensors().size(), 0u);
    EXPECT_EQ(f->architecture(), "");
}

TEST(GgufHostile, HugeCounts) {
    expect_load_error(Bytes().header(3, 0, UINT64_MAX).b, "metadata count");
    expect_load_error(Bytes().header(3, uint64_t(1) << 60, 0).b, "tensor count");
    // A string length that overflows any pointer arithmetic.
    expect_load_error(Bytes().header(3, 0, 1).u64(UINT64_MAX).zeros(16).b, "metadata key #0 length");
    expect_load_error(Bytes().header(3, 0, 1).u64(100).raw("abc", 3).zeros(16).b, "length 100 exceeds");
    // Arrays whose counts cannot fit.
    Bytes a;
    a.header(3, 0, 1).str("k").u32(EH_VALUE_ARRAY).u32(EH_VALUE_U32).u64(uint64_t(1) << 62).u32(0);
    expect_load_error(a.b, "element count");
    Bytes s;
    s.header(3, 0, 1).str("k").u32(EH_VALUE_ARRAY).u32(EH_VALUE_STRING).u64(UINT64_MAX / 8);
    expect_load_error(s.b, "element count");
    Bytes s2;  // a string inside an array whose length runs past the end
    s2.header(3, 0, 1).str("k").u32(EH_VALUE_ARRAY).u32(EH_VALUE_STRING).u64(1).u64(UINT64_MAX - 3);
    expect_load_error(s2.b, "k'[0] string length");
    Bytes n;  // nested arrays with a hostile inner count
    n.header(3, 0, 1).str("k").u32(EH_VALUE_ARRAY).u32(EH_VALUE_ARRAY).u64(1).u32(EH_VALUE_F64).u64(UINT64_MAX);
    expect_load_error(n.b, "element count");
}

TEST(GgufHostile, BadValues) {
    expect_load_error(Bytes().header(3, 0, 1).str("k").u32(13).u32(0).b, "unknown value type 13");
    expect_load_error(Bytes().header(3, 0, 1).str("k").u32(EH_VALUE_BOOL).u8(7).b, "bool");
    expect_load_error(Bytes().header(3, 0, 1).str("k").u32(EH_VALUE_ARRAY).u32(99).u64(1).b, "unknown element type 99");
    Bytes deep;
    deep.header(3, 0, 1).str("k").u32(EH_VALUE_ARRAY);
    for (int i = 0; i < 20; ++i) deep.u32(EH_VALUE_ARRAY).u64(1);
    deep.u32(EH_VALUE_U8).u64(0);
    expect_load_error(deep.b, "deeper");
    expect_load_error(Bytes().header(3, 0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2).b, "duplicate metadata key 'a.b'");
    expect_load_error(Bytes().header(3, 0, 1).kv_u32("general.alignment", 48).b, "general.alignment");
    expect_load_error(Bytes().header(3, 0, 1).kv_u32("general.alignment", 0).b, "general.alignment");
    expect_load_error(Bytes().header(3, 0, 1).kv_str("general.alignment", "32").b, "general.alignment");
    expect_load_error(Bytes().header(3, 0, 1).kv_u32("general.architecture", 1).b, "general.architecture");
}

// One tensor info followed by the data section.
std::vector<uint8_t> one_tensor(std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data_bytes) {
    Bytes b;
    b.header(3, 1, 0).tensor_info("t", std::move(dims), type, offset).pad().zeros(data_bytes);
    return b.b;
}

TEST(GgufHostile, TensorShapesAndTypes) {
    EXPECT_NO_THROW(open_bytes(one_tensor({4, 2}, EH_TYPE_F32, 0, 32)));
    expect_load_error(one_tensor({1, 1, 1, 1, 1}, EH_TYPE_F32, 0, 32), "n_dims 5");
    expect_load_error(one_tensor({}, EH_TYPE_F32, 0, 32), "n_dims 0");
    expect_load_error(one_tensor({4, 0}, EH_TYPE_F32, 0, 32), "dim 1 = 0");
    expect_load_error(one_tensor({uint64_t(1) << 40, uint64_t(1) << 40}, EH_TYPE_F32, 0, 32), "absurd dims");
    expect_load_error(one_tensor({UINT64_MAX}, EH_TYPE_F32, 0, 32), "absurd dims");
    expect_load_error(one_tensor({uint64_t(1) << 62}, EH_TYPE_F32, 0, 32), "byte size overflows");
    expect_load_error(one_tensor({uint64_t(1) << 40}, EH_TYPE_F32, 0, 32), "past the end");
    expect_load_error(one_tensor({4}, 77, 0, 32), "unknown tensor type 77");
    expect_load_error(one_tensor({31}, EH_TYPE_Q8_0, 0, 64), "not a multiple of the block size 32");
    expect_load_error(one_tensor({8}, EH_TYPE_F32, 16, 64), "not a multiple of the alignment 32");
    expect_load_error(one_tensor({8}, EH_TYPE_F32, 32, 32), "runs past the end");
    expect_load_error(one_tensor({8}, EH_TYPE_F32, uint64_t(1) << 63, 32), "runs past the end");
    // Infos that end exactly at EOF: the data section starts past the end.
    Bytes eof;
    eof.header(3, 1, 0).tensor_info("t", {8}, EH_TYPE_F32, 0);
    expect_load_error(eof.b, "");
}

TEST(GgufHostile, OverlapAndDuplicates) {
    Bytes o;
    o.header(3, 2, 0)
        .tensor_info("a", {16}, EH_TYPE_F32, 0)   // [0, 64)
        .tensor_info("b", {8}, EH_TYPE_F32, 32)   // [32, 64) overlaps a
        .pad()
        .zeros(64);
    expect_load_error(o.b, "overlaps");
    Bytes d;
    d.header(3, 2, 0).tensor_info("a", {8}, EH_TYPE_F32, 0).tensor_info("a", {8}, EH_TYPE_F32, 32).pad().zeros(64);
    expect_load_error(d.b, "duplicate tensor name 'a'");
    Bytes ok;  // adjacent, not overlapping
    ok.header(3, 2, 0).tensor_info("a", {8}, EH_TYPE_F32, 32).tensor_info("b", {8}, EH_TYPE_F32, 0).pad().zeros(64);
    EXPECT_NO_THROW(open_bytes(ok.b));
}

TEST(GgufHostile, MessagesNameOffsets) {
    try {
        open_bytes(one_tensor({4}, 77, 0, 32));
        FAIL();
    } catch (const eh::Error& e) {
        std::string m = e.what();
        EXPECT_NE(m.find("test.gguf"), std::string::npos) << m;
        EXPECT_NE(m.find("tensor 't'"), std::string::npos) << m;
        EXPECT_NE(m.find("offset"), std::string::npos) << m;
    }
}

}  // namespace

// The names in a folder, sorted.
std::vector<std::string> names_in(const std::filesystem::path& dir) {
    std::vector<std::string> v;
    for (const auto& e : std::filesystem::directory_iterator(dir)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
}

// GgufWriter::write(path) goes through a partial file and a rename: a write
// that fails part-way leaves neither the target nor the partial file.
TEST(GgufWriterFile, FailedWriteLeavesNoFile) {
    namespace fs = std::filesystem;
    fs::path dir = fs::temp_directory_path() / ("eh-writer-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const fs::path out = dir / "model.gguf";

    eh::model::GgufWriter ok;
    ok.set("general.architecture", eh::model::GgufValue::string("llama"));
    std::vector<float> w(32, 1.0f);
    ok.add_tensor("a.weight", EH_TYPE_F32, {32}, w.data());
    ok.write(out.string());
    EXPECT_EQ(names_in(dir), std::vector<std::string>{"model.gguf"});  // no partial file left
    EXPECT_NO_THROW(ModelFile::open(out.string()));

    const fs::path out2 = dir / "broken.gguf";
    eh::model::GgufWriter bad;
    bad.set("general.architecture", eh::model::GgufValue::string("llama"));
    bad.add_tensor("a.weight", EH_TYPE_F32, {32}, [](eh::model::ByteSink&) {
        throw eh::Error(eh::Code::Internal, "producer failed");
    });
    EXPECT_THROW(bad.write(out2.string()), eh::Error);
    EXPECT_EQ(names_in(dir), std::vector<std::string>{"model.gguf"});  // neither broken.gguf nor its partial
    fs::remove_all(dir);
}

// Two writers of one path at once (two test processes forging the same shared
// file) both succeed, and the file is one of them whole: here the second
// write runs to completion from inside the first one's tensor producer.
// With one shared partial name the inner write truncated and renamed the
// outer one's file, whose rename then failed ("cannot move ... into place").
TEST(GgufWriterFile, TwoWritersOfOnePathBothSucceed) {
    namespace fs = std::filesystem;
    fs::path dir = fs::temp_directory_path() / ("eh-writer2-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string out = (dir / "shared.gguf").string();
    std::vector<float> w(64, 2.0f);
    eh::model::GgufWriter inner;
    inner.set("general.architecture", eh::model::GgufValue::string("llama"));
    inner.add_tensor("b.weight", EH_TYPE_F32, {64}, w.data());
    eh::model::GgufWriter outer;
    outer.set("general.architecture", eh::model::GgufValue::string("llama"));
    outer.add_tensor("a.weight", EH_TYPE_F32, {64}, [&](eh::model::ByteSink& sink) {
        inner.write(out);  // the other writer, start to finish
        sink.write(w.data(), w.size() * sizeof(float));
    });
    ASSERT_NO_THROW(outer.write(out));
    EXPECT_EQ(names_in(dir), std::vector<std::string>{"shared.gguf"});
    auto f = ModelFile::open(out);  // the outer write, renamed last, whole
    EXPECT_NE(f->find_tensor("a.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("b.weight"), nullptr);
    fs::remove_all(dir);
}
