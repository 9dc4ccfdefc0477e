// NCCL loaded at run time (ehcuda/nccl.hpp): a library that is not there is
// a clear UNSUPPORTED naming it, never a crash; where the system has
// libnccl.so.2 (the GPU machine) it loads and says a 2.x version.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <string>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/nccl.hpp>

namespace {

std::string load_error(const char* lib) {
    try {
        ehcuda::nccl::load(lib);
    } catch (const ehp::Error& e) {
        EXPECT_EQ(e.status(), EH_UNSUPPORTED) << e.what();
        return e.what();
    }
    return "";
}

TEST(NcclLoader, AbsentLibraryIsUnsupportedNamingIt) {
    const std::string msg = load_error("libnccl-absent-for-test.so.2");
    EXPECT_NE(msg.find("NCCL is not available: dlopen(libnccl-absent-for-test.so.2) failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("needs NCCL 2.x"), std::string::npos) << msg;
    // asked again: the same answer (nothing half-loaded is kept)
    EXPECT_EQ(load_error("libnccl-absent-for-test.so.2"), msg);
}

TEST(NcclLoader, ALibraryWithoutNcclsSymbolsIsUnsupportedNamingTheSymbol) {
    const std::string msg = load_error("libc.so.6");
    EXPECT_NE(msg.find("libc.so.6 has no symbol ncclGetVersion"), std::string::npos) << msg;
}

TEST(NcclLoader, TheSystemLibraryLoadsWhereItIsInstalled) {
    void* h = dlopen(ehcuda::nccl::kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        // This machine has none: the default load says so by name.
        const std::string msg = load_error(nullptr);
        EXPECT_NE(msg.find("dlopen(libnccl.so.2) failed"), std::string::npos) << msg;
        return;
    }
    dlclose(h);
    const ehcuda::nccl::Api& a = ehcuda::nccl::load();
    EXPECT_GE(a.version, 20000);
    EXPECT_NE(a.all_reduce, nullptr);
}

}  // namespace
