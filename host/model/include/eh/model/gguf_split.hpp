// Split GGUF files. llama.cpp's gguf-split cuts one model into shards named
// PREFIX-00001-of-0000N.gguf ... PREFIX-0000N-of-0000N.gguf. Every shard is a
// complete GGUF file carrying `split.no` (0-based) and `split.count`; the first
// also carries the model's metadata and `split.tensors.count` (the tensors of
// all shards together). Any shard may hold any number of tensors (the first
// may hold none). ModelFile::open on the first shard opens them all as one
// model (docs/models.md, "Split GGUF files").
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace eh::model {

inline constexpr int kMaxSplitShards = 1000;  // a set of more shards is refused

// "dir/model-00002-of-00005.gguf" -> {"dir/model", 2, 5} (index 1-based);
// nullopt for any other name.
struct SplitName {
    std::string prefix;
    int index = 0;
    int count = 0;
};
std::optional<SplitName> parse_split(std::string_view file);

// The name of shard `index` (1-based) of `count`.
std::string split_file_name(std::string_view prefix, int index, int count);

}  // namespace eh::model
