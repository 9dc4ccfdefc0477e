// Human and machine renderings of a model file, for `engine-host inspect`.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "eh/model/model_file.hpp"

namespace eh::model {

// A block of facts the caller adds (the CLI appends the tokenizer's).
struct InspectSection {
    std::string title;                                    // "Tokenizer"
    std::vector<std::pair<std::string, std::string>> facts;  // shown in order
    // JSON only: when non-empty, this JSON text is the section's value
    // instead of an object built from `facts`. Must be valid JSON.
    std::string raw_json;
};

struct InspectOptions {
    bool list_metadata = true;    // every metadata key with its value
    bool list_tensors = false;    // every tensor: name, type, dims, bytes
    size_t max_array_items = 8;   // arrays show their first N elements and their length
    size_t max_string_bytes = 200;  // longer strings (chat templates) are cut, with a note
    std::vector<InspectSection> extra_sections;
};

// Multi-line text, ending in a newline.
std::string inspect_text(const ModelFile& file, const InspectOptions& options = {});

// One JSON object:
//   { "path", "format", "gguf_version", "alignment", "data_offset", "file_size",
//     "weight_files": [..], "model": {descriptor fields}, "requirements": {..},
//     "metadata": [{"key","type","value"} | {"key","type":"array","elem_type","count","value":[first N]}],
//     "tensors": [{"name","type","dims","bytes"}]   (only with list_tensors),
//     "extra": {"<title>": {facts} or raw_json} }
std::string inspect_json(const ModelFile& file, const InspectOptions& options = {});

}  // namespace eh::model
