// The grouped MoE's tensor-core passes at gpt-oss-20b's shape (32 MXFP4
// experts of 2880 x 2880, gate and up fused, top-4) in the calls of a
// decode step of 64 and 256 sequences, through each variant of the passes
// the plan selects (8- or 16-token passes where the experts average a few
// tokens): every variant gives the default's bits (the arithmetic of a
// (row, token) is the same), and the log line per variant gives the call's
// time, so one run on a GPU compares them. Then a 384-token call (48 an
// expert: a prefill chunk below the tile form) in 64-token gate|up passes
// and in 32-token ones, timed only (the 64-token pass splits K two ways:
// other sums).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernel_plan.hpp>
#include <ehcuda/moe.hpp>

#include "gpu_test_util.hpp"

namespace {

using namespace gpttest;

constexpr int kE = 2880, kF = 2880, kX = 32, kK = 4;

// Each token's kK distinct experts: uniform, or skewed (expert e drawn with
// weight 0.85^e, as a router that favours a few experts).
void route(std::mt19937& rng, int ntok, bool skewed, std::vector<int32_t>& ids, std::vector<float>& wts) {
    std::vector<double> w(kX);
    for (int e = 0; e < kX; ++e) w[size_t(e)] = skewed ? std::pow(0.85, e) : 1.0;
    ids.clear();
    wts.clear();
    for (int t = 0; t < ntok; ++t) {
        std::set<int32_t> picked;
        while (int(picked.size()) < kK) {
            std::discrete_distribution<int> d(w.begin(), w.end());
            picked.insert(d(rng));
        }
        for (int32_t e : picked) {
            ids.push_back(e);
            wts.push_back(1.0f / kK);
        }
    }
}

struct Variant {
    const char* name;
    int pass_tokens;  // KernelPlan::moe_decode_pass_tokens
    int long_tokens;  // KernelPlan::moe_long_pass_tokens
    bool same_bits;   // as the first variant's
};

// The mean time of one call, after a few to warm up.
double call_us(const ehcuda::MoeGroupedArgs& a) {
    constexpr int kWarm = 3, kReps = 20;
    for (int i = 0; i < kWarm; ++i) ehcuda::moe_grouped(a, nullptr);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, nullptr);
    for (int i = 0; i < kReps; ++i) ehcuda::moe_grouped(a, nullptr);
    cudaEventRecord(e1, nullptr);
    EXPECT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1000.0 * ms / kReps;
}

TEST(MoePassTiming, GptOss20bDecodeStepVariantsSameBits) {
    REQUIRE_GPU();
    std::mt19937 rng(47);
    const auto gu = random_quant_rows(EH_TYPE_MXFP4, rng, size_t(kX) * 2 * kF, kE);
    const auto dn = random_quant_rows(EH_TYPE_MXFP4, rng, size_t(kX) * kE, kF);
    auto dgu = dev_rows(EH_TYPE_MXFP4, gu, size_t(kX) * 2 * kF, kE);
    auto ddn = dev_rows(EH_TYPE_MXFP4, dn, size_t(kX) * kE, kF);
    const auto gub = randn(rng, size_t(kX) * 2 * kF, 0.1f), dnb = randn(rng, size_t(kX) * kE, 0.1f);
    auto dgub = dev(gub), ddnb = dev(dnb);

    const auto g = expert_mat(EH_TYPE_MXFP4, kF, kE, dgu.get(), 2 * kF, dgub.as<float>(), 2 * kF);
    const auto u = expert_mat(EH_TYPE_MXFP4, kF, kE, dgu.get(), 2 * kF, dgub.as<float>() + kF, 2 * kF, kF);
    const auto d = expert_mat(EH_TYPE_MXFP4, kE, kF, ddn.get(), kE, ddnb.as<float>(), kE);
    ASSERT_TRUE(ehcuda::moe_grouped_on_tensor_cores(g, u, d));
    const double expert_mb = double(g.expert_stride + d.expert_stride) / 1e6;

    const std::vector<Variant> decode = {{"8-token passes", 8, 32, true}, {"16-token passes", 16, 32, true}};
    const std::vector<Variant> prefill = {{"64-token gate|up passes", 16, 32, true},
                                          {"32-token gate|up passes", 16, 65536, false}};
    for (const int T : {64, 256, 384}) {
        const std::vector<Variant>& variants = T == 384 ? prefill : decode;
        for (const bool skewed : {false, true}) {
            if (T == 384 && skewed) continue;
            std::vector<int32_t> ids;
            std::vector<float> wts;
            route(rng, T, skewed, ids, wts);
            std::vector<int> count(kX, 0);
            for (int32_t e : ids) ++count[size_t(e)];
            int used = 0, most = 0, passes8 = 0, passes16 = 0;
            for (int c : count) {
                used += c > 0;
                most = std::max(most, c);
                passes8 += (c + 7) / 8;
                passes16 += (c + 15) / 16;
            }
            const auto x = randn(rng, size_t(T) * kE), h0 = randn(rng, size_t(T) * kE);
            auto dx = dev(x), dids = dev(ids), dwts = dev(wts), dh = dev(h0);
            ehcuda::DeviceBuffer scratch(ehcuda::moe_grouped_scratch_bytes(T, kK, kX, kE, kF));
            const ehcuda::MoeGroupedArgs a = grouped_args(dx.as<float>(), T, kK, kX, dids.as<int32_t>(),
                                                          dwts.as<float>(), g, u, d, scratch, dh.as<float>());
            std::printf("[moe-pass-timing] %d tokens, %s routing: %d experts used, at most %d tokens, %d passes of 8, "
                        "%d of 16\n",
                        T, skewed ? "skewed" : "uniform", used, most, passes8, passes16);
            std::vector<float> want;
            for (const Variant& v : variants) {
                ehcuda::KernelPlan p = ehcuda::plan();
                p.moe_tile_pass_tokens = 65536;  // the passes, whatever the step size
                p.moe_decode_pass_tokens = v.pass_tokens;
                p.moe_long_pass_tokens = v.long_tokens;
                const ehcuda::PlanScope scope(p);
                cudaMemcpy(dh.get(), h0.data(), h0.size() * 4, cudaMemcpyHostToDevice);
                ehcuda::moe_grouped(a, nullptr);
                const auto got = host<float>(dh, h0.size());
                if (want.empty()) want = got;
                if (v.same_bits) {
                    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
                        << v.name << ": other bits than " << variants[0].name << " (" << T << " tokens)";
                }
                const double us = call_us(a);
                std::printf("[moe-pass-timing] %d tokens, %s: %-22s %8.1f us a call, %6.2f TB/s of the used experts' "
                            "bytes\n",
                            T, skewed ? "skewed " : "uniform", v.name, us, used * expert_mb / us);
            }
        }
    }
}

}  // namespace
