// Name translation between Hugging Face checkpoints and GGUF, as ModelFile
// applies it to HF directories (docs/models.md has the full table).
#pragma once

#include <string>
#include <string_view>

namespace eh::model {

// config.json model_type -> GGUF architecture ("gpt_oss" -> "gpt-oss").
std::string hf_model_type_to_arch(std::string_view model_type);

// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight" for
// `arch` (a GGUF architecture name); "hf.<name>" when there is no equivalent.
std::string hf_tensor_name_to_gguf(std::string_view arch, std::string_view hf_name);

}  // namespace eh::model
