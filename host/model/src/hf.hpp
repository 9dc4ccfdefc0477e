// Hugging Face model directories: safetensors shards, config.json
// translation into GGUF metadata keys, and tensor-name translation.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "model_data.hpp"

namespace eh::model::detail {

// Adds every tensor of one .safetensors file to `m`, renamed by `rename`.
// Validates the header (length, JSON, dtype, shape, data_offsets inside the
// file, no overlaps); errors name `label`, the tensor and the offset.
void read_safetensors(ModelData& m, std::shared_ptr<const MappedFile> file, const std::string& label,
                      const std::function<std::string(std::string_view)>& rename);

// The GGUF architecture name for a config.json model_type ("gpt_oss" -> "gpt-oss").
std::string hf_architecture(std::string_view model_type);

// config.json text -> GGUF-named metadata in `m` (general.architecture,
// "{arch}.block_count", ...; untranslated keys as "hf.<path>"). Returns the
// architecture.
std::string translate_hf_config(ModelData& m, std::string_view json, const std::string& label);

// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight"; names
// with no GGUF equivalent come back as "hf.<name>".
std::string hf_tensor_name(std::string_view arch, std::string_view hf_name);

}  // namespace eh::model::detail
