#pragma once

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

#include "eh/error.hpp"
#include "eh/tools/convert.hpp"

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

// dir/config.json: `config` with `from` (which must be in it) replaced by `to`.
inline void write_edited_config(const std::filesystem::path& dir, std::string config, const std::string& from,
                                const std::string& to) {
    const size_t at = config.find(from);
    if (at == std::string::npos) ADD_FAILURE() << "'" << from << "' is not in the config";
    else config.replace(at, from.size(), to);
    std::ofstream(dir / "config.json", std::ios::trunc) << config;
}

// The error `convert` refuses directory `dir` with (F32 into `out`); a
// conversion that succeeds is a test failure and gives nullopt.
inline std::optional<eh::Error> convert_refusal(const std::filesystem::path& dir, const std::string& out) {
    try {
        convert_hf({dir.string(), out, parse_quant_target("F32"), 1, {}});
    } catch (const eh::Error& e) {
        return e;
    }
    ADD_FAILURE() << "converted " << dir.string();
    return std::nullopt;
}

}  // namespace eh::tools::test
