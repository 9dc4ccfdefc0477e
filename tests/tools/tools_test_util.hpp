#pragma once

#include <filesystem>
#include <string>

#include <unistd.h>

namespace eh::tools::test {

// A fresh directory under the system temp dir, removed with the object.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        path = std::filesystem::temp_directory_path() /
               ("eh-tools-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
        std::filesystem::create_directories(path);
    }
    ~TempDir() { std::error_code ec; std::filesystem::remove_all(path, ec); }
    std::string file(const std::string& name) const { return (path / name).string(); }
    static int& counter() { static int c = 0; return c; }
};

inline std::string testdata(const std::string& rel) { return std::string(EH_TESTDATA_DIR) + "/" + rel; }

}  // namespace eh::tools::test
