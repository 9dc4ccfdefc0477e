// The device sampler as a batched step runs it (adjust_logits, then
// sample_rows): each pipeline stage, and reproducibility.
#include <cmath>
#include <map>
#include <random>

#include <ehcuda/sampler.hpp>

#include "gpu_util.hpp"

namespace ehtest {
namespace {

// One row: a repetition penalty first over the distinct tokens given
// (adjust_logits, once, as the step applies it), then every draw through
// sample_rows with the row's own counter.
class Sampler {
public:
    explicit Sampler(const std::vector<float>& logits, const std::vector<int32_t>& repeated = {},
                     float penalty = 1.0f)
        : n_(int(logits.size())), logits_(to_device(logits)), params_(sizeof(ehcuda::SamplerParams)),
          counter_(8), fw_(logits.size() * 4), iw_(logits.size() * 4), out_(4) {
        cudaMemset(counter_.get(), 0, 8);
        if (repeated.empty()) return;
        ehcuda::RowEdits e;
        e.rep_end = int32_t(repeated.size());
        e.repetition_penalty = penalty;
        const auto rows = to_device(std::vector<ehcuda::RowEdits>{e});
        const auto tok = to_device(repeated);
        const auto val = to_device(std::vector<float>(repeated.size(), 0.0f));
        ehcuda::adjust_logits(logits_.as<float>(), n_, 1, n_, rows.as<ehcuda::RowEdits>(), tok.as<int32_t>(),
                              val.as<float>(), nullptr);
        cudaDeviceSynchronize();
    }
    void set(const ehcuda::SamplerParams& p) { cudaMemcpy(params_.get(), &p, sizeof p, cudaMemcpyHostToDevice); }
    int draw() {
        ehcuda::sample_rows(logits_.as<float>(), n_, 1, n_, params_.as<ehcuda::SamplerParams>(),
                            counter_.as<unsigned long long>(), {fw_.as<float>(), iw_.as<int32_t>()},
                            out_.as<int32_t>(), nullptr);
        return to_host<int32_t>(out_, 1)[0];
    }
    unsigned long long counter() { return to_host<unsigned long long>(counter_, 1)[0]; }

private:
    int n_;
    ehcuda::DeviceBuffer logits_, params_, counter_, fw_, iw_, out_;
};

std::vector<float> random_logits(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = nd(rng);
    return v;
}

TEST(DeviceSampler, GreedyIsArgmaxLowestIndexOnTies) {
    REQUIRE_GPU();
    auto l = random_logits(151936, 1);
    l[100] = 50.0f;
    l[90000] = 50.0f;
    Sampler s(l);
    s.set({});
    EXPECT_EQ(s.draw(), 100);
}

// Plain greedy over a large vocabulary goes through per-slice partial
// winners: ties across slices, the last element, NaNs and -inf must give
// what a host argmax (largest value, lowest index) gives.
TEST(DeviceSampler, GreedyOverSlicesMatchesHostArgmax) {
    REQUIRE_GPU();
    const int V = 151936;
    auto host_argmax = [](const std::vector<float>& v) {
        int bi = 0;
        bool any = false;
        for (size_t i = 0; i < v.size(); ++i)
            if (v[i] == v[i] && (!any || v[i] > v[static_cast<size_t>(bi)])) { bi = int(i); any = true; }
        return bi;
    };
    for (int c = 0; c < 5; ++c) {
        auto l = random_logits(V, 10 + c);
        if (c == 0) { l[70000] = 40.0f; l[3000] = 40.0f; l[150000] = 40.0f; }   // tie in three slices
        if (c == 1) l[V - 1] = 99.0f;                                           // the very last id
        if (c == 2) { for (int i = 0; i < V; i += 7) l[static_cast<size_t>(i)] = NAN; l[8] = 30.0f; }
        if (c == 3) { for (auto& x : l) x = -INFINITY; l[123456] = -1e30f; }
        if (c == 4) { for (int i = 0; i < 2000; ++i) l[static_cast<size_t>(i)] = NAN; }  // a whole slice of NaN
        Sampler s(l);
        s.set({});
        EXPECT_EQ(s.draw(), host_argmax(l)) << "case " << c;
        // A seeded draw, then plain greedy again, share the work buffers.
        ehcuda::SamplerParams hot;
        hot.temperature = 1.0f;
        s.set(hot);
        (void)s.draw();
        s.set({});
        EXPECT_EQ(s.draw(), host_argmax(l)) << "case " << c << " after a seeded draw";
    }
}

TEST(DeviceSampler, SeededDrawsRepeatExactly) {
    REQUIRE_GPU();
    auto l = random_logits(32000, 2);
    ehcuda::SamplerParams p;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.02f;
    p.seed = 42;
    std::vector<int> a, b, c;
    {
        Sampler s(l, {1, 2, 3}, 1.1f);
        s.set(p);
        for (int i = 0; i < 64; ++i) a.push_back(s.draw());
        EXPECT_EQ(s.counter(), 64u);
    }
    {
        Sampler s(l, {1, 2, 3}, 1.1f);
        s.set(p);
        for (int i = 0; i < 64; ++i) b.push_back(s.draw());
    }
    {
        p.seed = 43;
        Sampler s(l, {1, 2, 3}, 1.1f);
        s.set(p);
        for (int i = 0; i < 64; ++i) c.push_back(s.draw());
    }
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
}

TEST(DeviceSampler, TopKKeepsOnlyTheKBestAndFollowsSoftmax) {
    REQUIRE_GPU();
    std::vector<float> l(1000, -5.0f);
    l[10] = 2.0f;
    l[500] = 1.0f;
    l[999] = 0.0f;
    l[7] = -1.0f;
    Sampler s(l);
    ehcuda::SamplerParams p;
    p.temperature = 1.0f;
    p.top_k = 3;
    p.seed = 9;
    s.set(p);
    std::map<int, int> count;
    const int N = 3000;
    for (int i = 0; i < N; ++i) count[s.draw()]++;
    EXPECT_EQ(count.size(), 3u);
    const double z = std::exp(2.0) + std::exp(1.0) + 1.0;
    EXPECT_NEAR(count[10] / double(N), std::exp(2.0) / z, 0.04);
    EXPECT_NEAR(count[500] / double(N), std::exp(1.0) / z, 0.04);
    EXPECT_NEAR(count[999] / double(N), 1.0 / z, 0.04);
    p.top_k = 1;
    s.set(p);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(s.draw(), 10);
}

TEST(DeviceSampler, TopPAndMinPCut) {
    REQUIRE_GPU();
    // p ~ 0.5, 0.3, 0.2 (others negligible)
    std::vector<float> l(5000, -40.0f);
    l[3] = std::log(0.5f);
    l[4000] = std::log(0.3f);
    l[17] = std::log(0.2f);
    Sampler s(l);
    ehcuda::SamplerParams p;
    p.temperature = 1.0f;
    p.top_p = 0.7f;  // needs 0.5 + 0.3
    p.seed = 1;
    s.set(p);
    std::map<int, int> count;
    for (int i = 0; i < 500; ++i) count[s.draw()]++;
    EXPECT_EQ(count.size(), 2u);
    EXPECT_TRUE(count.count(3) && count.count(4000));
    p.top_p = 1.0f;
    p.min_p = 0.5f;  // keeps p >= 0.25: tokens 3 and 4000
    s.set(p);
    count.clear();
    for (int i = 0; i < 500; ++i) count[s.draw()]++;
    EXPECT_EQ(count.size(), 2u);
    EXPECT_FALSE(count.count(17));
}

// The repetition penalty divides a positive logit and multiplies a
// negative one, once per listed token (the step lists the distinct tokens
// of the sequence's window).
TEST(DeviceSampler, RepetitionPenaltyOncePerListedToken) {
    REQUIRE_GPU();
    std::vector<float> l(100, 0.0f);
    l[5] = 3.0f;
    l[6] = 2.0f;
    l[7] = -1.0f;
    {
        Sampler s(l, {5, 1}, 2.0f);  // 3 -> 1.5 < 2
        s.set({});
        EXPECT_EQ(s.draw(), 6);
    }
    {
        Sampler s(l, {1}, 2.0f);  // 5 is not listed (outside the window)
        s.set({});
        EXPECT_EQ(s.draw(), 5);
    }
    {
        // Once, not once per occurrence: 1.5 > 1.4; twice would be 0.75.
        std::vector<float> l2(100, -10.0f);
        l2[5] = 3.0f;
        l2[6] = 1.4f;
        Sampler s(l2, {5}, 2.0f);
        s.set({});
        EXPECT_EQ(s.draw(), 5);
        // A negative logit is multiplied: -1 -> -2, below the others' -1.5.
        std::vector<float> l3(100, -1.5f);
        l3[7] = -1.0f;
        Sampler n(l3, {7}, 2.0f);
        n.set({});
        EXPECT_NE(n.draw(), 7);
    }
}

}  // namespace
}  // namespace ehtest
