// `engine-host pull REF`: a hub model into the local Hugging Face hub cache;
// prints the local path. docs/pull.md.
#include <nlohmann/json.hpp>

#include <iostream>

#include "cli.hpp"
#include "model_ref.hpp"
#include "options.hpp"

namespace eh::cli {

int cmd_pull(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("ref", po::value<std::string>()->required(), "hf://ORG/REPO[@REV]/FILE or ORG/REPO[@REV][:QUANT]")
        ("offline", "use the hub cache only (also HF_HUB_OFFLINE=1): say where the model is, or fail")
        ("json", "print {path, mmproj, repo, commit, files, offline} instead of the path");
    po::positional_options_description pos;
    pos.add("ref", 1);
    po::variables_map vm;
    const char* usage = "Usage: engine-host pull REF [--offline] [--json]\n"
                        "  REF: hf://ORG/REPO[@REV]/FILE, or ORG/REPO[@REV][:QUANT] (e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M)";
    int code = kOk;
    if (!parse_options(args, desc, usage, vm, code, &pos)) return code;

    hub::ModelRef ref = hub::parse_ref(vm["ref"].as<std::string>());
    if (!ref.is_hub()) {
        print_error("'" + ref.path + "' is not a hub reference: use hf://ORG/REPO/FILE or ORG/REPO[:QUANT]");
        return kUsage;
    }
    hub::PullResult r = hub::pull(ref, pull_options(vm.count("offline") > 0));
    if (vm.count("json")) {
        nlohmann::json j = {{"path", r.path.string()}, {"repo", r.repo_id}, {"commit", r.commit},
                            {"files", r.files}, {"offline", r.offline}};
        j["mmproj"] = r.mmproj.empty() ? nlohmann::json() : nlohmann::json(r.mmproj.string());
        std::cout << j.dump(2) << "\n";
    } else {
        std::cout << r.path.string() << "\n";
    }
    return kOk;
}

}  // namespace eh::cli
