// The grouped MoE kernels of batched decode steps (moe_grouped): the
// integer form against the single-token kernels (moe_decode, one token at a
// time: the same integer sums in the same order, so the same bits), both
// forms (MXFP4's default is the tensor-core one) against a double-precision
// host reference: MXFP4 (gpt-oss) and K-quant experts (Q4_K and Q6_K on
// the tensor cores too), fused and separate
// gate/up, routings that leave experts empty and one that sends every token
// to the same expert (more tokens than one pass); the tensor-core form's
// 8-token, wide (32 tokens; 48 for the K-quants) and 64-token passes on every case
// (MXFP4's 16-token passes the same bits as the 8-token ones, and a
// pipeline depth the same bits as another); the tile form (any type) on every case, and a token's tile-form result the same bits
// whether its call holds all the case's tokens or only the first half;
// bitwise reproducibility; what moe_grouped_supported refuses.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernel_plan.hpp>
#include <ehcuda/moe.hpp>

#include "gpu_test_util.hpp"
#include "ops.hpp"  // cpu-reference building blocks

namespace {

using namespace gpttest;

struct GroupedCase {
    uint32_t gu_type, down_type;
    int E, F, X, k, ntok;
    bool fused, skewed;  // skewed: every token's first choice is expert 0
};

std::string case_name(const ::testing::TestParamInfo<GroupedCase>& i) {
    const GroupedCase& c = i.param;
    return ehp::type_name(c.gu_type) + "_" + ehp::type_name(c.down_type) + "_E" + std::to_string(c.E) + "_F" +
           std::to_string(c.F) + "_k" + std::to_string(c.k) + "_T" + std::to_string(c.ntok) +
           (c.fused ? "_fused" : "_split") + (c.skewed ? "_skewed" : "_random");
}

class MoeGroupedTest : public ::testing::TestWithParam<GroupedCase> {};

// Q4_K super-blocks a quantizer seldom writes, which the tensor-core form
// handles apart: sub-block 0 with a zero scale (every 7th super-block: its
// values are -dmin m whatever the codes) and d the smallest FP16 (every
// 11th: the minimum's term dwarfs the codes' beyond FP16's range).
void add_degenerate_q4k(std::vector<uint8_t>& b) {
    for (size_t sb = 0; sb * 144 < b.size(); ++sb) {
        uint8_t* p = b.data() + sb * 144;
        if (sb % 7 == 3) p[4] &= 0xC0;  // scale 0 of sub-block 0 (bits 6-7 belong to sub-block 4)
        if (sb % 11 == 5) p[0] = 1, p[1] = 0;  // d = 2^-24
    }
}

TEST_P(MoeGroupedTest, MatchesSingleTokenKernelsAndHostReference) {
    REQUIRE_GPU();
    const GroupedCase C = GetParam();
    const int E = C.E, F = C.F, X = C.X, k = C.k, T = C.ntok;
    std::mt19937 rng(C.gu_type * 5 + C.down_type + uint32_t(T) * 17 + uint32_t(k));
    auto gu = random_quant_rows(C.gu_type, rng, size_t(X) * 2 * F, size_t(E));
    auto dn = random_quant_rows(C.down_type, rng, size_t(X) * E, size_t(F));
    if (C.gu_type == EH_TYPE_Q4_K) add_degenerate_q4k(gu);
    if (C.down_type == EH_TYPE_Q4_K) add_degenerate_q4k(dn);
    const auto guf = dequant_rows(C.gu_type, gu, size_t(X) * 2 * F, size_t(E));
    const auto dnf = dequant_rows(C.down_type, dn, size_t(X) * E, size_t(F));
    const auto gub = randn(rng, size_t(X) * 2 * F, 0.1f), dnb = randn(rng, size_t(X) * E, 0.1f);
    const auto x = randn(rng, size_t(T) * E);   // the normalised inputs
    const auto h0 = randn(rng, size_t(T) * E);  // the residual stream
    // per token k distinct experts in rank order, weights summing to 1
    std::vector<int32_t> ids;
    std::vector<float> wts;
    for (int t = 0; t < T; ++t) {
        std::vector<int32_t> e(static_cast<size_t>(X));
        for (int i = 0; i < X; ++i) e[size_t(i)] = i;
        std::shuffle(e.begin(), e.end(), rng);
        if (C.skewed) std::iter_swap(e.begin(), std::find(e.begin(), e.end(), 0));
        float sum = 0;
        std::vector<float> w(static_cast<size_t>(k));
        for (auto& v : w) sum += (v = 0.2f + float(rng() % 100) / 100.0f);
        for (int s = 0; s < k; ++s) {
            ids.push_back(e[size_t(s)]);
            wts.push_back(w[size_t(s)] / sum);
        }
    }

    auto dgu = dev_rows(C.gu_type, gu, size_t(X) * 2 * F, E), ddn = dev_rows(C.down_type, dn, size_t(X) * E, F);
    auto dgub = dev(gub), ddnb = dev(dnb), dx = dev(x), dids = dev(ids), dwts = dev(wts);
    const GateUp gate_up = gate_up_mats(C.gu_type, gu, dgu, C.fused, X, F, E, dgub.as<float>());
    const ehcuda::ExpertMat &g = gate_up.gate, &u = gate_up.up;
    const auto d = expert_mat(C.down_type, E, F, ddn.get(), E, ddnb.as<float>(), E);
    ASSERT_TRUE(ehcuda::moe_grouped_supported(g, u, d, k));

    const size_t scratch_bytes = ehcuda::moe_grouped_scratch_bytes(T, k, X, E, F);
    ASSERT_GT(scratch_bytes, 0u);
    ehcuda::DeviceBuffer scratch(scratch_bytes);
    auto dh = dev(h0);
    ehcuda::MoeGroupedArgs a =
        grouped_args(dx.as<float>(), T, k, X, dids.as<int32_t>(), dwts.as<float>(), g, u, d, scratch, dh.as<float>());
    a.integer_path = true;
    // "default" below is the form below the tile threshold; the tiles are
    // forced apart
    ehcuda::KernelPlan no_tiles = ehcuda::plan();
    no_tiles.moe_tile_pass_tokens = 65536;
    const ehcuda::PlanScope default_scope(no_tiles);
    ehcuda::moe_grouped(a, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = host<float>(dh, size_t(T) * E);
    // The default form (MXFP4: the tensor cores, FP16 inputs).
    auto dh_def = dev(h0);
    ehcuda::MoeGroupedArgs ad = a;
    ad.integer_path = false;
    ad.h = dh_def.as<float>();
    ehcuda::moe_grouped(ad, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got_def = host<float>(dh_def, size_t(T) * E);
    const bool fp16_inputs = ehcuda::moe_grouped_on_tensor_cores(g, u, d);
    const bool kquant_tc = fp16_inputs && C.gu_type != EH_TYPE_MXFP4;
    EXPECT_EQ(kquant_tc, (C.gu_type == EH_TYPE_Q4_K || C.gu_type == EH_TYPE_Q6_K) &&
                             (C.down_type == EH_TYPE_Q4_K || C.down_type == EH_TYPE_Q6_K || C.down_type == EH_TYPE_MXFP4))
        << "the K-quants with a tensor-core form";
    // The tensor-core form with each pass length (8 tokens; wide: 32, or 48
    // for the K-quants; and, for MXFP4's gate|up, 64) and pipeline depth,
    // forced through the plan whatever the case's own; MXFP4 also 16-token
    // passes (KernelPlan::moe_decode_pass_tokens), the same bits as the
    // 8-token passes: the same sums of a (row, token) in the same order. The
    // pipeline's depth (moe_deep_pipeline) changes no sum either.
    std::vector<std::pair<std::string, std::vector<float>>> passes;
    if (fp16_inputs) {
        for (const auto& [name, wide, long_, deep, pass_tokens] :
             {std::tuple{"8-token passes", 65536, 65536, true, 8}, std::tuple{"wide passes", 0, 65536, true, 8},
              std::tuple{"64-token passes", 0, 0, true, 8}, std::tuple{"wide passes, 3 stages", 0, 65536, false, 8},
              std::tuple{"64-token passes, 3 stages", 0, 0, false, 8},
              std::tuple{"16-token passes", 65536, 65536, true, 16}}) {
            ehcuda::KernelPlan p = no_tiles;
            p.moe_wide_pass_tokens = wide;
            p.moe_long_pass_tokens = long_;
            p.moe_deep_pipeline = deep;
            p.moe_decode_pass_tokens = pass_tokens;
            ehcuda::PlanScope scope(p);
            auto dhp = dev(h0);
            ehcuda::MoeGroupedArgs ap = ad;
            ap.h = dhp.as<float>();
            ehcuda::moe_grouped(ap, nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            passes.emplace_back(name, host<float>(dhp, got_def.size()));
        }
        auto same = [&](const char* a, const char* b) {
            const std::vector<float>*pa = nullptr, *pb = nullptr;
            for (const auto& [name, out] : passes) {
                if (name == a) pa = &out;
                if (name == b) pb = &out;
            }
            ASSERT_TRUE(pa && pb);
            EXPECT_EQ(std::memcmp(pa->data(), pb->data(), pa->size() * 4), 0) << b << ": other bits than " << a;
        };
        same("8-token passes", "16-token passes");
        same("wide passes", "wide passes, 3 stages");
        same("64-token passes", "64-token passes, 3 stages");
    }

    // The tile form (every type), on all the tokens and on the first half alone.
    std::vector<float> tiled, tiled_half;
    {
        ehcuda::KernelPlan p = no_tiles;
        p.moe_tile_pass_tokens = 0;
        const ehcuda::PlanScope scope(p);
        auto dht = dev(h0);
        ehcuda::MoeGroupedArgs at = ad;
        at.h = dht.as<float>();
        ehcuda::moe_grouped(at, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        tiled = host<float>(dht, got_def.size());
        auto dhh = dev(h0);
        at.h = dhh.as<float>();
        at.ntok = std::max(1, T / 2);
        ehcuda::moe_grouped(at, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        tiled_half = host<float>(dhh, size_t(at.ntok) * E);
        EXPECT_EQ(std::memcmp(tiled.data(), tiled_half.data(), tiled_half.size() * 4), 0)
            << "a token's tile-form result depends on the other tokens of its call";
        auto dh2 = dev(h0);
        at.ntok = T;
        at.h = dh2.as<float>();
        ehcuda::moe_grouped(at, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(std::memcmp(host<float>(dh2, tiled.size()).data(), tiled.data(), tiled.size() * 4), 0)
            << "the tile form is not reproducible";
        // one_form keeps a call to the default form whatever the plan says
        auto dh1f = dev(h0);
        at.h = dh1f.as<float>();
        at.one_form = true;
        ehcuda::moe_grouped(at, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(std::memcmp(host<float>(dh1f, got_def.size()).data(), got_def.data(), got_def.size() * 4), 0)
            << "one_form took the tiles";
    }
    passes.emplace_back("tile form", tiled);

    // One token at a time through the single-token kernels.
    auto dh1 = dev(h0);
    ehcuda::DeviceBuffer one(ehcuda::moe_decode_scratch_bytes(k, F));
    for (int t = 0; t < T; ++t) {
        ehcuda::MoeDecodeArgs m;
        set_moe_call(m, k, dids.as<int32_t>() + size_t(t) * k, dwts.as<float>() + size_t(t) * k, g, u, d, one,
                     dh1.as<float>() + size_t(t) * E);
        m.x = dx.as<float>() + size_t(t) * E;
        ehcuda::moe_decode(m, nullptr);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto want = host<float>(dh1, size_t(T) * E);
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << "of " << got.size() << " outputs differ from the single-token kernels'";

    // Host reference in double for the first, a middle and the last token.
    for (int t : {0, T / 2, T - 1}) {
        std::vector<double> delta(size_t(E), 0.0);
        for (int s = 0; s < k; ++s) {
            const int e = ids[size_t(t * k + s)];
            std::vector<float> act(static_cast<size_t>(F));
            for (int r = 0; r < F; ++r) {
                double gv = gub[size_t(e) * 2 * F + r], uv = gub[size_t(e) * 2 * F + F + r];
                for (int c = 0; c < E; ++c) {
                    gv += double(guf[(size_t(e) * 2 * F + r) * E + c]) * x[size_t(t) * E + c];
                    uv += double(guf[(size_t(e) * 2 * F + F + r) * E + c]) * x[size_t(t) * E + c];
                }
                act[size_t(r)] = cpuref::swiglu_oai(float(gv), float(uv), 1.702f, 7.0f);
            }
            for (int r = 0; r < E; ++r) {
                double y = dnb[size_t(e) * E + r];
                for (int c = 0; c < F; ++c) y += double(dnf[(size_t(e) * E + r) * F + c]) * act[size_t(c)];
                delta[size_t(r)] += wts[size_t(t * k + s)] * y;
            }
        }
        double mx = 1e-12, err = 0, err_def = 0;
        for (int r = 0; r < E; ++r) {
            const size_t i = size_t(t) * E + r;
            mx = std::max(mx, std::fabs(delta[size_t(r)]));
            err = std::max(err, std::fabs(double(got[i]) - h0[i] - delta[size_t(r)]));
            err_def = std::max(err_def, std::fabs(double(got_def[i]) - h0[i] - delta[size_t(r)]));
        }
        EXPECT_LT(err / mx, 2e-6) << "integer form, token " << t << ": max |delta| " << mx;
        // FP16 inputs and activations: ~2^-11 relative per element.
        EXPECT_LT(err_def / mx, fp16_inputs ? 4e-3 : 2e-6) << "default form, token " << t << ": max |delta| " << mx;
        for (const auto& [name, out] : passes) {
            double e = 0;
            for (int r = 0; r < E; ++r) {
                const size_t i = size_t(t) * E + r;
                e = std::max(e, std::fabs(double(out[i]) - h0[i] - delta[size_t(r)]));
            }
            EXPECT_LT(e / mx, 4e-3) << name << ", token " << t << ": max |delta| " << mx;
        }
        std::printf("[moe-grouped] token %d: max |error| / max |delta|: integer %.2e, default %.2e\n", t, err / mx,
                    err_def / mx);
    }

    // Same inputs, same bits, in both forms.
    auto dh2 = dev(h0);
    a.h = dh2.as<float>();
    ehcuda::moe_grouped(a, nullptr);
    EXPECT_EQ(std::memcmp(host<float>(dh2, got.size()).data(), got.data(), got.size() * 4), 0);
    auto dh3 = dev(h0);
    ad.h = dh3.as<float>();
    ehcuda::moe_grouped(ad, nullptr);
    EXPECT_EQ(std::memcmp(host<float>(dh3, got.size()).data(), got_def.data(), got.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Types, MoeGroupedTest,
    ::testing::Values(
        // gpt-oss-20b's shape: top-4 of 32, a 64-sequence step
        GroupedCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 2880, 2880, 32, 4, 64, true, false},
        GroupedCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 2880, 2880, 32, 4, 2, true, false},
        GroupedCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 320, 96, 6, 3, 21, false, true},
        GroupedCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 96, 96, 4, 1, 9, true, true},
        // tens of tokens per expert: the 32- and 64-token passes, a partial last one
        GroupedCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 320, 96, 4, 2, 100, false, true},
        GroupedCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 2880, 2880, 32, 4, 200, true, false},
        // a 512-token prefill pass: 64 tokens per expert, the 64-token passes
        GroupedCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 2880, 2880, 32, 4, 512, true, false},
        // one expert holds 200 tokens where the average is 12.5: 7 passes of
        // 32 (25 of 8) side by side
        GroupedCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 320, 96, 32, 2, 200, false, true},
        // K-quant experts: Q4_K and Q6_K on the tensor cores (Q6_K rows of
        // 256 and 768 columns are 210 and 630 bytes, not 16-byte aligned)
        GroupedCase{EH_TYPE_Q4_K, EH_TYPE_Q6_K, 512, 256, 16, 8, 12, false, false},
        // Qwen3-30B-A3B's expert rows (768 x 2048, fewer experts): a decode
        // step's few tokens an expert, and a prefill pass's 48-token passes
        GroupedCase{EH_TYPE_Q4_K, EH_TYPE_Q6_K, 2048, 768, 24, 8, 24, false, false},
        GroupedCase{EH_TYPE_Q4_K, EH_TYPE_Q4_K, 2048, 768, 16, 4, 256, false, false},
        GroupedCase{EH_TYPE_Q6_K, EH_TYPE_Q6_K, 512, 256, 8, 2, 100, true, true},
        GroupedCase{EH_TYPE_Q6_K, EH_TYPE_Q4_K, 1024, 768, 6, 3, 40, false, true},
        // the integer form only
        GroupedCase{EH_TYPE_Q8_0, EH_TYPE_Q4_0, 512, 256, 8, 2, 33, true, true},
        GroupedCase{EH_TYPE_Q5_K, EH_TYPE_Q6_K, 512, 256, 8, 2, 17, false, false}),
    case_name);

TEST(MoeGrouped, SupportedOnlyWhereTheSingleTokenKernelsAre) {
    ehcuda::ExpertMat g;
    g.type = EH_TYPE_MXFP4;
    g.rows = 64;
    g.cols = 96;
    ehcuda::ExpertMat u = g, d;
    d.type = EH_TYPE_MXFP4;
    d.rows = 96;
    d.cols = 64;
    EXPECT_TRUE(ehcuda::moe_grouped_supported(g, u, d, 4));
    EXPECT_FALSE(ehcuda::moe_grouped_supported(g, u, d, 33)) << "more slots than moe_route ranks";
    d.rows = 128;
    EXPECT_FALSE(ehcuda::moe_grouped_supported(g, u, d, 4)) << "down must map back to gate's columns";
    d.rows = 96;
    g.type = u.type = EH_TYPE_F16;
    EXPECT_FALSE(ehcuda::moe_grouped_supported(g, u, d, 4)) << "no integer path for F16 experts";
    EXPECT_EQ(ehcuda::moe_grouped_scratch_bytes(0, 4, 32, 2880, 2880), 0u);
    EXPECT_GT(ehcuda::moe_grouped_scratch_bytes(64, 4, 32, 2880, 2880), 0u);
}

}  // namespace
