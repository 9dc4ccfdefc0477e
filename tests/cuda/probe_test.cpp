// probe() must never crash and must answer "unsupported, because ..." on a
// machine without a usable GPU (CI). Runs without the gpu label.
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <gtest/gtest.h>
#include <sstream>
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
    EXPECT_EQ(archs, (std::vector<std::string>{"llama", "qwen2", "qwen3", "phi3", "gemma3", "qwen2vl"}));
    // The quant kinds the plugin reports are the manifest's (the host's
    // registry decides from the manifest, `engine-host plugins` prints it),
    // and name the types of llama.cpp's low-bit uploads.
    std::vector<std::string> quants;
    for (const char* const* q = info->quant_kinds; *q; ++q) quants.push_back(*q);
    std::ifstream f(EH_LLAMA_CUDA_MANIFEST);
    ASSERT_TRUE(f) << EH_LLAMA_CUDA_MANIFEST;
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string json = ss.str();
    const size_t key = json.find("\"quant_kinds\"");
    ASSERT_NE(key, std::string::npos);
    const size_t open = json.find('[', key), close = json.find(']', key);
    std::vector<std::string> listed;
    for (size_t p = json.find('"', open); p < close; p = json.find('"', json.find('"', p + 1) + 1)) {
        const size_t e = json.find('"', p + 1);
        listed.push_back(json.substr(p + 1, e - p - 1));
    }
    EXPECT_EQ(quants, listed);
    for (const char* t : {"Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"})
        EXPECT_NE(std::find(quants.begin(), quants.end(), t), quants.end()) << t;
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
