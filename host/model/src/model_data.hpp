// The state behind a ModelFile, filled in by a format reader (GGUF,
// safetensors directory) and then frozen into an eh_model_view.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "arena.hpp"
#include "eh/model/model_file.hpp"
#include "mapped_file.hpp"

namespace eh::model::detail {

struct ModelData {
    std::string path;
    eh_model_format format = EH_FORMAT_GGUF;
    uint32_t gguf_version = 0;
    uint64_t alignment = 0;
    uint64_t data_offset = 0;
    uint64_t file_size = 0;
    std::vector<std::string> weight_files;

    std::vector<std::shared_ptr<const MappedFile>> maps;  // keep tensor data alive
    Arena arena;
    std::vector<eh_metadata_kv> metadata;
    std::vector<eh_tensor> tensors;
    std::unordered_map<std::string_view, size_t> key_index;     // views into arena
    std::unordered_map<std::string_view, size_t> tensor_index;  // views into arena
    eh_model_view view{};

    eh_string intern(std::string_view s) {
        return eh_string{arena.copy_string(s), static_cast<uint64_t>(s.size())};
    }

    // Both return false (and add nothing) when the name is already taken;
    // the caller reports the duplicate with its own context.
    bool add_kv(std::string_view key, const eh_value& value);
    bool add_tensor(const eh_tensor& t);  // t.name must already be interned

    // Scalar helpers for readers that synthesise metadata (HF configs).
    void set_string(std::string_view key, std::string_view value);
    void set_u32(std::string_view key, uint32_t value);
    void set_f32(std::string_view key, float value);
    void set_bool(std::string_view key, bool value);

    // Points the view at the vectors; call once everything is added.
    void finish();

    static std::unique_ptr<ModelFile> make_file(std::unique_ptr<ModelData> d);
};

// Format readers (one file each).
void read_gguf(ModelData& m, std::shared_ptr<const MappedFile> file, const std::string& label);
void read_hf_directory(ModelData& m, const std::string& dir);
// After read_gguf of a split set's first shard (m.path): adds every other
// shard's tensors (gguf_split.cpp). Does nothing for a file that is not split.
void read_gguf_shards(ModelData& m);

}  // namespace eh::model::detail
