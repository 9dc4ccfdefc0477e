// Opening the shards of a split GGUF as one model (eh/model/gguf_split.hpp).
#include <fmt/format.h>

#include <filesystem>

#include "eh/error.hpp"
#include "eh/model/gguf_split.hpp"
#include "model_data.hpp"

namespace eh::model {

namespace detail {

namespace {

// An integer metadata value of a shard, or nullopt when absent.
std::optional<int64_t> split_key(const ModelData& m, std::string_view key, const std::string& file) {
    auto it = m.key_index.find(key);
    if (it == m.key_index.end()) return std::nullopt;
    const eh_value& v = m.metadata[it->second].value;
    switch (v.type) {
    case EH_VALUE_U8: case EH_VALUE_U16: case EH_VALUE_U32: case EH_VALUE_U64:
        if (v.v.u64 > uint64_t(INT32_MAX)) break;
        return int64_t(v.v.u64);
    case EH_VALUE_I8: case EH_VALUE_I16: case EH_VALUE_I32: case EH_VALUE_I64:
        if (v.v.i64 < 0 || v.v.i64 > INT32_MAX) break;
        return v.v.i64;
    default: break;
    }
    throw Error(Code::ModelLoadFailed, fmt::format("'{}': metadata '{}' is not a count (a {} in 0..2^31)", file, key,
                                                   value_type_name(v.type)));
}

}  // namespace

void read_gguf_shards(ModelData& m) {
    const std::string& first = m.path;
    auto count = split_key(m, "split.count", first);
    if (!count || *count <= 1) return;  // one file
    const int64_t no = split_key(m, "split.no", first).value_or(0);
    if (*count > kMaxSplitShards)
        throw Error(Code::ModelLoadFailed,
                    fmt::format("'{}' says it is one of {} shards (split.count); at most {} are read", first, *count,
                                kMaxSplitShards));
    const std::string base = std::filesystem::path(first).filename().string();
    auto name = parse_split(base);
    if (no != 0)
        throw Error(Code::ModelLoadFailed,
                    fmt::format("'{}' is shard {} of {} of a split GGUF; pass the first shard{}", first, no + 1, *count,
                                name ? " (" + split_file_name(name->prefix, 1, int(*count)) + ")" : std::string()));
    if (!name || name->index != 1 || name->count != *count)
        throw Error(Code::ModelLoadFailed,
                    fmt::format("'{}' is the first of {} shards (split.count) but is not named "
                                "PREFIX-00001-of-{:05d}.gguf, so the other shards cannot be found",
                                first, *count, *count));
    const auto tensors_total = split_key(m, "split.tensors.count", first);
    const std::filesystem::path dir = std::filesystem::path(first).parent_path();
    for (int i = 2; i <= *count; ++i) {
        const std::string path = (dir / split_file_name(name->prefix, i, int(*count))).string();
        std::error_code ec;
        if (!std::filesystem::exists(path, ec))
            throw Error(Code::ModelLoadFailed,
                        fmt::format("split GGUF shard {} of {} is missing: '{}' does not exist", i, *count, path));
        ModelData shard;
        shard.path = path;
        read_gguf(shard, MappedFile::open(path), path);
        const auto shard_no = split_key(shard, "split.no", path);
        const auto shard_count = split_key(shard, "split.count", path);
        if (shard_no != i - 1 || shard_count != *count)
            throw Error(Code::ModelLoadFailed,
                        fmt::format("'{}' is not shard {} of {}: its split.no is {} and split.count {}", path, i,
                                    *count, shard_no ? std::to_string(*shard_no) : "absent",
                                    shard_count ? std::to_string(*shard_count) : "absent"));
        for (const eh_tensor& t : shard.tensors) {
            eh_tensor copy = t;
            copy.name = m.intern(to_sv(t.name));  // the shard's arena goes away
            if (!m.add_tensor(copy))
                throw Error(Code::ModelLoadFailed,
                            fmt::format("tensor '{}' of '{}' is also in an earlier shard", to_sv(t.name), path));
        }
        for (auto& map : shard.maps) m.maps.push_back(map);  // the tensor data lives in them
        m.file_size += shard.file_size;
        m.weight_files.push_back(path);
    }
    if (tensors_total && uint64_t(*tensors_total) != m.tensors.size())
        throw Error(Code::ModelLoadFailed,
                    fmt::format("'{}': the {} shards hold {} tensors but split.tensors.count says {}", first, *count,
                                m.tensors.size(), *tensors_total));
}

}  // namespace detail

}  // namespace eh::model
