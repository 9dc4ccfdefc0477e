// A deterministic mini-fuzzer that runs in every build (gcc included): many
// corrupted variants of a small valid GGUF must each either open or fail
// with eh::Error(ModelLoadFailed) -- never crash, hang or throw anything else.
#include <gtest/gtest.h>

#include <random>

#include "eh/error.hpp"
#include "eh/model/model_file.hpp"
#include "gguf_test_files.hpp"

using eh::model::ModelFile;

namespace {

// Opens `b` and touches everything the view exposes, so a reader that
// accepted garbage would be caught reading it (under ASan, or by a crash).
void must_not_crash(const std::vector<uint8_t>& b) {
    try {
        auto f = ModelFile::open_gguf_buffer(b.data(), b.size(), "corpus.gguf");
        const eh_model_view& v = f->view();
        uint64_t sum = 0;
        for (uint64_t i = 0; i < v.n_metadata; ++i) {
            sum += v.metadata[i].key.size;
            const eh_value& val = v.metadata[i].value;
            if (val.type == EH_VALUE_ARRAY && val.elem_type == EH_VALUE_STRING)
                for (uint64_t k = 0; k < val.count; ++k) sum += static_cast<const eh_string*>(val.v.array)[k].size;
        }
        for (uint64_t i = 0; i < v.n_tensors; ++i) {
            const eh_tensor& t = v.tensors[i];
            const uint8_t* p = static_cast<const uint8_t*>(t.data);
            if (t.nbytes) sum += p[0] + p[t.nbytes - 1];
        }
        (void)sum;
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), eh::Code::ModelLoadFailed) << e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "non-eh exception: " << e.what();
    }
}

// Bytes before the tensor data section.
size_t header_size(const std::vector<uint8_t>& b) {
    return static_cast<size_t>(ModelFile::open_gguf_buffer(b.data(), b.size())->data_offset());
}

TEST(GgufCorpus, RandomByteFlips) {
    const auto base = eh::model::testing::small_model_bytes();
    std::mt19937_64 rng(20240601);
    // Header, metadata and tensor infos are where parsing happens; flip there.
    size_t header_end = header_size(base);
    for (int round = 0; round < 4000; ++round) {
        auto b = base;
        int flips = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < flips; ++k) {
            size_t at = rng() % header_end;
            switch (rng() % 3) {
            case 0: b[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
            case 1: b[at] = static_cast<uint8_t>(rng()); break;
            default: b[at] = 0xff; break;
            }
        }
        must_not_crash(b);
    }
}

TEST(GgufCorpus, HostileCountsEverywhere) {
    // Overwrite every 8-byte window of the header region with extreme values:
    // this hits every length, count, dim and offset field.
    const auto base = eh::model::testing::small_model_bytes();
    const uint64_t extremes[] = {0, 1, 0x7fffffffffffffffull, 0xffffffffffffffffull, 0x100000000ull, 4096};
    size_t header_end = header_size(base);
    for (size_t at = 0; at + 8 <= header_end; ++at) {
        for (uint64_t x : extremes) {
            auto b = base;
            std::memcpy(&b[at], &x, 8);
            must_not_crash(b);
        }
    }
}

TEST(GgufCorpus, TruncatedAndExtendedMutants) {
    const auto base = eh::model::testing::small_model_bytes();
    std::mt19937_64 rng(7);
    for (int round = 0; round < 1000; ++round) {
        auto b = base;
        b[rng() % header_size(base)] ^= static_cast<uint8_t>(rng());
        b.resize(rng() % (b.size() + 64));
        must_not_crash(b);
    }
}

}  // namespace
