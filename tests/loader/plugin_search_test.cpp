// Where plugins are looked for without --plugins, and discovery over several
// directories (the first directory's copy of a plugin wins).
#include <gtest/gtest.h>

#include <filesystem>

#include "eh/error.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/loader/plugin_search.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using eh::loader::default_plugin_dirs;
using eh::loader::PluginSearchInputs;
using eh::test::ScratchDir;

namespace {

std::string canon(const fs::path& p) { return fs::canonical(p).string(); }

}  // namespace

TEST(PluginSearch, OrderIsBesideTheExecutableThenPrefixThenEnvironment) {
    ScratchDir t;
    for (const char* d : {"bin/plugins", "plugins", "lib/engine-host/plugins", "prefix/lib/engine-host/plugins", "e1", "e2"})
        fs::create_directories(t.path / d);
    PluginSearchInputs in;
    in.executable = (t.path / "bin/engine-host").string();
    in.install_prefix = (t.path / "prefix").string();
    in.env = (t.path / "e1").string() + "::" + (t.path / "missing").string() + ":" + (t.path / "e2").string();
    EXPECT_EQ(default_plugin_dirs(in),
              (std::vector<std::string>{canon(t.path / "bin/plugins"), canon(t.path / "plugins"),
                                        canon(t.path / "lib/engine-host/plugins"),
                                        canon(t.path / "prefix/lib/engine-host/plugins"), canon(t.path / "e1"),
                                        canon(t.path / "e2")}));
}

TEST(PluginSearch, MissingDirectoriesAreSkippedAndDuplicatesKeptOnce) {
    ScratchDir t;
    fs::create_directories(t.path / "lib/engine-host/plugins");
    PluginSearchInputs in;
    in.executable = (t.path / "bin/engine-host").string();
    in.install_prefix = t.path.string();  // installed where it runs: the same directory twice
    in.env = (t.path / "lib/engine-host/plugins/").string();
    EXPECT_EQ(default_plugin_dirs(in), std::vector<std::string>{canon(t.path / "lib/engine-host/plugins")});
    EXPECT_TRUE(default_plugin_dirs(PluginSearchInputs{"/no/such/bin/x", "/no/such", "/no/such/dir"}).empty());
}

TEST(PluginSearch, ExplicitDirectoriesReplaceTheSearch) {
    EXPECT_EQ(eh::loader::plugin_dirs({"/a", "/b"}), (std::vector<std::string>{"/a", "/b"}));
}

TEST(PluginSearch, TheFirstDirectorysCopyOfAPluginServes) {
    ScratchDir a, b;
    eh::test::copy_fixture("good", a.path);
    eh::test::copy_fixture("good", b.path);
    eh::test::copy_fixture("crash", b.path);
    eh::Registry reg = eh::loader::discover_plugins(std::vector<std::string>{a.path.string(), b.path.string()});
    ASSERT_EQ(reg.accepted().size(), 1u);
    EXPECT_EQ(fs::path(reg.accepted()[0]->library_path).parent_path(), a.path);
    bool shadowed = false;
    for (const auto* r : reg.rejected())
        for (const auto& why : r->reasons)
            shadowed |= why.find("a plugin named test-engine was already found in " + a.path.string()) != std::string::npos;
    EXPECT_TRUE(shadowed);
    EXPECT_EQ(reg.rejected().size(), 2u);  // the second copy and the crashing plugin
    EXPECT_THROW(eh::loader::discover_plugins(std::vector<std::string>{a.path.string(), "/no/such/plugins"}), eh::Error);
}
