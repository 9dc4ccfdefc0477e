// Which GGUF of a repository `ORG/REPO[:QUANT]` means, from its file list.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace eh::hub {

inline constexpr int kMaxShards = 1000;  // NAME-0000k-of-0000N.gguf with N above this is refused

// "dir/model-00002-of-00005.gguf" -> {"dir/model", 2, 5}.
struct SplitName {
    std::string prefix;
    int index = 0;
    int count = 0;
};
std::optional<SplitName> parse_split(std::string_view file);

// Every file of the set `file` belongs to, first shard first; {file} when it
// is not split. Throws InvalidRequest for more than kMaxShards.
std::vector<std::string> shard_set(const std::string& file);

// The label a file is chosen by: the stem's last '-' or '.' separated token
// ("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf" -> "Q4_K_M").
std::string quant_label(std::string_view file);

// The GGUF to fetch (its first shard when split). With a quant: the one file
// (or split set) whose name carries it as a token, case-insensitively. Without:
// the only GGUF, else the Q4_K_M one. mmproj* files (vision projectors) are
// never chosen. Throws NotFound / InvalidRequest with the choices listed.
std::string choose_gguf(const std::vector<std::string>& files, const std::string& quant, const std::string& repo_shown);

}  // namespace eh::hub
