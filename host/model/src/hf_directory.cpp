// A Hugging Face model directory: config.json, tokenizer.json and the
// weights, either sharded (*.safetensors.index.json naming every shard) or
// one *.safetensors file.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <simdjson.h>

#include "eh/error.hpp"
#include "eh/file_text.hpp"
#include "hf.hpp"

namespace eh::model::detail {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void dir_fail(const std::string& dir, const std::string& what) {
    throw Error(Code::ModelLoadFailed, fmt::format("model directory '{}': {}", dir, what));
}

bool ends_with(const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Shard file names from an index, in first-mention order; checks that every
// entry names a plain file in the directory.
std::vector<std::string> index_shards(const fs::path& index, std::set<std::string>& tensor_names) {
    std::string label = index.string();
    simdjson::padded_string json(read_text_file(index));
    simdjson::dom::parser parser;
    simdjson::dom::object root, map;
    if (auto err = parser.parse(json).get(root))
        throw Error(Code::ModelLoadFailed, fmt::format("'{}' is not a JSON object: {}", label, simdjson::error_message(err)));
    if (root["weight_map"].get(map))
        throw Error(Code::ModelLoadFailed, fmt::format("'{}' has no 'weight_map' object", label));
    std::vector<std::string> shards;
    for (auto f : map) {
        std::string_view shard;
        if (f.value.get(shard))
            throw Error(Code::ModelLoadFailed, fmt::format("'{}': weight_map entry '{}' is not a string", label, f.key));
        if (shard.find('/') != std::string_view::npos || shard == ".." || shard.empty())
            throw Error(Code::ModelLoadFailed,
                        fmt::format("'{}': shard name '{}' is not a file in the directory", label, shard));
        tensor_names.insert(std::string(f.key));
        if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.emplace_back(shard);
    }
    if (shards.empty()) throw Error(Code::ModelLoadFailed, fmt::format("'{}': weight_map is empty", label));
    return shards;
}

}  // namespace

void read_hf_directory(ModelData& m, const std::string& dir) {
    fs::path root(dir);
    for (const char* required : {"config.json", "tokenizer.json"})
        if (!fs::is_regular_file(root / required)) dir_fail(dir, fmt::format("missing {}", required));

    std::vector<std::string> indexes, singles;
    for (const auto& e : fs::directory_iterator(root)) {
        if (!e.is_regular_file()) continue;
        std::string name = e.path().filename().string();
        if (ends_with(name, ".safetensors.index.json")) indexes.push_back(name);
        else if (ends_with(name, ".safetensors")) singles.push_back(name);
    }
    std::sort(indexes.begin(), indexes.end());
    std::sort(singles.begin(), singles.end());

    std::vector<std::string> shards;
    std::set<std::string> indexed;
    if (indexes.size() > 1)
        dir_fail(dir, fmt::format("several weight indexes ({}); keep one", fmt::join(indexes, ", ")));
    if (indexes.size() == 1) {
        shards = index_shards(root / indexes[0], indexed);
        for (const auto& s : shards)
            if (!fs::is_regular_file(root / s))
                dir_fail(dir, fmt::format("shard '{}' named by {} is missing", s, indexes[0]));
    } else if (singles.size() == 1) {
        shards = singles;
    } else if (singles.empty()) {
        dir_fail(dir, "no weights (expected model.safetensors or a *.safetensors.index.json with its shards)");
    } else {
        dir_fail(dir, fmt::format("several .safetensors files ({}) but no *.safetensors.index.json saying how they "
                                  "fit together",
                                  fmt::join(singles, ", ")));
    }

    std::string config_path = (root / "config.json").string();
    std::string arch = translate_hf_config(m, read_text_file(root / "config.json"), config_path);

    // Remember each GGUF name's HF original so the index check can speak HF.
    size_t first_new = m.tensors.size();
    for (const auto& s : shards) {
        std::string path = (root / s).string();
        auto file = MappedFile::open(path);
        m.file_size += file->size();
        m.weight_files.push_back(path);
        read_safetensors(m, std::move(file), path, [&](std::string_view hf) { return hf_tensor_name(arch, hf); });
    }
    for (const auto& name : indexed)
        if (!m.tensor_index.count(hf_tensor_name(arch, name)))
            dir_fail(dir, fmt::format("tensor '{}' listed in {} is in none of the shards", name, indexes[0]));
    (void)first_new;
}

}  // namespace eh::model::detail
