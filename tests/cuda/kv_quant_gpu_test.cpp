// The CUDA plugins' quantized KV cache (kv_init's kv_type Q8_0 / FP8_E4M3,
// issue 50) on forged tiny files: against the CPU reference with the same cache
// type and against its own F16 cache, in one scenario that runs every
// attention path of the batched step on a quantized pool:
//   - sequence A's prompt in chunks of 100 tokens (the tensor-core prefill,
//     ehcuda::kStepTensorCoreChunk and up),
//   - A's decode rows beside B's 24-token prompt chunks (the paged
//     attention, mixed steps),
//   - A and B decoding alone (decode-only steps: the fused decode kernel,
//     which quantizes the new K and V itself; graphs captured and replayed),
//   - past attn_group_min_keys keys (256 here by load option) the deep
//     decode steps (the query-group tensor-core kernel); gpt-cuda takes
//     that kernel for every step whose heads it fits, with its sinks.
// Teacher-forced: every step's tokens are fixed, A's logits kept after each
// step. Also: the pool holds about twice the F16 pool's tokens in the same
// bytes, a parked quantized prefix comes back bit for bit, and the types the
// plugin does not store are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <engine_host/kv_blocks.hpp>

#include "forged_profile.hpp"
#include "plugin_pair.hpp"
#include "pool_shape.hpp"
#include "step_seq.hpp"

namespace {

const eh_plugin_api* llama_api() { return ehtest::llama_cuda_api(); }
const eh_plugin_api* gpt_api() {
#ifdef EH_GPT_CUDA_PLUGIN
    return ehtest::gpt_cuda_api();
#else
    return nullptr;
#endif
}

const eh_plugin_api* cpu_api() { return ehtest::cpu_reference_api(); }

#define REQUIRE_BOTH() REQUIRE_PLUGIN_PAIR(llama_api(), "llama-cuda plugin not loadable")

// A forged profile (synthetic vocabulary), made once per process.
const eh_model_view* view_of(const std::string& profile) {
    return &ehtest::forged_file("kv_quant_test", profile, 23).view();
}

// Deep decode steps (the query-group kernel) from 256 keys on.
constexpr const char* kOptions = R"({"kernels": {"attn_group_min_keys": 256}})";
constexpr uint32_t kPromptA = 200, kPromptB = 120, kChunkA = 100, kChunkB = 24, kDecodes = 80;

ehtest::KvShape shape(uint32_t kv_type, uint64_t budget = 64ull << 20) {
    return ehtest::pool_shape(4, 512, 256, budget, kv_type);
}

using ehtest::tokens_of;
uint32_t vocab_of(const eh_plugin_api* api, const eh_model* m) { return ehtest::vocab_size(api, m); }

// The scenario of the file comment on `api` with `kv_type`: A's logits after
// each of its kDecodes teacher-forced decode steps (empty on a failure).
std::vector<std::vector<float>> run_scenario(const eh_plugin_api* api, const std::string& profile, uint32_t kv_type) {
    ehtest::StepModel m(api, view_of(profile), shape(kv_type), api == llama_api() ? kOptions : nullptr, profile.c_str());
    EXPECT_TRUE(m.ok()) << m.failure;
    if (!m.ok()) return {};
    EXPECT_EQ(m.kv.kv_type, kv_type) << "kv_init granted another type";
    const uint32_t vocab = vocab_of(api, m.model);
    const std::vector<int32_t> a = tokens_of(kPromptA + kDecodes, 1, vocab), b = tokens_of(kPromptB + kDecodes, 2, vocab);
    eh_seq* A = m.create();
    eh_seq* B = m.create();
    for (uint32_t done = 0; done < kPromptA; done += kChunkA) {
        eh_step_entry e = ehtest::step_entry(A, a.data() + done, std::min(kChunkA, kPromptA - done), 0);
        EXPECT_EQ(api->step(m.model, &e, 1), EH_OK) << m.error();
    }
    std::vector<std::vector<float>> out;
    uint32_t b_done = 0;
    for (uint32_t i = 0; i < kDecodes; ++i) {
        std::vector<eh_step_entry> e;
        e.push_back(ehtest::step_entry(A, a.data() + kPromptA + i, 1, EH_STEP_SAMPLE | EH_STEP_LOGITS));
        if (b_done < kPromptB) {
            const uint32_t n = std::min(kChunkB, kPromptB - b_done);
            e.push_back(ehtest::step_entry(B, b.data() + b_done, n, b_done + n == kPromptB ? EH_STEP_SAMPLE : 0u));
            b_done += n;
        } else {
            e.push_back(ehtest::step_entry(B, b.data() + b_done++, 1, EH_STEP_SAMPLE));
        }
        if (api->step(m.model, e.data(), uint32_t(e.size())) != EH_OK) {
            ADD_FAILURE() << "step " << i << ": " << m.error();
            return {};
        }
        out.push_back(m.logits(A));
    }
    return out;
}

std::vector<double> log_softmax(const std::vector<float>& x) {
    double mx = -INFINITY;
    for (float v : x) mx = std::max(mx, double(v));
    double s = 0;
    for (float v : x) s += std::exp(double(v) - mx);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = double(x[i]) - mx - std::log(s);
    return out;
}

struct Agreement {
    double max_dlogprob = 0;  // over each position's reference top-5 tokens
    int top1_mismatch = 0;    // positions whose reference top-1 leads by more than the tolerance
};

// got against ref, position by position: |log p_got - log p_ref| of the
// reference's five most likely tokens, and top-1 (clear leads only).
Agreement compare(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& ref, double tol) {
    Agreement r;
    EXPECT_EQ(got.size(), ref.size());
    for (size_t p = 0; p < std::min(got.size(), ref.size()); ++p) {
        const std::vector<double> g = log_softmax(got[p]), f = log_softmax(ref[p]);
        EXPECT_EQ(g.size(), f.size());
        if (g.size() != f.size() || f.size() < 5) continue;
        std::vector<size_t> idx(f.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](size_t x, size_t y) { return f[x] > f[y]; });
        for (int k = 0; k < 5; ++k) r.max_dlogprob = std::max(r.max_dlogprob, std::fabs(g[idx[k]] - f[idx[k]]));
        const size_t gtop = size_t(std::max_element(g.begin(), g.end()) - g.begin());
        if (gtop != idx[0] && f[idx[0]] - f[idx[1]] > tol) ++r.top1_mismatch;
    }
    return r;
}

struct Case {
    std::string profile;
    uint32_t kv_type;
    bool gpt = false;  // gpt-cuda, else llama-cuda
    // The pool's least gain over F16 in the same bytes: 1.75, the 16-byte
    // padding of a row of 128 values (136 -> 144 bytes against 256); a row
    // of 32 (the tiny gpt-oss) is 34 -> 48 bytes against 64.
    double min_ratio = 1.75;
};
class KvQuant : public ::testing::TestWithParam<Case> {};

// The case's CUDA plugin (skips the test where it is not built).
#define CASE_API(c, api)                                                  \
    const eh_plugin_api* api = (c).gpt ? gpt_api() : llama_api();         \
    if (!api) GTEST_SKIP() << "gpt-cuda was not built beside this test"

// CUDA against the CPU reference, both with the case's cache type: as close
// as the two agree with F16 caches (measured beside it; at most twice that,
// or kVsReference where F16 agrees closer), and F16's agreement itself within
// kVsF16. (H200: 0.002-0.009 on the dense files; the tiny Qwen3-MoE's Q8_0
// pair 0.021, where a code one step apart on the two sides, their floats
// either side of a rounding boundary, goes through the router.)
constexpr double kVsReference = 0.03;
// The quantized cache against F16 on the same plugin: issue 50's target.
constexpr double kVsF16 = 0.05;

TEST_P(KvQuant, AgreesWithTheCpuReferenceOfTheSameType) {
    REQUIRE_BOTH();
    const Case& c = GetParam();
    CASE_API(c, gpu);
    auto agreement = [&](uint32_t kv_type) {
        const auto got = run_scenario(gpu, c.profile, kv_type);
        const auto ref = run_scenario(cpu_api(), c.profile, kv_type);
        EXPECT_EQ(got.size(), kDecodes);
        EXPECT_EQ(ref.size(), kDecodes);
        const Agreement a = compare(got, ref, kVsReference);
        std::printf("[kv-quant-gpu] %s %s %s vs cpu-reference: max |dlogprob| %.4f, top-1 mismatches %d / %u\n",
                    c.gpt ? "gpt-cuda" : "llama-cuda", c.profile.c_str(), ehp::kv_type_name(kv_type).c_str(),
                    a.max_dlogprob, a.top1_mismatch, kDecodes);
        return a;
    };
    const Agreement base = agreement(EH_TYPE_F16);
    EXPECT_LE(base.max_dlogprob, kVsF16) << "at F16";
    EXPECT_EQ(base.top1_mismatch, 0) << "at F16";
    if (c.kv_type == EH_TYPE_F16) return;
    const Agreement a = agreement(c.kv_type);
    EXPECT_LE(a.max_dlogprob, std::max(kVsReference, 2 * base.max_dlogprob));
    EXPECT_EQ(a.top1_mismatch, 0);
}

TEST_P(KvQuant, StaysCloseToTheF16Cache) {
    REQUIRE_BOTH();
    const Case& c = GetParam();
    CASE_API(c, gpu);
    if (c.kv_type == EH_TYPE_F16) GTEST_SKIP() << "F16 is the baseline";
    const auto q = run_scenario(gpu, c.profile, c.kv_type);
    const auto f = run_scenario(gpu, c.profile, EH_TYPE_F16);
    ASSERT_EQ(q.size(), kDecodes);
    ASSERT_EQ(f.size(), kDecodes);
    const Agreement a = compare(q, f, kVsF16);
    std::printf("[kv-quant-gpu] %s %s vs F16: max |dlogprob| %.4f, top-1 mismatches %d / %u\n", c.profile.c_str(),
                ehp::kv_type_name(c.kv_type).c_str(), a.max_dlogprob, a.top1_mismatch, kDecodes);
    EXPECT_LE(a.max_dlogprob, kVsF16);
    EXPECT_EQ(a.top1_mismatch, 0);
}

// The same bytes hold about twice the tokens: a row of 32-value blocks
// costs 34 bytes (codes and an FP16 scale) per 64 of F16, plus its padding
// to 16 bytes (Case::min_ratio). The budget is 40 F16 blocks, well under what max_seqs full
// sequences would take (the pool never takes more).
TEST_P(KvQuant, PoolHoldsAboutTwiceTheF16Tokens) {
    REQUIRE_BOTH();
    const Case& c = GetParam();
    CASE_API(c, gpu);
    if (c.kv_type == EH_TYPE_F16) GTEST_SKIP() << "F16 is the baseline";
    uint64_t budget = 0;
    {
        ehtest::StepModel probe(gpu, view_of(c.profile), shape(EH_TYPE_F16), nullptr, c.profile.c_str());
        ASSERT_TRUE(probe.ok()) << probe.failure;
        budget = 40 * probe.kv.block_bytes;
    }
    ehtest::StepModel f(gpu, view_of(c.profile), shape(EH_TYPE_F16, budget), nullptr, c.profile.c_str());
    ehtest::StepModel q(gpu, view_of(c.profile), shape(c.kv_type, budget), nullptr, c.profile.c_str());
    ASSERT_TRUE(f.ok()) << f.failure;
    ASSERT_TRUE(q.ok()) << q.failure;
    EXPECT_EQ(f.kv.total_blocks, 40u);
    EXPECT_EQ(q.kv.kv_type, c.kv_type);
    const double ratio = double(q.kv.total_blocks) / double(f.kv.total_blocks);
    std::printf("[kv-quant-gpu] %s %s: %u blocks of %llu bytes in %llu bytes against F16's %u of %llu (%.2fx)\n",
                c.profile.c_str(), ehp::kv_type_name(c.kv_type).c_str(), q.kv.total_blocks,
                (unsigned long long)q.kv.block_bytes, (unsigned long long)budget, f.kv.total_blocks,
                (unsigned long long)f.kv.block_bytes, ratio);
    EXPECT_GE(ratio, c.min_ratio);
    EXPECT_LE(ratio, 2.0);
    EXPECT_LE(uint64_t(q.kv.total_blocks) * q.kv.block_bytes, budget);
    EXPECT_LE(double(q.kv.block_bytes) * c.min_ratio, double(f.kv.block_bytes));
}

// A quantized prefix parked in host memory and unparked into a new
// sequence decodes exactly as the original (the codes and scales of every
// row came back), and its parked bytes are the quantized rows'.
TEST_P(KvQuant, ParkingRoundTripsAQuantizedPrefix) {
    REQUIRE_BOTH();
    const Case& c = GetParam();
    CASE_API(c, gpu);
    ehtest::StepModel m(gpu, view_of(c.profile), shape(c.kv_type), nullptr, c.profile.c_str());
    ASSERT_TRUE(m.ok()) << m.failure;
    const std::vector<int32_t> p = tokens_of(150, 5, vocab_of(m.api, m.model));
    eh_seq* s = m.create();
    eh_step_entry e = ehtest::step_entry(s, p.data(), 149, 0);
    ASSERT_EQ(m.api->step(m.model, &e, 1), EH_OK) << m.error();
    eh_parked* parked = nullptr;
    uint64_t bytes = 0;
    ASSERT_EQ(m.api->seq_park(s, 149, UINT64_MAX, &parked, &bytes), EH_OK) << m.error();
    EXPECT_EQ(bytes, 149ull * m.kv.block_bytes / m.kv.block_tokens);
    eh_seq* u = nullptr;
    ASSERT_EQ(m.api->seq_unpark(m.model, parked, p.data(), 149, &u), EH_OK) << m.error();
    m.add(u);
    m.api->parked_release(parked);
    eh_step_entry d[2] = {ehtest::step_entry(s, p.data() + 149, 1), ehtest::step_entry(u, p.data() + 149, 1)};
    ASSERT_EQ(m.api->step(m.model, d, 2), EH_OK) << m.error();
    EXPECT_EQ(m.logits(s), m.logits(u));
}

INSTANTIATE_TEST_SUITE_P(
    Types, KvQuant,
    ::testing::Values(Case{"tiny-llama-3.1-q4_k_m", EH_TYPE_F16}, Case{"tiny-llama-3.1-q4_k_m", EH_TYPE_Q8_0},
                      Case{"tiny-llama-3.1-q4_k_m", EH_TYPE_FP8_E4M3}, Case{"tiny-qwen3-q4_k_m", EH_TYPE_Q8_0},
                      Case{"tiny-qwen3-q4_k_m", EH_TYPE_FP8_E4M3}, // (FP8 on the tiny Gemmas is 0.058 and 0.072 from F16 on the
                      // CPU reference itself, past kVsF16: the format's, not a kernel's)
                      Case{"tiny-gemma-3-q4_k_m", EH_TYPE_Q8_0}, Case{"tiny-gemma-3-hd256-q4_k_m", EH_TYPE_Q8_0},
                      Case{"tiny-gpt-oss-mxfp4", EH_TYPE_F16, true},
                      Case{"tiny-gpt-oss-mxfp4", EH_TYPE_Q8_0, true, 1.3},
                      Case{"tiny-gpt-oss-mxfp4", EH_TYPE_FP8_E4M3, true, 1.3},
                      Case{"tiny-qwen3-moe-q4_k_m", EH_TYPE_Q8_0, true}),
    [](const auto& i) {
        std::string n = std::string(i.param.gpt ? "gpt_cuda_" : "llama_cuda_") + i.param.profile + "_" +
                        ehp::kv_type_name(i.param.kv_type);
        for (char& ch : n)
            if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
        return n;
    });

// Types the pool does not store are refused at kv_init, by name.
TEST(KvQuantRefusal, OtherTypesAreRefusedAtKvInit) {
    REQUIRE_BOTH();
    ehtest::StepModel m(llama_api(), view_of("tiny-llama-3.1-q4_k_m"), shape(EH_TYPE_Q4_0));
    EXPECT_EQ(m.status, EH_UNSUPPORTED);
    EXPECT_NE(m.failure.find("KV cache type Q4_0 is not supported"), std::string::npos) << m.failure;
    EXPECT_NE(m.failure.find("Q8_0 or FP8_E4M3"), std::string::npos) << m.failure;
}

}  // namespace
