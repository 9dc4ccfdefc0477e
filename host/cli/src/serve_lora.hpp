// serve --lora NAME=FILE and --lora-scale NAME=SCALE: the LoRA adapters a
// server loads beside its model (llama.cpp's GGUF LoRA format), checked
// before anything starts, then opened, checked against the model and loaded
// into the plugin (ABI 1.6) once the model is.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "eh/loader/engine.hpp"
#include "eh/model/model_file.hpp"
#include "eh/service/lora.hpp"
#include "options.hpp"

namespace eh::cli {

struct LoraFlag {
    std::string name;
    std::string path;
    float scale = 1.0f;
};

// The flags' help lines.
void add_lora_options(po::options_description& desc);

// --lora and --lora-scale as checked adapters: names valid and distinct, at
// most service::kMaxAdapters, files that exist, scales finite in [-100, 100]
// naming a --lora. False with `err` set.
bool read_lora_flags(const po::variables_map& vm, std::vector<LoraFlag>& out, std::string& err);

// Opens each adapter file, checks it against `base` (ehp::read_lora_adapter)
// and loads it into `model`'s plugin, logging each. Throws
// Error(ModelLoadFailed) naming the adapter and its file.
std::vector<std::shared_ptr<service::EngineAdapter>> load_lora_adapters(std::shared_ptr<EngineModel> model,
                                                                         const model::ModelFile& base,
                                                                         const std::vector<LoraFlag>& flags);

}  // namespace eh::cli
