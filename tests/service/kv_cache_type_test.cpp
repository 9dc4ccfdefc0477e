// The host's side of ABI 1.4's KV cache types (--kv-cache-type): the type
// reaches kv_init, the granted type is what the service reports, and a
// plugin that cannot hold the type fails the start by name (never a silent
// fallback): one that refuses it, one from before the types, one with
// sessions only. The test engine keeps F16 and refuses anything else.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/service/kv_cache_type.hpp"
#include "eh/service/metrics.hpp"
#include "eh/service/service.hpp"
#include "eh/service/text_codec.hpp"

using namespace eh;
using namespace eh::service;

namespace {

// The abi-1-1 fixture's manifest says the host's minor; as the loader tests
// do, a copy that says 1 makes it a 1.1 plugin (sessions only).
std::string session_only_manifest() {
    namespace fs = std::filesystem;
    // removed when the test program ends
    static const struct Dir {
        fs::path path = fs::temp_directory_path() / ("eh-kv-type-test-" + std::to_string(getpid()));
        ~Dir() {
            std::error_code ec;
            fs::remove_all(path, ec);
        }
    } scratch;
    static const std::string path = [] {
        const fs::path& dir = scratch.path;
        fs::create_directories(dir);
        const fs::path from = fs::path(EH_TEST_PLUGIN_DIR) / "abi-1-1";
        fs::copy_file(from / "libeh-fixture-abi-1-1.so", dir / "libeh-fixture-abi-1-1.so",
                      fs::copy_options::overwrite_existing);
        std::ifstream in(from / "fixture-abi-1-1.manifest.json");
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const std::string minor = "\"minor\": " + std::to_string(EH_ABI_MINOR);
        text.replace(text.find(minor), minor.size(), "\"minor\": 1");
        std::ofstream(dir / "fixture-abi-1-1.manifest.json") << text;
        return (dir / "fixture-abi-1-1.manifest.json").string();
    }();
    return path;
}

std::shared_ptr<EngineModel> load(const std::string& manifest) {
    const std::string path = manifest[0] == '/' ? manifest : std::string(EH_TEST_PLUGIN_DIR) + "/" + manifest;
    PluginRecord r = loader::load_plugin(path, loader::LoaderOptions{});
    if (!r.accepted) throw std::runtime_error(manifest + " rejected");
    static eh_model_view view{};
    view.struct_size = sizeof(view);
    view.format = EH_FORMAT_GGUF;
    view.architecture = {"llama", 5};
    return EngineModel::load(r.api, "/dev/null", &view, nullptr, {});
}

std::shared_ptr<Service> start(const std::string& manifest, uint32_t kv_type) {
    ServiceOptions o;
    o.n_ctx = 256;
    o.kv_type = kv_type;
    return std::make_shared<Service>(load(manifest), std::make_shared<ByteCodec>(), o);
}

// The start's error, or "" when it started.
Error start_error(const std::string& manifest, uint32_t kv_type) {
    try {
        start(manifest, kv_type);
    } catch (const Error& e) {
        return e;
    }
    return Error(Code::Internal, "");
}

struct Env {
    explicit Env(const char* name) : name_(name) { setenv(name, "1", 1); }
    ~Env() { unsetenv(name_); }
    const char* name_;
};

}  // namespace

TEST(KvCacheTypeOption, ParsesTheThreeWordsAndNamesGrantedTypes) {
    EXPECT_EQ(parse_kv_cache_type("f16"), uint32_t(EH_TYPE_F16));
    EXPECT_EQ(parse_kv_cache_type("q8_0"), uint32_t(EH_TYPE_Q8_0));
    EXPECT_EQ(parse_kv_cache_type("fp8"), uint32_t(EH_TYPE_FP8_E4M3));
    EXPECT_FALSE(parse_kv_cache_type("Q8_0"));
    EXPECT_FALSE(parse_kv_cache_type("f32"));  // the default of some plugins, not a request
    EXPECT_FALSE(parse_kv_cache_type(""));
    EXPECT_EQ(kv_cache_type_name(EH_TYPE_F32), "f32");
    EXPECT_EQ(kv_cache_type_name(EH_TYPE_FP8_E4M3), "fp8");
    EXPECT_EQ(kv_cache_type_name(EH_TYPE_Q4_K), "Q4_K");
    EXPECT_EQ(kv_cache_type_name(kKvTypeUnknown), "unknown");
}

TEST(KvCacheTypeOption, TheGrantedTypeIsWhatTheServiceReports) {
    auto svc = start("step-only/fixture-step-only.manifest.json", 0);
    EXPECT_EQ(svc->kv_limits().kv_type, uint32_t(EH_TYPE_F16));
    // and vllm:cache_config_info's cache_dtype
    Gauges g;
    svc->fill_gauges(g);
    EXPECT_EQ(g.kv_cache_type, "f16");
    g.model_name = "m";  // the vllm:* families need one
    const std::string text = Metrics().render(g);
    EXPECT_NE(text.find("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"" +
                        std::to_string(svc->kv_limits().total_blocks) +
                        "\",enable_prefix_caching=\"True\",cache_dtype=\"f16\",engine=\"0\"} 1\n"),
              std::string::npos)
        << text;
    EXPECT_EQ(start("step-only/fixture-step-only.manifest.json", EH_TYPE_F16)->kv_limits().kv_type,
              uint32_t(EH_TYPE_F16));
}

TEST(KvCacheTypeOption, APluginThatCannotHoldTheTypeFailsTheStartByName) {
    const Error e = start_error("step-only/fixture-step-only.manifest.json", EH_TYPE_Q8_0);
    EXPECT_EQ(e.code(), Code::ModelLoadFailed);
    const std::string m = e.what();
    EXPECT_NE(m.find("plugin fixture-step-only cannot start with --kv-cache-type q8_0: kv_init: KV cache type Q8_0 is not supported: the test engine keeps F16 only"), std::string::npos) << m;
}

TEST(KvCacheTypeOption, APluginFromBeforeTheTypesGetsOnlyItsDefault) {
    Env old("EH_TEST_ENGINE_KV_INFO_1_3");
    auto svc = start("step-only/fixture-step-only.manifest.json", 0);
    EXPECT_EQ(svc->kv_limits().kv_type, kKvTypeUnknown);
    Gauges g;
    svc->fill_gauges(g);
    EXPECT_EQ(g.kv_cache_type, "auto");
    svc.reset();
    // it ignores kv_type (and would have said F16): the host cannot know, so refuses even f16
    for (uint32_t t : {uint32_t(EH_TYPE_F16), uint32_t(EH_TYPE_FP8_E4M3)}) {
        const Error e = start_error("step-only/fixture-step-only.manifest.json", t);
        EXPECT_EQ(e.code(), Code::ModelLoadFailed);
        EXPECT_NE(std::string(e.what()).find("predates ABI 1.4's KV cache types"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(kv_cache_type_name(t) + " cannot be asked of it"), std::string::npos)
            << e.what();
    }
}

TEST(KvCacheTypeOption, ASessionOnlyPluginTakesNoType) {
    EXPECT_EQ(start(session_only_manifest(), 0)->kv_limits().kv_type, kKvTypeUnknown);
    const Error e = start_error(session_only_manifest(), EH_TYPE_Q8_0);
    EXPECT_EQ(e.code(), Code::ModelLoadFailed);
    EXPECT_NE(std::string(e.what()).find("runs sessions only"), std::string::npos) << e.what();
}
