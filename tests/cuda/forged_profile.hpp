// Forged tiny models (eh::tools::forge, synthetic vocabulary) for the GPU
// tests, made once per process in a temporary folder of the test's own
// (`tag` and the process id), and what the tests derive from them: the
// vocabulary size and fixed token sequences.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <eh/model/model_file.hpp>
#include <eh/tools/forge.hpp>

#include "step_seq.hpp"

namespace ehtest {

inline std::filesystem::path forge_dir(const std::string& tag) {
    return std::filesystem::temp_directory_path() / (tag + "_" + std::to_string(::getpid()));
}

// `profile` forged with `seed` (a test uses one seed for every profile).
inline const eh::model::ModelFile& forged_file(const std::string& tag, const std::string& profile, uint32_t seed) {
    static std::map<std::string, std::unique_ptr<eh::model::ModelFile>> files;
    const std::filesystem::path dir = forge_dir(tag);
    auto& f = files[(dir / profile).string()];
    if (!f) {
        std::filesystem::create_directories(dir);
        eh::tools::ForgeOptions o;
        o.profile = profile;
        o.out = (dir / (profile + ".gguf")).string();
        o.seed = seed;
        o.vocab = "none";
        eh::tools::forge(o);
        f = eh::model::ModelFile::open(o.out);
    }
    return *f;
}

// A profile with its mmproj (model.gguf, mmproj.gguf in the tag's folder).
struct ForgedWithProjector {
    std::unique_ptr<eh::model::ModelFile> model, mmproj;
    std::filesystem::path dir;
    ForgedWithProjector(const std::string& tag, const std::string& profile, uint32_t seed) : dir(forge_dir(tag)) {
        std::filesystem::create_directories(dir);
        eh::tools::ForgeOptions o;
        o.profile = profile;
        o.out = (dir / "model.gguf").string();
        o.mmproj_out = (dir / "mmproj.gguf").string();
        o.seed = seed;
        o.vocab = "none";
        eh::tools::forge(o);
        model = eh::model::ModelFile::open(o.out);
        mmproj = eh::model::ModelFile::open(o.mmproj_out);
    }
};

inline uint32_t vocab_size(const eh_plugin_api* api, const eh_model* m) {
    eh_model_info info{};
    info.struct_size = sizeof info;
    EXPECT_EQ(api->model_get_info(m, &info), EH_OK);
    return info.vocab_size;
}
inline uint32_t vocab_size(const StepModel& m) { return vocab_size(m.api, m.model); }

// n tokens below vocab, a different sequence for each salt.
inline std::vector<int32_t> tokens_of(size_t n, uint32_t salt, uint32_t vocab) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7919 + salt * 104729 + 11) % vocab);
    return t;
}

}  // namespace ehtest
