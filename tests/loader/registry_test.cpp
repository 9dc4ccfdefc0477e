#include <gtest/gtest.h>

#include "eh/registry.hpp"

using namespace eh;

namespace {

PluginRecord plugin(const std::string& name, int priority, std::vector<std::string> archs,
                    std::vector<std::string> quants, bool accepted = true) {
    PluginRecord r;
    r.accepted = accepted;
    r.caps.name = name;
    r.caps.priority = priority;
    r.caps.formats = {"gguf"};
    r.caps.architectures = std::move(archs);
    r.caps.quant_kinds = std::move(quants);
    if (!accepted) r.reasons = {"broken"};
    return r;
}

ModelRequirements qwen_q4km() { return {"gguf", "qwen2", {"F32", "Q4_K", "Q6_K"}}; }

}  // namespace

TEST(Registry, PicksTheHighestPriorityPluginThatServesEverything) {
    Registry reg;
    reg.add(plugin("cpu-reference", 0, {"llama", "qwen2"}, {"F32", "Q4_K", "Q6_K"}));
    reg.add(plugin("llama-cuda", 100, {"llama", "qwen2"}, {"F32", "Q4_K", "Q6_K"}));
    reg.add(plugin("partial", 500, {"qwen2"}, {"F32", "Q4_K"}));  // lacks Q6_K
    auto res = reg.resolve(qwen_q4km());
    ASSERT_NE(res.plugin, nullptr);
    EXPECT_EQ(res.plugin->caps.name, "llama-cuda");
    EXPECT_NE(res.explanation.find("chosen over cpu-reference"), std::string::npos) << res.explanation;
}

TEST(Registry, TiesAreBrokenByNameNotDiscoveryOrder) {
    for (bool reversed : {false, true}) {
        Registry reg;
        auto a = plugin("alpha", 10, {"qwen2"}, {"F32", "Q4_K", "Q6_K"});
        auto b = plugin("beta", 10, {"qwen2"}, {"F32", "Q4_K", "Q6_K"});
        if (reversed) std::swap(a, b);
        reg.add(a);
        reg.add(b);
        auto res = reg.resolve(qwen_q4km());
        ASSERT_NE(res.plugin, nullptr);
        EXPECT_EQ(res.plugin->caps.name, "alpha");
    }
}

TEST(Registry, RejectedPluginsAreNeverChosen) {
    Registry reg;
    reg.add(plugin("broken-but-perfect", 1000, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}, false));
    auto res = reg.resolve(qwen_q4km());
    EXPECT_EQ(res.plugin, nullptr);
    EXPECT_NE(res.explanation.find("no plugin was accepted"), std::string::npos) << res.explanation;
    EXPECT_NE(res.explanation.find("1 rejected plugin(s)"), std::string::npos) << res.explanation;
}

TEST(Registry, NobodyCanServeSaysWhatIsNeededAndWhatEachOffers) {
    Registry reg;
    reg.add(plugin("gpt-cuda", 100, {"gpt2", "gpt-oss"}, {"F32", "MXFP4"}));
    reg.add(plugin("cpu-lite", 0, {"qwen2"}, {"F32"}));
    auto res = reg.resolve(qwen_q4km());
    EXPECT_EQ(res.plugin, nullptr);
    const std::string& e = res.explanation;
    EXPECT_NE(e.find("architecture qwen2, tensor types F32, Q4_K, Q6_K"), std::string::npos) << e;
    EXPECT_NE(e.find("gpt-cuda: architecture qwen2 not served (serves gpt2, gpt-oss)"), std::string::npos) << e;
    EXPECT_NE(e.find("cpu-lite: tensor types Q4_K, Q6_K not served (serves F32)"), std::string::npos) << e;
}

TEST(Registry, FormatMustMatch) {
    Registry reg;
    reg.add(plugin("gguf-only", 0, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}));
    auto need = qwen_q4km();
    need.format = "safetensors";
    auto res = reg.resolve(need);
    EXPECT_EQ(res.plugin, nullptr);
    EXPECT_NE(res.explanation.find("format safetensors not served (serves gguf)"), std::string::npos);
}

namespace {

PluginRecord on(PluginRecord r, const char* device_kind) {
    r.caps.device_kind = device_kind;
    return r;
}

// The worker contract's VRAM-only rule: a GPU worker never falls back to the
// CPU engine unasked, and says why the GPU plugin could not serve.
TEST(Registry, DevicePolicyNeverFallsBackToTheCpuAndNamesTheRejectedGpuPlugin) {
    Registry reg;
    PluginRecord gpu = on(plugin("llama-cuda", 10, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}, false), "cuda");
    gpu.reasons = {"probe: no CUDA driver"};
    reg.add(gpu);
    reg.add(on(plugin("cpu-reference", 0, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}), "cpu"));
    reg.add(on(plugin("other-cuda", 5, {"llama"}, {"F32"}, false), "cuda"));  // would not serve qwen2 anyway

    Resolution any = reg.resolve(qwen_q4km());
    ASSERT_NE(any.plugin, nullptr);
    EXPECT_EQ(any.plugin->caps.name, "cpu-reference");

    Resolution dev = reg.resolve(qwen_q4km(), DevicePolicy::Device);
    EXPECT_EQ(dev.plugin, nullptr);
    EXPECT_NE(dev.explanation.find("no accepted device (GPU) plugin"), std::string::npos) << dev.explanation;
    EXPECT_NE(dev.explanation.find("llama-cuda (rejected): probe: no CUDA driver"), std::string::npos) << dev.explanation;
    EXPECT_EQ(dev.explanation.find("other-cuda"), std::string::npos) << dev.explanation;

    Resolution cpu = reg.resolve(qwen_q4km(), DevicePolicy::Cpu);
    ASSERT_NE(cpu.plugin, nullptr);
    EXPECT_EQ(cpu.plugin->caps.name, "cpu-reference");
}

TEST(Registry, DevicePolicyPicksAnAcceptedGpuPluginOverAHigherPriorityCpuOne) {
    Registry reg;
    reg.add(on(plugin("llama-cuda", 1, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}), "cuda"));
    reg.add(on(plugin("cpu-reference", 50, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}), "cpu"));
    EXPECT_EQ(reg.resolve(qwen_q4km(), DevicePolicy::Device).plugin->caps.name, "llama-cuda");
    EXPECT_EQ(reg.resolve(qwen_q4km(), DevicePolicy::Cpu).plugin->caps.name, "cpu-reference");
    EXPECT_EQ(reg.resolve(qwen_q4km()).plugin->caps.name, "cpu-reference");
}

// The default policy (serve, chat): a GPU plugin that claims the model keeps
// the CPU engine out, accepted or not.
TEST(Registry, AutoRefusesTheCpuWhenARejectedGpuPluginClaimsTheModel) {
    Registry reg;
    PluginRecord gpu = on(plugin("llama-cuda", 100, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}, false), "cuda");
    gpu.reasons = {"probe: cannot run here: cudaSetDevice failed"};
    reg.add(gpu);
    reg.add(on(plugin("cpu-reference", 0, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}), "cpu"));
    reg.add(on(plugin("gpt-cuda", 100, {"gpt-oss"}, {"F32"}, false), "cuda"));  // does not claim qwen2

    Resolution res = reg.resolve(qwen_q4km(), DevicePolicy::Auto);
    EXPECT_EQ(res.plugin, nullptr);
    EXPECT_NE(res.explanation.find("llama-cuda (rejected): probe: cannot run here: cudaSetDevice failed"),
              std::string::npos) << res.explanation;
    ASSERT_EQ(res.rejected_claimants.size(), 1u);
    EXPECT_EQ(res.rejected_claimants[0]->caps.name, "llama-cuda");
    // Asked for: the CPU; the explicit fallback: the CPU too.
    EXPECT_EQ(reg.resolve(qwen_q4km(), DevicePolicy::Cpu).plugin->caps.name, "cpu-reference");
    EXPECT_EQ(reg.resolve(qwen_q4km(), DevicePolicy::Any).plugin->caps.name, "cpu-reference");
}

TEST(Registry, AutoServesOnTheCpuWhenNoGpuPluginClaimsTheModel) {
    Registry reg;
    reg.add(on(plugin("gpt-cuda", 100, {"gpt-oss"}, {"F32", "Q4_K", "Q6_K"}, false), "cuda"));  // other arch
    reg.add(on(plugin("partial-cuda", 100, {"qwen2"}, {"F32", "Q4_K"}, false), "cuda"));       // lacks Q6_K
    reg.add(on(plugin("cpu-reference", 0, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}), "cpu"));
    Resolution res = reg.resolve(qwen_q4km(), DevicePolicy::Auto);
    ASSERT_NE(res.plugin, nullptr) << res.explanation;
    EXPECT_EQ(res.plugin->caps.name, "cpu-reference");
    EXPECT_TRUE(res.rejected_claimants.empty());
}

TEST(Registry, AutoPicksTheAcceptedGpuPluginOverAHigherPriorityCpuOne) {
    Registry reg;
    reg.add(on(plugin("llama-cuda", 1, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}), "cuda"));
    reg.add(on(plugin("cpu-reference", 50, {"qwen2"}, {"F32", "Q4_K", "Q6_K"}), "cpu"));
    EXPECT_EQ(reg.resolve(qwen_q4km(), DevicePolicy::Auto).plugin->caps.name, "llama-cuda");
}

}  // namespace
