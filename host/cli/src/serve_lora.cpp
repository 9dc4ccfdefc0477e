#include "serve_lora.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include <engine_host/lora_adapter.hpp>

#include "eh/service/event_log.hpp"

namespace eh::cli {

void add_lora_options(po::options_description& desc) {
    desc.add_options()
        ("lora", po::value<std::vector<std::string>>()->composing(),
         "NAME=FILE: serve a LoRA adapter (llama.cpp's GGUF LoRA format, convert_lora_to_gguf.py) of the model; "
         "a request picks it with \"model\": \"<model>:NAME\" or \"lora\": \"NAME\" (repeatable, at most 64)")
        ("lora-scale", po::value<std::vector<std::string>>()->composing(),
         "NAME=SCALE: the adapter's multiplier (default 1; -100..100), applied as llama.cpp does: "
         "SCALE * alpha / rank, or SCALE when the file has no alpha");
}

bool read_lora_flags(const po::variables_map& vm, std::vector<LoraFlag>& out, std::string& err) {
    out.clear();
    std::set<std::string> names;
    if (vm.count("lora"))
        for (const std::string& a : vm["lora"].as<std::vector<std::string>>()) {
            const size_t eq = a.find('=');
            if (eq == std::string::npos || eq + 1 == a.size()) {
                err = "--lora takes NAME=FILE (got '" + a + "')";
                return false;
            }
            LoraFlag f{a.substr(0, eq), a.substr(eq + 1), 1.0f};
            if (!service::valid_adapter_name(f.name)) {
                err = "--lora " + a + ": an adapter name is 1-64 letters, digits, '.', '_' or '-'";
                return false;
            }
            if (!names.insert(f.name).second) {
                err = "--lora: the adapter name '" + f.name + "' is given twice";
                return false;
            }
            std::error_code ec;
            if (!std::filesystem::is_regular_file(f.path, ec)) {
                err = "--lora " + f.name + ": " + f.path + " is not a file";
                return false;
            }
            out.push_back(std::move(f));
        }
    if (out.size() > service::kMaxAdapters) {
        err = fmt::format("--lora: {} adapters; at most {} may be loaded", out.size(), service::kMaxAdapters);
        return false;
    }
    if (vm.count("lora-scale"))
        for (const std::string& a : vm["lora-scale"].as<std::vector<std::string>>()) {
            const size_t eq = a.find('=');
            auto it = std::find_if(out.begin(), out.end(),
                                   [&](const LoraFlag& f) { return eq != std::string::npos && f.name == a.substr(0, eq); });
            if (it == out.end()) {
                err = "--lora-scale takes NAME=SCALE naming a --lora adapter (got '" + a + "')";
                return false;
            }
            try {
                size_t used = 0;
                const std::string v = a.substr(eq + 1);
                const float s = std::stof(v, &used);
                if (used != v.size() || !std::isfinite(s) || s < -100.0f || s > 100.0f) throw std::invalid_argument(v);
                it->scale = s;
            } catch (const std::exception&) {
                err = "--lora-scale " + a + ": the scale must be a number between -100 and 100";
                return false;
            }
        }
    return true;
}

std::vector<std::shared_ptr<service::EngineAdapter>> load_lora_adapters(std::shared_ptr<EngineModel> model,
                                                                         const model::ModelFile& base,
                                                                         const std::vector<LoraFlag>& flags) {
    std::vector<std::shared_ptr<service::EngineAdapter>> out;
    for (const LoraFlag& f : flags) {
        const std::string where = fmt::format("LoRA adapter '{}' ({})", f.name, f.path);
        std::shared_ptr<model::ModelFile> file;
        try {
            file = model::ModelFile::open(f.path);
        } catch (const Error& e) {
            throw Error(Code::ModelLoadFailed, where + ": " + e.what());
        }
        if (file->format() != EH_FORMAT_GGUF)
            throw Error(Code::ModelLoadFailed, where + ": an adapter is a GGUF file (convert_lora_to_gguf.py writes one)");
        ehp::LoraAdapterInfo info;
        try {
            info = ehp::read_lora_adapter(file->view(), base.view());
        } catch (const ehp::Error& e) {
            throw Error(Code::ModelLoadFailed, where + ": " + e.what());
        }
        out.push_back(service::EngineAdapter::load(model, f.name, &file->view(), file, f.scale, info.alpha));
        service::log_event(spdlog::level::info, "lora_adapter_loaded",
                           {{"adapter", f.name}, {"path", f.path}, {"pairs", info.pairs.size()},
                            {"max_rank", info.max_rank}, {"alpha", info.alpha}, {"scale", f.scale},
                            {"ignored_tensors", info.ignored.size()}});
    }
    return out;
}

}  // namespace eh::cli
