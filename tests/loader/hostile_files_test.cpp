// Hostile files (issue 26, item 3): FIFOs, devices, directories and huge
// files named as a manifest, a plugin library or a model are refused at once
// with a reason, never read until EOF or waited on.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>

#include "eh/error.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/model_file.hpp"
#include "test_util.hpp"

using namespace eh;
using namespace eh::loader;
using eh::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// Runs `fn` on a helper thread; a call still blocked after 10 s fails the
// test and ends the process (a blocked open() cannot be interrupted).
template <class F>
auto within_10s(F fn) {
    auto fut = std::async(std::launch::async, fn);
    if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
        ADD_FAILURE() << "call still blocked after 10 s";
        std::fflush(stdout);
        std::_Exit(1);
    }
    return fut.get();
}

std::string reasons_of(const Registry& reg, const std::string& name) {
    for (const auto& r : reg.records())
        if (r.caps.name == name) {
            std::string s;
            for (const auto& x : r.reasons) s += x + "\n";
            return s;
        }
    return "<no record named " + name + ">";
}

TEST(HostileFiles, NonRegularManifestsAreRejectedAndTheGoodPluginKept) {
    ScratchDir dir;
    eh::test::copy_fixture("good", dir.path);
    ASSERT_EQ(::mkfifo((dir.path / "fifo.manifest.json").c_str(), 0600), 0);
    fs::create_symlink("/dev/zero", dir.path / "zero.manifest.json");
    fs::create_directory(dir.path / "folder.manifest.json");
    Registry reg = within_10s([&] { return discover_plugins(dir.path.string()); });
    ASSERT_EQ(reg.accepted().size(), 1u);
    EXPECT_EQ(reg.accepted()[0]->caps.name, "test-engine");
    for (const char* name : {"fifo.manifest.json", "zero.manifest.json", "folder.manifest.json"}) {
        std::string why = reasons_of(reg, name);
        EXPECT_NE(why.find("is not a regular file"), std::string::npos) << name << ": " << why;
    }
}

TEST(HostileFiles, OversizedManifestIsRejectedBeforeParsing) {
    ScratchDir dir;
    eh::test::copy_fixture("good", dir.path);
    std::string m = eh::test::read_file(eh::test::manifest_in(dir.path));
    // Valid JSON, padded past the 64 KiB cap with whitespace.
    eh::test::write_file(dir.path / "big.manifest.json", m + std::string(70 * 1024, ' '));
    Registry reg = within_10s([&] { return discover_plugins(dir.path.string()); });
    std::string why = reasons_of(reg, "big.manifest.json");
    EXPECT_NE(why.find("larger than the limit of 65536 bytes"), std::string::npos) << why;
    EXPECT_EQ(reg.accepted().size(), 1u);
}

TEST(HostileFiles, LibraryThatIsAFifoIsRejected) {
    ScratchDir dir;
    eh::test::copy_fixture("good", dir.path);
    fs::path manifest = eh::test::manifest_in(dir.path);
    std::string m = eh::test::read_file(manifest);
    eh::test::replace_all(m, "libeh-test-engine.so", "libfifo.so");
    eh::test::write_file(manifest, m);
    ASSERT_EQ(::mkfifo((dir.path / "libfifo.so").c_str(), 0600), 0);
    PluginRecord r = within_10s([&] { return load_plugin(manifest.string()); });
    EXPECT_FALSE(r.accepted);
    std::string why;
    for (const auto& x : r.reasons) why += x + "\n";
    EXPECT_NE(why.find("is not a regular file"), std::string::npos) << why;
}

TEST(HostileFiles, ModelThatIsAFifoOrDeviceFailsToOpenAtOnce) {
    ScratchDir dir;
    fs::path fifo = dir.path / "model.gguf";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    for (const std::string& path : {fifo.string(), std::string("/dev/zero")}) {
        SCOPED_TRACE(path);
        std::string msg = within_10s([&] {
            try {
                model::ModelFile::open(path);
            } catch (const Error& e) {
                EXPECT_EQ(e.code(), Code::ModelLoadFailed);
                return std::string(e.what());
            }
            return std::string("<opened>");
        });
        EXPECT_NE(msg.find("is not a regular file"), std::string::npos) << msg;
    }
}

}  // namespace
