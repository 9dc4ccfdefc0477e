// --tensor-parallel / --gpus (host/cli/src/gpu_set.hpp): the list parser's
// accepted and refused forms, the choice of GPUs by free memory, and the fit
// check's verdict and message.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "eh/error.hpp"
#include "gpu_set.hpp"

namespace {

using namespace eh::cli;

std::vector<int> parsed(const std::string& s) {
    std::vector<int> out;
    std::string err;
    EXPECT_TRUE(parse_gpu_list(s, out, err)) << s << ": " << err;
    EXPECT_TRUE(err.empty());
    return out;
}

std::string refused(const std::string& s) {
    std::vector<int> out;
    std::string err;
    EXPECT_FALSE(parse_gpu_list(s, out, err)) << s;
    return err;
}

TEST(GpuList, OrdinalsInRankOrderRepeatsAllowed) {
    EXPECT_EQ(parsed("0"), std::vector<int>({0}));
    EXPECT_EQ(parsed("3,1"), std::vector<int>({3, 1}));
    EXPECT_EQ(parsed("0,0,0,0"), std::vector<int>({0, 0, 0, 0}));  // the shard mode
    EXPECT_EQ(parsed("63"), std::vector<int>({63}));
    EXPECT_EQ(parsed("0,1,2,3,4,5,6,7").size(), 8u);
}

TEST(GpuList, EveryBadFormIsRefusedNamingIt) {
    EXPECT_NE(refused("").find("--gpus is empty"), std::string::npos);
    EXPECT_NE(refused("0,,1").find("'' is not a GPU ordinal (0-63)"), std::string::npos);
    EXPECT_NE(refused("0,1,").find("'' is not a GPU ordinal"), std::string::npos);
    EXPECT_NE(refused("a").find("'a' is not a GPU ordinal"), std::string::npos);
    EXPECT_NE(refused("-1").find("'-1' is not a GPU ordinal"), std::string::npos);
    EXPECT_NE(refused("64").find("'64' is not a GPU ordinal"), std::string::npos);
    EXPECT_NE(refused(" 1").find("' 1' is not a GPU ordinal"), std::string::npos);
    EXPECT_NE(refused("1x").find("'1x' is not a GPU ordinal"), std::string::npos);
    EXPECT_NE(refused("99999999999999999999").find("is not a GPU ordinal"), std::string::npos);
    EXPECT_NE(refused("0,1,2,3,4,5,6,7,0").find("names more than 8 GPUs"), std::string::npos);
}

std::vector<GpuFacts> gpus(const std::vector<uint64_t>& free_gib) {
    std::vector<GpuFacts> g;
    for (size_t i = 0; i < free_gib.size(); ++i)
        g.push_back({int(i), true, "", "GPU-" + std::to_string(i), 141ull << 30, free_gib[i] << 30});
    return g;
}

TEST(PickGpus, MostFreeMemoryFirstTiesToTheLowerOrdinalInOrdinalOrder) {
    EXPECT_EQ(pick_gpus(gpus({10, 70, 40, 70}), 2), std::vector<int>({1, 3}));
    EXPECT_EQ(pick_gpus(gpus({10, 70, 40, 70}), 3), std::vector<int>({1, 2, 3}));
    EXPECT_EQ(pick_gpus(gpus({5, 5, 5}), 2), std::vector<int>({0, 1}));
    EXPECT_EQ(pick_gpus(gpus({5}), 1), std::vector<int>({0}));
    try {
        pick_gpus(gpus({5, 5}), 4);
        FAIL() << "4 of 2 GPUs picked";
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), eh::Code::InsufficientVram);
        EXPECT_STREQ(e.what(), "--tensor-parallel 4 needs 4 GPUs; the plugin can use 2");
    }
}

// A GPU the probe refuses (busy, full) is skipped, and the GPUs after it
// are still chosen by their own ordinal.
TEST(PickGpus, UnusableGpusAreSkippedNotTheEnd) {
    std::vector<GpuFacts> g = gpus({80, 10, 70, 60});
    g[0].usable = false;
    g[0].reason = "busy";
    EXPECT_EQ(pick_gpus(g, 2), std::vector<int>({2, 3}));
    EXPECT_EQ(find_gpu(g, 3)->free_bytes, 60ull << 30);
    EXPECT_EQ(find_gpu(g, 9), nullptr);
    EXPECT_THROW(pick_gpus(g, 4), eh::Error);
}

TEST(FitCheck, EachRankHoldsTheReplicatedWeightsAndItsShareNamingTheShortGpu) {
    FitNeed need;
    need.sharded_bytes = 38ull << 30;
    need.replicated_bytes = 2ull << 30;
    need.kv_bytes = 1ull << 30;
    need.kv_what = "one sequence of 4096 tokens";
    EXPECT_EQ(rank_share(need, 1), 41ull << 30);
    EXPECT_EQ(rank_share(need, 2), (2ull << 30) + (19ull << 30) + (1ull << 29));
    EXPECT_EQ(fit_shortfall(need, {0, 1}, gpus({22, 22})), "");
    // 21.5 GiB a rank: the replicated 2 GiB is not divided
    const std::string two = fit_shortfall(need, {0, 1}, gpus({30, 21}));
    EXPECT_EQ(two, "the model needs 38.0 GiB of weights split over the ranks + 2.0 GiB on every rank (embeddings, LM "
                   "head, norms) + 1.0 GiB of KV cache (one sequence of 4096 tokens), 21.5 GiB a rank over 2 ranks; GPU "
                   "1 (GPU-1) has 21.0 GiB free for 1 rank: 512.0 MiB short. Spread it over more GPUs (--tensor-parallel, "
                   "--gpus), or take a smaller quantization or context");
    // the shard mode: one GPU holds every rank's share, the replicated part twice
    EXPECT_NE(fit_shortfall(need, {0, 0}, gpus({42})).find("GPU 0 (GPU-0) has 42.0 GiB free for 2 ranks: 1.0 GiB short"),
              std::string::npos);
    EXPECT_EQ(fit_shortfall(need, {0, 0}, gpus({43})), "");
    // a probe that states no free memory is not judged
    EXPECT_EQ(fit_shortfall(need, {0, 1}, gpus({0, 0})), "");
}

}  // namespace

namespace {

struct Flags {
    bool ok;
    uint32_t tp = 0;
    std::vector<int> gpus;
    std::string err;
};

Flags flags(uint32_t tp, bool tp_given, const char* gpus, bool gpu_device_named = false) {
    Flags f{};
    const std::string g = gpus ? gpus : "";
    f.ok = eh::cli::check_gpu_flags(tp, tp_given, gpus ? &g : nullptr, gpu_device_named, f.tp, f.gpus, f.err);
    return f;
}

TEST(GpuFlags, RanksFromEitherFlagAndEveryConflictNamed) {
    EXPECT_TRUE(flags(1, false, nullptr).ok);
    Flags f = flags(2, true, nullptr);
    EXPECT_TRUE(f.ok);
    EXPECT_EQ(f.tp, 2u);
    EXPECT_TRUE(f.gpus.empty());
    f = flags(1, false, "0,2,3");  // --gpus alone gives the count
    EXPECT_TRUE(f.ok);
    EXPECT_EQ(f.tp, 3u);
    EXPECT_EQ(f.gpus, std::vector<int>({0, 2, 3}));
    EXPECT_TRUE(flags(2, true, "0,0").ok);
    EXPECT_EQ(flags(0, true, nullptr).err, "--tensor-parallel must be between 1 and 8");
    EXPECT_EQ(flags(9, true, nullptr).err, "--tensor-parallel must be between 1 and 8");
    EXPECT_EQ(flags(2, true, "0,1,2").err, "--tensor-parallel 2 but --gpus names 3 GPUs: one rank per GPU named");
    EXPECT_EQ(flags(1, false, "1", true).err, "--gpus and --gpu-device both name GPUs: use one (--gpus 2 is GPU 2 alone)");
    EXPECT_NE(flags(1, false, "x").err.find("'x' is not a GPU ordinal"), std::string::npos);
}

}  // namespace
