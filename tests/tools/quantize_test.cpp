#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include <engine_host/quant_blocks.hpp>

#include "eh/model/model_file.hpp"
#include "eh/tools/forge.hpp"
#include "eh/tools/profiles.hpp"
#include "eh/tools/quantize.hpp"
#include "eh/error.hpp"
#include "tools_test_util.hpp"

using namespace eh::tools;
using eh::tools::test::TempDir;

namespace {

struct Bound {
    uint32_t type;
    const char* name;
    uint32_t block;
    // worst error in a block as a fraction of the block's largest |value|
    double max_rel;
};

// The bounds follow from each format: a symmetric b-bit type with its
// largest magnitude on the most negative code has step amax/2^(b-1) and an
// error of at most one step on the positive side; an affine type has
// step (max-min)/(2^b-1) ≤ 2*amax/(2^b-1) and errs by half a step, plus
// the rounding of its 6-bit min (K-quants); MXFP4's E2M1 grid has gaps of
// up to 2 units with a power-of-two scale ≤ amax/3.
const Bound kBounds[] = {
    {EH_TYPE_Q8_0, "Q8_0", 32, 1.0 / 254 * 1.01},
    {EH_TYPE_Q4_0, "Q4_0", 32, 1.0 / 8 * 1.01},
    {EH_TYPE_Q5_0, "Q5_0", 32, 1.0 / 16 * 1.01},
    {EH_TYPE_Q4_1, "Q4_1", 32, 1.0 / 15 * 1.02},
    {EH_TYPE_Q5_1, "Q5_1", 32, 1.0 / 31 * 1.02},
    {EH_TYPE_Q4_K, "Q4_K", 256, 2.0 / 15},
    {EH_TYPE_Q5_K, "Q5_K", 256, 2.0 / 31},
    {EH_TYPE_Q6_K, "Q6_K", 256, 1.0 / 32 * 1.1},
    {EH_TYPE_MXFP4, "MXFP4", 32, 1.0 / 3},
};

class RoundTrip : public ::testing::TestWithParam<Bound> {};

}  // namespace

TEST_P(RoundTrip, ErrorWithinTheFormatsBound) {
    const Bound b = GetParam();
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const uint64_t n = 256 * 64;
    std::vector<float> x(n), y(n);
    for (auto& v : x) v = nd(rng);
    for (uint64_t i = 0; i < 256; ++i) x[i] = 0.0f;  // an all-zero block must survive exactly
    std::vector<uint8_t> q(ehp::quant::row_bytes(b.type, n));
    ASSERT_FALSE(q.empty());
    ASSERT_TRUE(ehp::quant::quantize_row(b.type, x.data(), q.data(), n));
    ASSERT_TRUE(ehp::quant::dequantize_row(b.type, q.data(), y.data(), n));
    double se = 0;
    for (uint64_t i = 0; i < 256; ++i) ASSERT_EQ(y[i], 0.0f);
    for (uint64_t blk = 0; blk < n / b.block; ++blk) {
        double amax = 0, worst = 0;
        for (uint32_t j = 0; j < b.block; ++j) {
            const uint64_t i = blk * b.block + j;
            amax = std::max(amax, double(std::fabs(x[i])));
            worst = std::max(worst, double(std::fabs(x[i] - y[i])));
            se += double(x[i] - y[i]) * (x[i] - y[i]);
        }
        ASSERT_LE(worst, b.max_rel * amax + 1e-6) << b.name << " block " << blk;
    }
    RecordProperty("rmse", std::to_string(std::sqrt(se / n)));
}

INSTANTIATE_TEST_SUITE_P(Types, RoundTrip, ::testing::ValuesIn(kBounds),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(QuantizeFile, Q8_0FromF16MatchesTheQ8_0Recipe) {
    TempDir d;
    ForgeOptions f{"tiny-gpt2-f16", d.file("f16.gguf"), 5, "", 2, {}};
    forge(f);
    QuantizeOptions q{f.out, d.file("q8.gguf"), parse_quant_target("Q8_0"), 2, {}};
    auto r = quantize_file(q);
    auto p = find_profile("tiny-gpt2-q8_0");
    EXPECT_EQ(r.census, census(p.tensors(p.n_vocab)));
    auto a = eh::model::ModelFile::open(f.out);
    auto b = eh::model::ModelFile::open(q.out);
    EXPECT_EQ(b->get_uint("general.file_type"), 7u);
    EXPECT_EQ(a->metadata().size(), b->metadata().size());
    EXPECT_EQ(b->get_string_array("tokenizer.ggml.tokens").size(), a->get_string_array("tokenizer.ggml.tokens").size());
    // values survive within Q8_0's bound
    const eh_tensor* ta = a->find_tensor("blk.1.ffn_up.weight");
    const eh_tensor* tb = b->find_tensor("blk.1.ffn_up.weight");
    ASSERT_EQ(tb->type, uint32_t(EH_TYPE_Q8_0));
    const uint64_t n = ta->dims[0] * ta->dims[1];
    std::vector<float> va(n), vb(n);
    ehp::quant::dequantize_row(ta->type, ta->data, va.data(), n);
    ehp::quant::dequantize_row(tb->type, tb->data, vb.data(), n);
    for (uint64_t i = 0; i < n; ++i) ASSERT_NEAR(va[i], vb[i], 0.1 * 0.02 / 2);
    // untouched tensors are copied byte for byte
    const eh_tensor* na = a->find_tensor("blk.0.attn_norm.weight");
    const eh_tensor* nb = b->find_tensor("blk.0.attn_norm.weight");
    ASSERT_EQ(na->nbytes, nb->nbytes);
    EXPECT_EQ(0, std::memcmp(na->data, nb->data, na->nbytes));
}

TEST(QuantizeFile, Q4_K_MRecipeThroughTheQuantizer) {
    TempDir d;
    ForgeOptions f{"tiny-phi-3-q4_k_m", d.file("mixed.gguf"), 5, "", 2, {}};
    forge(f);
    // back to F16, then to Q4_K_M again: the quantizer must land on the same mixture
    quantize_file({f.out, d.file("f16.gguf"), parse_quant_target("F16"), 2, {}});
    auto r = quantize_file({d.file("f16.gguf"), d.file("again.gguf"), parse_quant_target("Q4_K_M"), 2, {}});
    auto p = find_profile("tiny-phi-3-q4_k_m");
    EXPECT_EQ(r.census, census(p.tensors(p.n_vocab)));
    auto m = eh::model::ModelFile::open(d.file("again.gguf"));
    EXPECT_EQ(m->get_uint("general.file_type"), 15u);
    EXPECT_EQ(m->find_tensor("blk.0.attn_qkv.weight")->type, uint32_t(EH_TYPE_Q5_K));
}

TEST(QuantizeFile, RejectsBadInput) {
    TempDir d;
    EXPECT_THROW(quantize_file({d.file("missing.gguf"), d.file("o.gguf"), parse_quant_target("Q8_0"), 1, {}}), eh::Error);
}
