// Expert parallelism's foreign pairs (moe_expert_range.hpp): a rank holding
// experts [first, first + count) of a model's `total` marks every pair
// routed elsewhere -1 (weight 0), and each expert kernel a sharded step can
// reach skips it instead of computing it at weight 0. Checked here, on
// routings where about half of the pairs are foreign and every fourth token
// has no pair of the rank's:
//   - the marking (own pairs: local index, weight kept; foreign: -1, 0);
//   - the one-token kernels (moe_decode) give, per token, the bits of a call
//     over the token's own pairs alone (the foreign slots add no term);
//   - the grouped forms (integer: those same bits; tensor-core passes and
//     tiles), the float per-pair kernels (moe_gate_up / moe_down) and the
//     cuBLAS prefill (moe_prefill) against a double-precision host
//     reference over the own pairs;
//   - a token with no pair of the rank's adds exactly 0 (its rows stay h0);
//   - local expert 0, which no own pair is routed to, has NaN biases: any
//     form that still computed a foreign pair on it (the weight-0 scheme
//     points a token's foreign pairs at a local expert, local expert 0 for a
//     token with none of its own) would leave 0 * NaN = NaN in the sums.
// Then the timing at gpt-oss-20b's shape (printed, never asserted): one
// rank's expert calls against rank 0 of two, with the foreign pairs skipped
// and at weight 0.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernel_plan.hpp>
#include <ehcuda/moe.hpp>
#include <ehcuda/moe_expert_range.hpp>
#include <ehcuda/prefill_workspace.hpp>

#include "gpu_test_util.hpp"
#include "ops.hpp"  // cpu-reference building blocks

namespace {

using namespace gpttest;

struct SkipCase {
    uint32_t gu_type, down_type;
    int E, F, total, first, count, k;
    bool fused;
};
constexpr int kTokens = 64;  // (the prefill form's threshold or above)

std::string case_name(const ::testing::TestParamInfo<SkipCase>& i) {
    const SkipCase& c = i.param;
    return ehp::type_name(c.gu_type) + "_" + ehp::type_name(c.down_type) + "_k" + std::to_string(c.k) + "_experts" +
           std::to_string(c.first) + "of" + std::to_string(c.total) + (c.fused ? "_fused" : "_split");
}

// Per token k distinct experts of `total` in rank order (global ids) and
// weights summing to 1: token t % 4 == 0 none of [first, first + count),
// the others 1 .. min(k, count - 1) of them (never `first` itself, local
// expert 0), the rest foreign, the slots shuffled.
void route(std::mt19937& rng, const SkipCase& C, std::vector<int32_t>& ids, std::vector<float>& wts) {
    std::vector<int32_t> own, foreign;
    for (int e = 0; e < C.total; ++e) {
        if (e > C.first && e < C.first + C.count) own.push_back(e);
        else if (e < C.first || e >= C.first + C.count) foreign.push_back(e);
    }
    for (int t = 0; t < kTokens; ++t) {
        const int n_own = t % 4 == 0 ? 0 : 1 + t % std::min(C.k, int(own.size()));
        std::shuffle(own.begin(), own.end(), rng);
        std::shuffle(foreign.begin(), foreign.end(), rng);
        std::vector<int32_t> e(own.begin(), own.begin() + n_own);
        e.insert(e.end(), foreign.begin(), foreign.begin() + (C.k - n_own));
        std::shuffle(e.begin(), e.end(), rng);
        float sum = 0;
        std::vector<float> w(size_t(C.k));
        for (auto& v : w) sum += (v = 0.2f + float(rng() % 100) / 100.0f);
        for (int s = 0; s < C.k; ++s) {
            ids.push_back(e[size_t(s)]);
            wts.push_back(w[size_t(s)] / sum);
        }
    }
}

class MoeExpertSkipTest : public ::testing::TestWithParam<SkipCase> {};

TEST_P(MoeExpertSkipTest, ForeignPairsAreSkippedByEveryForm) {
    REQUIRE_GPU();
    const SkipCase C = GetParam();
    const int E = C.E, F = C.F, X = C.count, k = C.k, T = kTokens;
    ASSERT_GE(C.total - C.count, k) << "the case needs tokens with no pair of the rank's";
    std::mt19937 rng(C.gu_type * 11 + C.down_type + uint32_t(k) * 7 + uint32_t(C.first));
    // The rank's X local experts.
    const auto gu = random_quant_rows(C.gu_type, rng, size_t(X) * 2 * F, size_t(E));
    const auto dn = random_quant_rows(C.down_type, rng, size_t(X) * E, size_t(F));
    const auto guf = dequant_rows(C.gu_type, gu, size_t(X) * 2 * F, size_t(E));
    const auto dnf = dequant_rows(C.down_type, dn, size_t(X) * E, size_t(F));
    auto gub = randn(rng, size_t(X) * 2 * F, 0.1f), dnb = randn(rng, size_t(X) * E, 0.1f);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::fill(gub.begin(), gub.begin() + 2 * F, nan);  // local expert 0: no own pair is routed to it
    std::fill(dnb.begin(), dnb.begin() + E, nan);
    const auto x = randn(rng, size_t(T) * E);
    const auto h0 = randn(rng, size_t(T) * E);
    std::vector<int32_t> gids;
    std::vector<float> gwts;
    route(rng, C, gids, gwts);

    // The marking.
    auto dids = dev(gids), dwts = dev(gwts);
    ehcuda::moe_keep_expert_range(dids.as<int32_t>(), dwts.as<float>(), T, k, C.first, C.count, nullptr);
    const auto ids = host<int32_t>(dids, gids.size());
    const auto wts = host<float>(dwts, gwts.size());
    std::vector<int> n_own(size_t(T), 0);
    for (size_t i = 0; i < gids.size(); ++i) {
        const bool mine = gids[i] >= C.first && gids[i] < C.first + C.count;
        EXPECT_EQ(ids[i], mine ? gids[i] - C.first : -1) << "pair " << i;
        EXPECT_EQ(wts[i], mine ? gwts[i] : 0.0f) << "pair " << i;
        n_own[i / size_t(k)] += mine;
    }

    auto dgu = dev_rows(C.gu_type, gu, size_t(X) * 2 * F, E), ddn = dev_rows(C.down_type, dn, size_t(X) * E, F);
    auto dgub = dev(gub), ddnb = dev(dnb), dx = dev(x);
    const GateUp gate_up = gate_up_mats(C.gu_type, gu, dgu, C.fused, X, F, E, dgub.as<float>());
    const ehcuda::ExpertMat &g = gate_up.gate, &u = gate_up.up;
    const auto d = expert_mat(C.down_type, E, F, ddn.get(), E, ddnb.as<float>(), E);
    ASSERT_TRUE(ehcuda::moe_decode_supported(g, u, d, k));
    ASSERT_TRUE(ehcuda::moe_grouped_supported(g, u, d, k));

    // One token at a time, the marked slots; and over its own pairs alone.
    ehcuda::DeviceBuffer one(ehcuda::moe_decode_scratch_bytes(k, F));
    auto dh_dec = dev(h0), dh_own = dev(h0);
    std::vector<int32_t> own_ids(size_t(T) * k, 0);
    std::vector<float> own_wts(size_t(T) * k, 0.0f);
    for (int t = 0; t < T; ++t)
        for (int s = 0, j = 0; s < k; ++s)
            if (ids[size_t(t * k + s)] >= 0) {
                own_ids[size_t(t * k + j)] = ids[size_t(t * k + s)];
                own_wts[size_t(t * k + j)] = wts[size_t(t * k + s)];
                ++j;
            }
    auto down_ids = dev(own_ids), down_wts = dev(own_wts);
    for (int t = 0; t < T; ++t) {
        ehcuda::MoeDecodeArgs m;
        set_moe_call(m, k, dids.as<int32_t>() + size_t(t) * k, dwts.as<float>() + size_t(t) * k, g, u, d, one,
                     dh_dec.as<float>() + size_t(t) * E);
        m.x = dx.as<float>() + size_t(t) * E;
        ehcuda::moe_decode(m, nullptr);
        if (n_own[size_t(t)] == 0) continue;
        m.k = n_own[size_t(t)];
        m.ids = down_ids.as<int32_t>() + size_t(t) * k;
        m.weights = down_wts.as<float>() + size_t(t) * k;
        m.h = dh_own.as<float>() + size_t(t) * E;
        ehcuda::moe_decode(m, nullptr);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto dec = host<float>(dh_dec, h0.size()), dec_own = host<float>(dh_own, h0.size());
    EXPECT_EQ(std::memcmp(dec.data(), dec_own.data(), dec.size() * 4), 0)
        << "the one-token kernels' sums are not those of the own pairs alone";

    // The grouped forms.
    const size_t scratch_bytes = ehcuda::moe_grouped_scratch_bytes(T, k, X, E, F);
    ehcuda::DeviceBuffer scratch(scratch_bytes);
    auto grouped = [&](bool integer, int tile_tokens) {
        ehcuda::KernelPlan p = ehcuda::plan();
        p.moe_tile_pass_tokens = tile_tokens;
        const ehcuda::PlanScope scope(p);
        auto dh = dev(h0);
        ehcuda::MoeGroupedArgs a = grouped_args(dx.as<float>(), T, k, X, dids.as<int32_t>(), dwts.as<float>(), g, u, d,
                                                scratch, dh.as<float>());
        a.integer_path = integer;
        ehcuda::moe_grouped(a, nullptr);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return host<float>(dh, h0.size());
    };
    const auto integer = grouped(true, 65536);
    EXPECT_EQ(std::memcmp(integer.data(), dec.data(), dec.size() * 4), 0)
        << "the grouped integer form's sums differ from the one-token kernels'";
    const bool tensor_cores = ehcuda::moe_grouped_on_tensor_cores(g, u, d);
    const auto passes = grouped(false, 65536);
    const auto tiles = grouped(false, 0);

    // The float per-pair kernels.
    auto dh_float = dev(h0);
    ehcuda::DeviceBuffer act(size_t(T) * k * F * 4);
    ehcuda::moe_gate_up(dx.as<float>(), E, T, k, dids.as<int32_t>(), g, u, 1.702f, 7.0f, act.as<float>(), nullptr);
    ehcuda::moe_down(act.as<float>(), T, k, dids.as<int32_t>(), dwts.as<float>(), d, dh_float.as<float>(), E, nullptr);
    const auto flt = host<float>(dh_float, h0.size());

    // The cuBLAS prefill.
    std::vector<float> pre;
    {
        ehcuda::PrefillShape shape;
        shape.max_tokens = T;
        shape.max_cols = std::max(E, F);
        shape.moe_experts = X;
        shape.moe_k = k;
        shape.moe_embd = E;
        shape.moe_ff = F;
        ehcuda::PrefillWorkspace ws(shape, nullptr, nullptr);
        auto dh = dev(h0);
        ASSERT_TRUE(ehcuda::moe_prefill(&ws, dx.as<float>(), E, T, k, X, dids.as<int32_t>(), dwts.as<float>(), g, u, d,
                                        1.702f, 7.0f, dh.as<float>(), E, nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        pre = host<float>(dh, h0.size());
    }

    struct Form {
        const char* name;
        const std::vector<float>* out;
        double tol;  // relative to the token's largest |delta|
    };
    // (FP16 inputs and activations: ~2^-11 relative per element.)
    const Form forms[] = {{"one-token kernels", &dec, 2e-6},
                          {"grouped integer form", &integer, 2e-6},
                          {"grouped default form", &passes, tensor_cores ? 4e-3 : 2e-6},
                          {"grouped tile form", &tiles, 4e-3},
                          {"float per-pair kernels", &flt, 1e-5},
                          {"cuBLAS prefill", &pre, 1e-2}};
    for (const Form& f : forms) {
        size_t non_finite = 0;
        for (float v : *f.out) non_finite += !std::isfinite(v);
        EXPECT_EQ(non_finite, 0u) << f.name << ": a foreign pair was computed on the NaN-biased local expert 0";
    }
    for (int t = 0; t < T; ++t) {
        const size_t row = size_t(t) * E;
        if (n_own[size_t(t)] == 0) {
            for (const Form& f : forms)
                EXPECT_EQ(std::memcmp(f.out->data() + row, h0.data() + row, size_t(E) * 4), 0)
                    << f.name << ", token " << t << " (no pair of the rank's) added something";
            continue;
        }
        if (t % 8 != 1 && t != T - 1) continue;  // (the host reference for a sample)
        std::vector<double> delta(size_t(E), 0.0);
        for (int s = 0; s < k; ++s) {
            const int e = ids[size_t(t * k + s)];
            if (e < 0) continue;
            std::vector<float> a(static_cast<size_t>(F));
            for (int r = 0; r < F; ++r) {
                double gv = gub[size_t(e) * 2 * F + r], uv = gub[size_t(e) * 2 * F + F + r];
                for (int c = 0; c < E; ++c) {
                    gv += double(guf[(size_t(e) * 2 * F + r) * E + c]) * x[row + c];
                    uv += double(guf[(size_t(e) * 2 * F + F + r) * E + c]) * x[row + c];
                }
                a[size_t(r)] = cpuref::swiglu_oai(float(gv), float(uv), 1.702f, 7.0f);
            }
            for (int r = 0; r < E; ++r) {
                double y = dnb[size_t(e) * E + r];
                for (int c = 0; c < F; ++c) y += double(dnf[(size_t(e) * E + r) * F + c]) * a[size_t(c)];
                delta[size_t(r)] += wts[size_t(t * k + s)] * y;
            }
        }
        double mx = 1e-12;
        for (double v : delta) mx = std::max(mx, std::fabs(v));
        for (const Form& f : forms) {
            double err = 0;
            for (int r = 0; r < E; ++r)
                err = std::max(err, std::fabs(double((*f.out)[row + r]) - h0[row + r] - delta[size_t(r)]));
            EXPECT_LT(err / mx, f.tol) << f.name << ", token " << t << " (" << n_own[size_t(t)]
                                       << " own pairs): max |delta| " << mx;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeExpertSkipTest,
    ::testing::Values(
        // gpt-oss: top-4, rank 1 of 2 over 8 experts, and rank 0
        SkipCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 256, 192, 8, 4, 4, 4, true},
        SkipCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 256, 192, 8, 0, 4, 4, false},
        // Qwen3-MoE-like: top-8 (the 8-warp down kernel), K-quants on the tensor cores
        SkipCase{EH_TYPE_Q4_K, EH_TYPE_Q6_K, 256, 256, 24, 8, 8, 8, false}),
    case_name);

// gpt-oss-20b's experts (32 of 2880 x 2880, MXFP4, gate and up fused,
// top-4), rank 0 of 2 holding 16: one token (moe_decode) and a 64-row
// step (moe_grouped's default form), uniform routing. Times per call:
// one rank over all 32 experts; rank 0 and rank 1 with the foreign pairs
// skipped (their sum: the shard mode's expert time on one GPU); rank 0 and
// 1 with the foreign pairs at weight 0 on a local expert of the token's.
TEST(MoeExpertSkipTiming, Gpt20bRankCallsSkipAgainstWeightZero) {
    REQUIRE_GPU();
    constexpr int kE = 2880, kF = 2880, kX = 32, kK = 4, kHalf = kX / 2;
    const size_t gu_rb = ehcuda::moe_row_bytes(EH_TYPE_MXFP4, kE), dn_rb = ehcuda::moe_row_bytes(EH_TYPE_MXFP4, kF);
    ehcuda::DeviceBuffer gu(size_t(kX) * 2 * kF * gu_rb + 64), dn(size_t(kX) * kE * dn_rb + 64);
    // (any bytes are MXFP4 codes; 0x22's exponents keep the sums small)
    ASSERT_EQ(cudaMemset(gu.get(), 0x22, gu.size()), cudaSuccess);
    ASSERT_EQ(cudaMemset(dn.get(), 0x22, dn.size()), cudaSuccess);
    auto mats = [&](int first) {
        const auto* g0 = static_cast<const uint8_t*>(gu.get()) + size_t(first) * 2 * kF * gu_rb;
        const auto* d0 = static_cast<const uint8_t*>(dn.get()) + size_t(first) * kE * dn_rb;
        ehcuda::ExpertMat g = expert_mat(EH_TYPE_MXFP4, kF, kE, g0, 2 * kF);
        ehcuda::ExpertMat u = expert_mat(EH_TYPE_MXFP4, kF, kE, g0, 2 * kF, nullptr, 0, kF);
        ehcuda::ExpertMat d = expert_mat(EH_TYPE_MXFP4, kE, kF, d0, kE);
        return std::vector<ehcuda::ExpertMat>{g, u, d};
    };
    std::mt19937 rng(2880);
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    for (const int T : {1, 64}) {
        std::vector<int32_t> gids;
        for (int t = 0; t < T; ++t) {
            std::set<int32_t> picked;
            while (int(picked.size()) < kK) picked.insert(int32_t(rng() % kX));
            gids.insert(gids.end(), picked.begin(), picked.end());
        }
        const std::vector<float> gwts(gids.size(), 1.0f / kK);
        // rank r's ids: skipped (-1) or at weight 0 on the token's first own expert (0 if none)
        auto rank_ids = [&](int first, bool skip, std::vector<int32_t>& ids, std::vector<float>& wts) {
            ids = gids;
            wts = gwts;
            for (int t = 0; t < T; ++t) {
                int stand_in = 0;
                for (int s = 0; s < kK; ++s)
                    if (gids[size_t(t * kK + s)] >= first && gids[size_t(t * kK + s)] < first + kHalf) {
                        stand_in = gids[size_t(t * kK + s)] - first;
                        break;
                    }
                for (int s = 0; s < kK; ++s) {
                    const size_t i = size_t(t * kK + s);
                    if (gids[i] >= first && gids[i] < first + kHalf) {
                        ids[i] = gids[i] - first;
                    } else {
                        ids[i] = skip ? -1 : stand_in;
                        wts[i] = 0.0f;
                    }
                }
            }
        };
        const auto x = randn(rng, size_t(T) * kE, 0.1f);
        auto dx = dev(x);
        ehcuda::DeviceBuffer dh(size_t(T) * kE * 4);
        ehcuda::DeviceBuffer scratch(std::max(ehcuda::moe_grouped_scratch_bytes(T, kK, kX, kE, kF),
                                              ehcuda::moe_decode_scratch_bytes(kK, kF)));
        auto time_call = [&](int first, int n_expert, const std::vector<int32_t>& ids, const std::vector<float>& wts) {
            auto di = dev(ids), dw = dev(wts);
            const auto m = mats(first);
            auto call = [&] {
                if (T == 1) {
                    ehcuda::MoeDecodeArgs a;
                    set_moe_call(a, kK, di.as<int32_t>(), dw.as<float>(), m[0], m[1], m[2], scratch, dh.as<float>());
                    a.x = dx.as<float>();
                    ehcuda::moe_decode(a, nullptr);
                } else {
                    ehcuda::MoeGroupedArgs a = grouped_args(dx.as<float>(), T, kK, n_expert, di.as<int32_t>(),
                                                            dw.as<float>(), m[0], m[1], m[2], scratch, dh.as<float>());
                    ehcuda::moe_grouped(a, nullptr);
                }
            };
            for (int i = 0; i < 5; ++i) call();
            constexpr int kReps = 50;
            cudaEventRecord(t0);
            for (int i = 0; i < kReps; ++i) call();
            cudaEventRecord(t1);
            EXPECT_EQ(cudaEventSynchronize(t1), cudaSuccess);
            float ms = 0;
            cudaEventElapsedTime(&ms, t0, t1);
            return 1000.0 * ms / kReps;
        };
        std::vector<int32_t> ids;
        std::vector<float> wts;
        const double one_rank = time_call(0, kX, gids, gwts);
        double skip[2], zero[2];
        for (int r = 0; r < 2; ++r) {
            rank_ids(r * kHalf, true, ids, wts);
            skip[r] = time_call(r * kHalf, kHalf, ids, wts);
            rank_ids(r * kHalf, false, ids, wts);
            zero[r] = time_call(r * kHalf, kHalf, ids, wts);
        }
        std::printf("[expert skip timing] gpt-oss-20b experts, %d token(s) (%s): one rank %.1f us; "
                    "rank 0 / rank 1 of 2, foreign pairs skipped %.1f / %.1f us (sum %.1f), at weight 0 %.1f / %.1f us "
                    "(sum %.1f)\n",
                    T, T == 1 ? "moe_decode" : "moe_grouped", one_rank, skip[0], skip[1], skip[0] + skip[1], zero[0],
                    zero[1], zero[0] + zero[1]);
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
}

}  // namespace
