// `engine-host pull REF` and `--model REF`: a hub reference to a file in the
// local hub cache (downloading what is missing), a local path to itself.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "eh/hub/ref.hpp"
#include "eh/hub/settings.hpp"

namespace eh::hub {

inline constexpr int kMaxTreePages = 100;  // the tree API's pages followed for one listing

struct PullOptions {
    Settings settings;
    // Bytes of one file so far; called often, the caller throttles.
    std::function<void(const std::string& file, uint64_t done, uint64_t total)> progress;
    // One line for the user ("using the cached copy ...").
    std::function<void(const std::string& line)> log;
};

struct PullResult {
    std::filesystem::path path;       // the model file (a split set's first shard)
    // The vision projector beside it (choose_mmproj), fetched with it for a
    // repository reference (ORG/REPO[:QUANT]) whose listing has one; empty
    // otherwise (a hf://.../FILE reference names its one file).
    std::filesystem::path mmproj;
    std::string repo_id;
    std::string commit;
    std::vector<std::string> files;   // every file fetched or found, repository paths (the projector last)
    bool offline = false;             // served from the cache without asking the hub
};

// A hub reference into the cache. Online, the hub is asked for the current
// commit and missing files are downloaded; offline (settings.offline), or
// when the hub cannot be reached and the cache has the files, the cache
// answers. Throws NotFound (nothing cached / not on the hub), InvalidRequest
// (ambiguous quantization) or ModelLoadFailed (download or hash failure).
PullResult pull(const ModelRef& ref, const PullOptions& options);

// The repository's file paths at `revision` (the tree API, all pages).
std::vector<std::string> list_repo_files(const PullOptions& options, const std::string& repo_id,
                                         const std::string& revision);

// `--model REF`: a local path as given, a hub reference pulled.
std::string resolve_model(const std::string& ref_text, const PullOptions& options);

}  // namespace eh::hub
