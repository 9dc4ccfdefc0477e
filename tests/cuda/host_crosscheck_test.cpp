// Host-only cross-checks (no GPU, no gpu label): the GPU tests' reference
// pieces against the code other people wrote.
//   - tests/cuda/host_reference.cpp's dequantizer (which the GPU kernels are
//     tested against) vs plugin-abi's quant_blocks.hpp, for every type;
//   - the tiny-model float forward pass (the GPU model tests' oracle) vs
//     the CPU reference plugin on the very same in-memory model views.
// So GPU == host reference == CPU reference plugin.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>

#include "host_reference.hpp"
#include "plugin_positions.hpp"
#include "tiny_model.hpp"

namespace ehtest {
namespace {

const uint32_t kTypes[] = {EH_TYPE_F32,  EH_TYPE_F16,  EH_TYPE_BF16, EH_TYPE_Q4_0, EH_TYPE_Q4_1, EH_TYPE_Q5_0,
                           EH_TYPE_Q5_1, EH_TYPE_Q8_0, EH_TYPE_Q4_K, EH_TYPE_Q5_K, EH_TYPE_Q6_K};

TEST(HostCrossCheck, DequantMatchesQuantBlocksHeader) {
    for (uint32_t type : kTypes) {
        const int rows = 7, cols = 512;
        std::mt19937 rng(type + 100);
        auto w = random_rows(type, rows, cols, rng);
        std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
        for (int r = 0; r < rows; ++r) {
            const uint8_t* src = w.data() + row_size(type, cols) * r;
            dequant_row(type, src, cols, a.data());
            ASSERT_TRUE(ehp::quant::dequantize_row(type, src, b.data(), cols)) << ehp::type_name(type);
            for (int i = 0; i < cols; ++i)
                ASSERT_EQ(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)]) << ehp::type_name(type) << " row " << r << " elem " << i;
        }
    }
}

const eh_plugin_api* cpuref() {
    static const eh_plugin_api* api = [] {
        const char* path = std::getenv("EH_CPU_REFERENCE_PLUGIN") ? std::getenv("EH_CPU_REFERENCE_PLUGIN") : EH_CPU_REFERENCE_PLUGIN;
        void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) return static_cast<const eh_plugin_api*>(nullptr);
        auto entry = reinterpret_cast<eh_plugin_entry_fn>(dlsym(h, EH_PLUGIN_ENTRY_SYMBOL));
        return entry ? entry(EH_ABI_MAJOR, EH_ABI_MINOR) : nullptr;
    }();
    return api;
}

struct Case {
    std::string arch;
    uint32_t wtype;
    int window = 0;
    int n_rot = 0;
};

class TinyVsCpuReference : public ::testing::TestWithParam<Case> {};

TEST_P(TinyVsCpuReference, LogitsAgree) {
    const eh_plugin_api* api = cpuref();
    ASSERT_NE(api, nullptr) << dlerror();
    const auto& c = GetParam();
    TinySpec spec;
    spec.arch = c.arch;
    spec.wtype = c.wtype;
    spec.embd_type = EH_TYPE_Q8_0;
    spec.out_type = EH_TYPE_Q6_K;
    spec.tied = c.arch == "qwen2";
    if (c.arch == "phi3") {
        spec.n_embd = 768;
        spec.n_head = 8;
        spec.n_kv = 8;
    }
    spec.magnitude = 0.08f;
    spec.window = c.window;
    spec.n_rot = c.n_rot;
    TinyModel tm(spec);
    std::vector<int32_t> toks;
    for (int i = 0; i < 12; ++i) toks.push_back(int32_t((i * 131 + 7) % spec.n_vocab));
    auto ref = tm.reference_logits(toks);

    // one token a step, through the batched step as on the GPU
    StepSeq s(api, tm.view(), one_seq(64), nullptr, "");
    ASSERT_TRUE(s.ok()) << s.failure;
    for (size_t t = 0; t < toks.size(); ++t) {
        ASSERT_EQ(s.decode(toks[t]), EH_OK) << s.error();
        const std::vector<float> lg = s.logits();
        ASSERT_EQ(lg.size(), size_t(spec.n_vocab));
        double mx = 1e-6, err = 0;
        for (size_t i = 0; i < lg.size(); ++i) {
            mx = std::max(mx, double(std::fabs(ref[t][i])));
            err = std::max(err, double(std::fabs(lg[i] - ref[t][i])));
        }
        EXPECT_LT(err / mx, 1e-3) << c.arch << " " << ehp::type_name(c.wtype) << " position " << t;
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyVsCpuReference,
                         ::testing::Values(Case{"llama", EH_TYPE_Q4_K}, Case{"llama", EH_TYPE_F16},
                                           Case{"qwen2", EH_TYPE_Q5_0}, Case{"qwen2", EH_TYPE_Q8_0},
                                           Case{"phi3", EH_TYPE_Q6_K}, Case{"phi3", EH_TYPE_BF16},
                                           Case{"llama", EH_TYPE_Q8_0, 4, 32}, Case{"phi3", EH_TYPE_Q4_0, 5, 0},
                                           // the forged low-bit models VsCpuReference runs on the GPU
                                           Case{"llama", EH_TYPE_Q2_K}, Case{"llama", EH_TYPE_Q3_K},
                                           Case{"qwen2", EH_TYPE_IQ4_NL}, Case{"llama", EH_TYPE_IQ4_XS},
                                           // the per-head q/k RMSNorm (the tensor-parallel qwen3 case's oracle)
                                           Case{"qwen3", EH_TYPE_Q4_K}, Case{"qwen3", EH_TYPE_F16}),
                         [](const auto& i) {
                             return i.param.arch + "_" + ehp::type_name(i.param.wtype) +
                                    (i.param.window ? "_swa" + std::to_string(i.param.window) : "") +
                                    (i.param.n_rot ? "_rot" + std::to_string(i.param.n_rot) : "");
                         });

// An F16 or BF16 checkpoint gives the logits of the F32 one it was rounded
// from (the same model, every matrix in half precision): cpu-reference,
// 32 teacher-forced positions, relative to the largest logit. Seen: F16
// 2.0e-3, BF16 1.5e-2 (weights rounded by 2^-11 and 2^-8); bounds about
// twice that.
TEST(HalfCheckpoints, CpuReferenceF16AndBF16MatchF32) {
    const eh_plugin_api* api = cpuref();
    ASSERT_NE(api, nullptr) << dlerror();
    TinySpec spec;
    spec.wtype = EH_TYPE_F32;
    spec.magnitude = 0.08f;
    TinyModel f32(spec), f16(spec), bf16(spec);
    f16.round_matrices(EH_TYPE_F16);
    bf16.round_matrices(EH_TYPE_BF16);
    std::vector<int32_t> toks;
    for (int i = 0; i < 32; ++i) toks.push_back(int32_t((i * 97 + 5) % spec.n_vocab));
    const auto ref = run_positions(api, f32.view(), toks);
    const double e16 = worst_relative(run_positions(api, f16.view(), toks), ref);
    const double eb16 = worst_relative(run_positions(api, bf16.view(), toks), ref);
    std::printf("cpu-reference vs F32: F16 %.2e, BF16 %.2e\n", e16, eb16);
    EXPECT_GT(e16, 0.0) << "the F16 copy was not rounded";
    EXPECT_LT(e16, 5e-3);
    EXPECT_LT(eb16, 3e-2);
}

}  // namespace
}  // namespace ehtest
