// What `--model REF` and `engine-host pull REF` accept:
//   a local path           ./model.gguf, /models/x, an existing file or directory
//   hf://ORG/REPO/FILE     one file of a hub repository (FILE may hold '/'; it is
//                          percent-decoded, then may hold no '.', '..' or empty segment)
//   ORG/REPO[:QUANT]       the repository's GGUF of that quantization
// A hub reference may name a revision after the repository, REPO@REV (a
// branch, tag or commit hash without '/'); the default is main.
// Parsing is pure (no network); `exists` decides whether text naming an
// existing path is a local path even when it looks like ORG/REPO.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace eh::hub {

// Limits (docs/pull.md). Longer input is rejected with InvalidRequest.
inline constexpr size_t kMaxRefBytes = 2048;
inline constexpr size_t kMaxRepoPartBytes = 96;   // ORG and REPO each, as the hub allows
inline constexpr size_t kMaxQuantBytes = 32;
inline constexpr size_t kMaxRevisionBytes = 128;

struct ModelRef {
    enum class Kind { LocalPath, HubFile, HubRepo };
    Kind kind = Kind::LocalPath;
    std::string path;      // LocalPath
    std::string org;       // HubFile, HubRepo
    std::string repo;
    std::string file;      // HubFile: path inside the repository, percent-decoded
    std::string quant;     // HubRepo: "" = choose (docs/pull.md)
    std::string revision = "main";

    bool is_hub() const { return kind != Kind::LocalPath; }
    std::string repo_id() const { return org + "/" + repo; }
    std::string display() const;  // the reference as a user would type it
};

// Throws eh::Error(InvalidRequest) naming the rule a reference breaks.
ModelRef parse_ref(std::string_view text, const std::function<bool(const std::string&)>& exists = {});

// The hub's rules for an organisation or repository name, and for a file
// path inside a repository; "" when valid, else why not.
std::string repo_part_problem(std::string_view part);
std::string repo_file_problem(std::string_view file);
std::string revision_problem(std::string_view rev);

}  // namespace eh::hub
