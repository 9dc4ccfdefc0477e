// Which GGUF of a repository `ORG/REPO[:QUANT]` means, from its file list.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eh/model/gguf_split.hpp"

namespace eh::hub {

inline constexpr int kMaxShards = model::kMaxSplitShards;  // NAME-0000k-of-0000N.gguf with N above this is refused

// The split naming convention is the model library's (eh/model/gguf_split.hpp).
using model::parse_split;
using model::SplitName;

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

// The vision projector beside `model` (a repository path, as choose_gguf
// gives it): an mmproj*.gguf (case-insensitive) in the model's folder; of
// several, the F16 one (the converter's default), then BF16, F32, Q8_0 by
// their quant label, else the first by name. None when the folder has none.
std::optional<std::string> choose_mmproj(const std::vector<std::string>& files, const std::string& model);

}  // namespace eh::hub
