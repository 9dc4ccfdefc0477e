// Helpers for loader tests: copy a built fixture plugin into a scratch
// folder and rewrite its manifest.
#pragma once

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

namespace eh::test {

namespace fs = std::filesystem;

inline std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

inline void write_file(const fs::path& p, const std::string& s) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << s;
}

inline void replace_all(std::string& s, const std::string& from, const std::string& to) {
    for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
        s.replace(pos, from.size(), to);
}

// A fresh folder under the system temp dir, removed at destruction.
struct ScratchDir {
    fs::path path;
    ScratchDir() {
        std::random_device rd;
        path = fs::temp_directory_path() / ("eh-test-" + std::to_string(rd()) + std::to_string(rd()));
        fs::create_directories(path);
    }
    ~ScratchDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

// Copies every file of test-plugins/<name>/ into `dest`.
inline void copy_fixture(const std::string& name, const fs::path& dest) {
    for (const auto& e : fs::directory_iterator(fs::path(EH_TEST_PLUGIN_DIR) / name))
        fs::copy_file(e.path(), dest / e.path().filename(), fs::copy_options::overwrite_existing);
}

inline fs::path manifest_in(const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().string().ends_with(".manifest.json")) return e.path();
    return {};
}

}  // namespace eh::test
