// probe() must never crash and must answer "unsupported, because ..." on a
// machine without a usable GPU (CI). Runs without the gpu label.
#include <dlfcn.h>

#include <cstdlib>
#include <gtest/gtest.h>
#include <string>
#include <sys/stat.h>
#include <vector>

#include <engine_host/plugin_abi.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

const eh_plugin_api* load_api(void** handle) {
    *handle = dlopen(std::getenv("EH_LLAMA_CUDA_PLUGIN") ? std::getenv("EH_LLAMA_CUDA_PLUGIN") : EH_LLAMA_CUDA_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (!*handle) return nullptr;
    auto entry = reinterpret_cast<eh_plugin_entry_fn>(dlsym(*handle, EH_PLUGIN_ENTRY_SYMBOL));
    return entry ? entry(EH_ABI_MAJOR, EH_ABI_MINOR) : nullptr;
}

bool machine_has_nvidia_device() {
    struct stat st;
    return stat("/dev/nvidia0", &st) == 0 || stat("/dev/nvidiactl", &st) == 0;
}

TEST(LlamaCudaProbe, InfoMatchesManifestLists) {
    void* h = nullptr;
    const eh_plugin_api* api = load_api(&h);
    ASSERT_NE(api, nullptr) << dlerror();
    const eh_plugin_info* info = api->info();
    EXPECT_STREQ(info->name, "llama-cuda");
    EXPECT_EQ(info->device_kind, uint32_t(EH_DEVICE_CUDA));
    EXPECT_EQ(info->min_compute_capability, 80u);
    std::vector<std::string> archs;
    for (const char* const* a = info->architectures; *a; ++a) archs.push_back(*a);
    EXPECT_EQ(archs, (std::vector<std::string>{"llama", "qwen2", "qwen3", "phi3"}));
}

TEST(LlamaCudaProbe, NeverCrashesAndExplainsUnsupported) {
    void* h = nullptr;
    const eh_plugin_api* api = load_api(&h);
    ASSERT_NE(api, nullptr) << dlerror();
    eh_probe_result r{};
    r.struct_size = sizeof r;
    ASSERT_EQ(api->probe(0, &r), EH_OK) << api->plugin_last_error();
    std::printf("probe: supported=%d reason='%s' device='%s' cc=%d\n", r.supported, r.reason, r.device_name,
                r.compute_capability);
    if (!machine_has_nvidia_device()) {
        EXPECT_EQ(r.supported, 0);
        EXPECT_GT(std::strlen(r.reason), 0u);
        EXPECT_NE(std::string(r.reason).find("CUDA"), std::string::npos) << r.reason;
    } else if (r.supported == 0) {
        EXPECT_GT(std::strlen(r.reason), 0u);
    }
    // A device that cannot exist is always unsupported, with a reason.
    eh_probe_result r2{};
    r2.struct_size = sizeof r2;
    ASSERT_EQ(api->probe(1000, &r2), EH_OK);
    EXPECT_EQ(r2.supported, 0);
    EXPECT_GT(std::strlen(r2.reason), 0u);
}

}  // namespace
