// llama-cuda against the CPU reference plugin (the project's numeric
// oracle) on the same in-memory models: teacher-forced logits and top-1.
#include <dlfcn.h>

#include <cmath>
#include <cstdlib>

#include <engine_host/plugin_abi.hpp>

#include "gpu_util.hpp"
#include "plugin_handle.hpp"
#include "plugin_positions.hpp"
#include "tiny_model.hpp"

namespace ehtest {
namespace {

#ifdef EH_CPU_REFERENCE_PLUGIN
const eh_plugin_api* cpuref_api() {
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
    bool safetensors = false;  // the host's safetensors view of an HF checkpoint
};
class VsCpuReference : public ::testing::TestWithParam<Case> {};

TEST_P(VsCpuReference, TeacherForcedLogitsAgree) {
    REQUIRE_GPU();
    const eh_plugin_api* ref = cpuref_api();
    ASSERT_NE(ref, nullptr) << "CPU reference plugin not loadable";
    const auto& c = GetParam();
    TinySpec spec;
    spec.arch = c.arch;
    spec.wtype = c.wtype;
    spec.safetensors = c.safetensors;
    spec.embd_type = c.safetensors ? c.wtype : uint32_t(EH_TYPE_Q8_0);
    spec.out_type = c.safetensors ? c.wtype : uint32_t(EH_TYPE_Q6_K);
    spec.tied = c.arch == "qwen2";
    if (c.arch == "phi3") {
        spec.n_embd = 768;
        spec.n_head = 8;
        spec.n_kv = 8;
    }
    spec.magnitude = 0.08f;
    TinyModel tm(spec);
    std::vector<int32_t> toks;
    for (int i = 0; i < 32; ++i) toks.push_back(int32_t((i * 97 + 5) % spec.n_vocab));
    auto a = run_positions(llama_cuda_api(), tm.view(), toks);
    auto b = run_positions(ref, tm.view(), toks);
    ASSERT_EQ(a.size(), toks.size());
    ASSERT_EQ(b.size(), toks.size());
    for (size_t t = 0; t < toks.size(); ++t) {
        double mx = 1e-6, err = 0;
        for (size_t i = 0; i < b[t].size(); ++i) {
            mx = std::max(mx, double(std::fabs(b[t][i])));
            err = std::max(err, double(std::fabs(a[t][i] - b[t][i])));
        }
        EXPECT_LT(err / mx, 3e-2) << "position " << t;
        const size_t ia = size_t(std::max_element(a[t].begin(), a[t].end()) - a[t].begin());
        const size_t ib = size_t(std::max_element(b[t].begin(), b[t].end()) - b[t].begin());
        EXPECT_LE(b[t][ib] - b[t][ia], 3e-2 * mx) << "top-1 at position " << t;
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, VsCpuReference,
                         ::testing::Values(Case{"llama", EH_TYPE_Q4_K}, Case{"qwen2", EH_TYPE_Q5_0},
                                           Case{"qwen2", EH_TYPE_Q8_0}, Case{"phi3", EH_TYPE_Q6_K},
                                           Case{"phi3", EH_TYPE_Q4_0}, Case{"llama", EH_TYPE_BF16},
                                           Case{"llama", EH_TYPE_F16},
                                           // the types of llama.cpp's Q2_K, Q3_K_S/M/L, IQ4_NL and IQ4_XS uploads
                                           Case{"llama", EH_TYPE_Q2_K}, Case{"llama", EH_TYPE_Q3_K},
                                           Case{"qwen2", EH_TYPE_IQ4_NL}, Case{"llama", EH_TYPE_IQ4_XS},
                                           // HF checkpoints as the host serves them: BF16 everywhere, llama's
                                           // Q/K rows unpermuted (NEOX rotation); qwen2 / phi3 rotate NEOX anyway
                                           Case{"llama", EH_TYPE_BF16, true}, Case{"qwen2", EH_TYPE_BF16, true},
                                           Case{"phi3", EH_TYPE_BF16, true}),
                         [](const auto& i) {
                             return i.param.arch + "_" + ehp::type_name(i.param.wtype) + (i.param.safetensors ? "_safetensors" : "");
                         });
#endif

}  // namespace
}  // namespace ehtest
