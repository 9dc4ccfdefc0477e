#include <gtest/gtest.h>

#include <algorithm>

#include "eh/error.hpp"
#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "test_util.hpp"

using namespace eh;
using namespace eh::loader;
using eh::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

std::string all_reasons(const PluginRecord& r) {
    std::string s;
    for (const auto& x : r.reasons) s += x + "\n";
    return s;
}

PluginRecord load_fixture(const std::string& name, LoaderOptions opt = {}) {
    ScratchDir dir;
    eh::test::copy_fixture(name, dir.path);
    return load_plugin(eh::test::manifest_in(dir.path).string(), opt);
}

// The same check with and without the forked pre-flight, when a fixture is
// safe to open in-process.
void expect_rejected(const std::string& name, const std::string& reason_part, bool also_in_process = true) {
    for (bool isolate : {true, false}) {
        if (!isolate && !also_in_process) continue;
        LoaderOptions opt;
        opt.isolate_preflight = isolate;
        PluginRecord r = load_fixture(name, opt);
        EXPECT_FALSE(r.accepted) << name << " isolate=" << isolate;
        EXPECT_NE(all_reasons(r).find(reason_part), std::string::npos)
            << name << " isolate=" << isolate << " reasons:\n" << all_reasons(r);
        EXPECT_EQ(r.api, nullptr);
    }
}

}  // namespace

TEST(Loader, GoodPluginIsAcceptedAndProbed) {
    PluginRecord r = load_fixture("good");
    ASSERT_TRUE(r.accepted) << all_reasons(r);
    EXPECT_EQ(r.caps.name, "test-engine");
    ASSERT_TRUE(r.probe.has_value());
    EXPECT_STREQ(r.probe->device_name, "test device");
    ASSERT_NE(r.api, nullptr);
    EXPECT_EQ(r.api->abi_major, EH_ABI_MAJOR);
}

TEST(Loader, WrongMajorInTableIsRejectedNamingBothVersions) {
    expect_rejected("wrong-major", "ABI major mismatch: plugin speaks 2." + std::to_string(EH_ABI_MINOR) + ", host needs 1.");
}

TEST(Loader, NullEntryIsRejected) { expect_rejected("null-entry", "returned NULL"); }

TEST(Loader, MissingEntrySymbolIsRejected) {
    expect_rejected("missing-entry", "does not export the entry symbol eh_plugin_entry");
}

TEST(Loader, ExceptionAcrossTheAbiIsRejectedAndHostSurvives) {
    expect_rejected("throws", "plugin threw a C++ exception across the ABI in info(): fixture: info() always throws");
}

TEST(Loader, ProbeSaysUnsupported) {
    expect_rejected("probe-unsupported", "probe: cannot run here: fixture: needs hardware this machine lacks");
}

TEST(Loader, SelfDescriptionDisagreeingWithManifestListsEveryMismatch) {
    PluginRecord r = load_fixture("disagree");
    EXPECT_FALSE(r.accepted);
    std::string why = all_reasons(r);
    EXPECT_NE(why.find("name disagree: manifest says \"fixture-disagree\", plugin says \"another-name\""),
              std::string::npos) << why;
    EXPECT_NE(why.find("architectures disagree: manifest says [llama, test-arch], plugin says [llama, not-in-manifest]"),
              std::string::npos) << why;
}

TEST(Loader, TooSmallFunctionTableIsRejected) {
    expect_rejected("small-table", "function table too small: plugin says 16 bytes");
}

TEST(Loader, CrashingProbeIsContainedInThePreflightProcess) {
    PluginRecord r = load_fixture("crash");
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("crashed with signal 11"), std::string::npos) << all_reasons(r);
    EXPECT_NE(all_reasons(r).find("during probe"), std::string::npos) << all_reasons(r);
}

TEST(Loader, HangingProbeIsKilledAfterTheTimeout) {
    LoaderOptions opt;
    opt.preflight_timeout = std::chrono::milliseconds(1500);
    PluginRecord r = load_fixture("hang", opt);
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("did not finish probe within 1 s"), std::string::npos) << all_reasons(r);
}

// Minor versions only append: a plugin built against 1.1 (its table ends
// before 1.2's batched members) loads in the 1.2 host, which then drives it
// through the session calls.
TEST(Loader, PluginBuiltForAnOlderMinorIsAccepted) {
    ScratchDir dir;
    eh::test::copy_fixture("abi-1-1", dir.path);
    auto mp = eh::test::manifest_in(dir.path);
    std::string text = eh::test::read_file(mp);
    eh::test::replace_all(text, "\"minor\": " + std::to_string(EH_ABI_MINOR), "\"minor\": 1");
    eh::test::write_file(mp, text);
    PluginRecord r = load_plugin(mp.string());
    EXPECT_TRUE(r.accepted) << all_reasons(r);
    ASSERT_NE(r.api, nullptr);
    EXPECT_EQ(r.api->abi_minor, 1);
    EXPECT_EQ(r.api->struct_size, offsetof(eh_plugin_api, kv_init));
    EXPECT_FALSE(api_has_step(*r.api));
}

// A plugin built against 1.2 (its table ends before 1.3's step halves) loads
// in the 1.3 host, which then runs its steps whole.
TEST(Loader, PluginBuiltForMinorTwoIsAcceptedWithoutStepHalves) {
    ScratchDir dir;
    eh::test::copy_fixture("abi-1-2", dir.path);
    auto mp = eh::test::manifest_in(dir.path);
    std::string text = eh::test::read_file(mp);
    eh::test::replace_all(text, "\"minor\": " + std::to_string(EH_ABI_MINOR), "\"minor\": 2");
    eh::test::write_file(mp, text);
    PluginRecord r = load_plugin(mp.string());
    EXPECT_TRUE(r.accepted) << all_reasons(r);
    ASSERT_NE(r.api, nullptr);
    EXPECT_EQ(r.api->abi_minor, 2);
    EXPECT_EQ(r.api->struct_size, offsetof(eh_plugin_api, step_begin));
    EXPECT_FALSE(api_has_step_halves(*r.api));
}

TEST(Loader, StepHalvesComeAsAPair) {
    PluginRecord r = load_fixture("half-steps");
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("step_begin and step_end (1.3) come as a pair"), std::string::npos) << all_reasons(r);
}

TEST(Loader, BatchedMembersComeAsAGroup) {
    PluginRecord r = load_fixture("partial-batch");
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("function table entry step is NULL while other batched (1.2) entries are set"),
              std::string::npos) << all_reasons(r);
}

TEST(Loader, TooOldMinorIsRejectedBeforeOpening) {
    LoaderOptions opt;
    opt.required_abi_minor = EH_ABI_MINOR + 1;
    PluginRecord r = load_fixture("good", opt);
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("ABI too old: manifest says 1." + std::to_string(EH_ABI_MINOR) +
                                  ", host needs at least 1." + std::to_string(EH_ABI_MINOR + 1)),
              std::string::npos) << all_reasons(r);
}

namespace {

// Copies the good plugin and applies `edit` to its manifest text.
PluginRecord load_edited(const std::function<void(std::string&)>& edit, LoaderOptions opt = {}) {
    ScratchDir dir;
    eh::test::copy_fixture("good", dir.path);
    auto mp = eh::test::manifest_in(dir.path);
    std::string text = eh::test::read_file(mp);
    edit(text);
    eh::test::write_file(mp, text);
    return load_plugin(mp.string(), opt);
}

}  // namespace

TEST(Loader, Sha256MismatchIsRejectedBeforeOpening) {
    PluginRecord r = load_edited([](std::string& s) {
        auto pos = s.find("\"sha256\": \"") + 11;
        s.replace(pos, 64, std::string(64, '0'));
    });
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("sha256 mismatch: manifest says 0000"), std::string::npos) << all_reasons(r);
}

TEST(Loader, MalformedJsonIsRejected) {
    PluginRecord r = load_edited([](std::string& s) { s = s.substr(0, s.size() / 2); });
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("manifest is not valid JSON"), std::string::npos) << all_reasons(r);
}

TEST(Loader, ManifestAbiMajorMismatchIsRejectedBeforeOpening) {
    PluginRecord r = load_edited([](std::string& s) { eh::test::replace_all(s, "\"major\": 1", "\"major\": 7"); });
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("ABI major mismatch: manifest says 7." + std::to_string(EH_ABI_MINOR) + ", host needs 1.0"), std::string::npos)
        << all_reasons(r);
}

TEST(Loader, ManifestAbiMinorDisagreeingWithTableIsRejected) {
    PluginRecord r = load_edited([](std::string& s) {
        eh::test::replace_all(s, "\"minor\": " + std::to_string(EH_ABI_MINOR), "\"minor\": " + std::to_string(EH_ABI_MINOR + 1));
    });
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("ABI version disagrees: manifest says 1." + std::to_string(EH_ABI_MINOR + 1) +
                                  ", plugin table says 1." + std::to_string(EH_ABI_MINOR)),
              std::string::npos) << all_reasons(r);
}

TEST(Loader, PlatformMismatchIsRejected) {
    PluginRecord r = load_edited([](std::string& s) { eh::test::replace_all(s, "linux-", "windows-"); });
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("platform mismatch: manifest says windows-"), std::string::npos) << all_reasons(r);
}

TEST(Loader, LibraryOutsideThePluginFolderIsRefused) {
    PluginRecord r = load_edited([](std::string& s) {
        eh::test::replace_all(s, "\"library\": \"libeh-test-engine.so\"", "\"library\": \"../libeh-test-engine.so\"");
    });
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("must be a plain file name"), std::string::npos) << all_reasons(r);
}

TEST(Loader, EveryManifestProblemIsReportedAtOnce) {
    PluginRecord r = load_edited([](std::string& s) {
        eh::test::replace_all(s, "\"priority\": 0", "\"priority\": \"high\"");
        eh::test::replace_all(s, "\"formats\": [\"gguf\", \"safetensors\"]", "\"formats\": [\"onnx\"]");
        eh::test::replace_all(s, "\"engine\": \"test\",", "");
    });
    EXPECT_FALSE(r.accepted);
    std::string why = all_reasons(r);
    EXPECT_NE(why.find("field \"priority\" must be an integer, got a string"), std::string::npos) << why;
    EXPECT_NE(why.find("unknown format \"onnx\""), std::string::npos) << why;
    EXPECT_NE(why.find("missing field \"engine\""), std::string::npos) << why;
}

TEST(Loader, DiscoveryKeepsGoodPluginsAndReportsEveryBadOne) {
    ScratchDir dir;
    for (const char* name : {"good", "crash", "throws", "null-entry", "missing-entry", "wrong-major"})
        eh::test::copy_fixture(name, dir.path);
    // A library with no manifest at all.
    fs::copy_file(dir.path / "libeh-test-engine.so", dir.path / "libeh-stray.so");
    Registry reg = discover_plugins(dir.path.string());
    ASSERT_EQ(reg.records().size(), 7u);
    ASSERT_EQ(reg.accepted().size(), 1u);
    EXPECT_EQ(reg.accepted()[0]->caps.name, "test-engine");
    EXPECT_EQ(reg.rejected().size(), 6u);
    bool stray_reported = false;
    for (const auto* r : reg.rejected()) {
        EXPECT_FALSE(r->reasons.empty()) << r->caps.name;
        if (r->caps.name == "libeh-stray.so")
            stray_reported = all_reasons(*r).find("no manifest names this library") != std::string::npos;
    }
    EXPECT_TRUE(stray_reported);
}

// Like two CUDA plugins: once one is opened in the host process, a forked
// child can no longer initialise the runtime. Discovery must therefore run
// every pre-flight before it opens any plugin in-process.
TEST(Loader, PreflightsRunBeforeAnyPluginIsOpenedInProcess) {
    ScratchDir dir;
    eh::test::copy_fixture("good", dir.path);
    // A second copy of the same engine under another file name.
    fs::copy_file(dir.path / "libeh-test-engine.so", dir.path / "libeh-test-engine-2.so");
    std::string m = eh::test::read_file(dir.path / "test-engine.manifest.json");
    eh::test::replace_all(m, "libeh-test-engine.so", "libeh-test-engine-2.so");
    eh::test::write_file(dir.path / "test-engine-2.manifest.json", m);

    setenv("EH_TEST_ENGINE_FORK_SENSITIVE", "1", 1);
    unsetenv("EH_TEST_ENGINE_INITIALISED_IN");
    Registry reg = discover_plugins(dir.path.string());
    unsetenv("EH_TEST_ENGINE_FORK_SENSITIVE");
    unsetenv("EH_TEST_ENGINE_INITIALISED_IN");
    ASSERT_EQ(reg.records().size(), 2u);
    for (const auto& r : reg.records()) EXPECT_TRUE(r.accepted) << r.library_path << ": " << all_reasons(r);
}

TEST(Loader, MissingPluginDirectoryIsAClearError) {
    try {
        discover_plugins("/nonexistent/plugins");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::NoPlugin);
        EXPECT_NE(std::string(e.what()).find("/nonexistent/plugins"), std::string::npos);
    }
}

// The handles drive a real plugin through the ABI and keep its library loaded
// after the registry that found it is gone.
TEST(Engine, HandlesOutliveTheRegistryAndMapErrors) {
    std::shared_ptr<EngineModel> model;
    {
        PluginRecord r = load_fixture("good");
        ASSERT_TRUE(r.accepted) << all_reasons(r);
        eh_model_view view{};
        view.struct_size = sizeof(view);
        view.format = EH_FORMAT_GGUF;
        view.architecture = {"llama", 5};
        std::vector<float> progress;
        EngineLoadOptions opt;
        opt.progress = [&](float f, const char*) { progress.push_back(f); };
        model = EngineModel::load(r.api, "/dev/null", &view, nullptr, opt);
        EXPECT_EQ(progress.back(), 1.0f);
    }
    EXPECT_EQ(model->info().vocab_size, 256u);
    std::string why;
    EXPECT_TRUE(model->check_residency(&why));

    auto s = model->create_session(8);
    eh_sampling_params sp{};
    sp.temperature = 0;
    s->set_sampling(sp);
    std::vector<int32_t> prompt = {1, 2, 3};
    s->prefill(prompt);
    int32_t t = s->sample();
    EXPECT_EQ(t, int32_t((3u * 31u + 3u * 7u + 3u) % 256u));
    int32_t next = s->decode(t);
    EXPECT_EQ(s->n_past(), 4u);
    EXPECT_GE(next, 0);
    ASSERT_TRUE(s->has_logits());
    EXPECT_EQ(s->logits().size(), 256u);

    // Four more tokens would overflow n_ctx = 8: CONTEXT_FULL, nothing appended.
    std::vector<int32_t> more = {1, 2, 3, 4, 5};
    try {
        s->prefill(more);
        FAIL() << "expected CONTEXT_FULL";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::ContextFull);
        EXPECT_NE(std::string(e.what()).find("context full"), std::string::npos);
    }
    EXPECT_EQ(s->n_past(), 4u);
    std::vector<int32_t> bad = {9999};
    EXPECT_THROW(s->prefill(bad), Error);
}

// ABI 1.4: the batched step is the forward path. A plugin with the batched
// group and no session calls at all is accepted, and the host knows it has
// no sessions (bench's session path and the SessionEngine are then refused).
TEST(Loader, StepOnlyPluginIsAccepted) {
    PluginRecord r = load_fixture("step-only");
    ASSERT_TRUE(r.accepted) << all_reasons(r);
    ASSERT_NE(r.api, nullptr);
    EXPECT_EQ(r.api->abi_minor, EH_ABI_MINOR);
    EXPECT_TRUE(api_has_step(*r.api));
    EXPECT_FALSE(api_has_sessions(*r.api));
    EXPECT_TRUE(api_has_sessions(*load_fixture("good").api));
}

TEST(Loader, SessionCallsComeAsAGroup) {
    PluginRecord r = load_fixture("mixed-sessions");
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("function table entry session_sample is NULL while other session entries are set: "
                                  "set all or none (1.4)"),
              std::string::npos) << all_reasons(r);
}

TEST(Loader, APluginNeedsSessionsOrTheBatchedStep) {
    PluginRecord r = load_fixture("no-forward");
    EXPECT_FALSE(r.accepted);
    EXPECT_NE(all_reasons(r).find("function table has neither the session entries nor the batched (1.2) entries"),
              std::string::npos) << all_reasons(r);
}

// A load spanning more devices than the plugin's info allows (the test
// engine says nothing: one device) is refused before model_load, naming the
// plugin and the count.
TEST(Loader, ADeviceSetPastThePluginsMaxDevicesIsRefusedByName) {
    PluginRecord r = load_fixture("good");
    ASSERT_TRUE(r.accepted) << all_reasons(r);
    EngineLoadOptions o;
    o.devices = {0, 1};
    try {
        EngineModel::load(r.api, "none", nullptr, nullptr, o);
        FAIL() << "a two-device load of a one-device plugin was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::ModelLoadFailed);
        EXPECT_NE(std::string(e.what()).find("plugin test-engine serves one device only; 2 were asked for"),
                  std::string::npos)
            << e.what();
    }
}
