// `engine-host inspect`: what a model file is, and which plugin would serve
// it (by serve's rule, --device). Reads only headers (the file is mapped,
// never loaded into a plugin).
#include <nlohmann/json.hpp>

#include <iostream>

#include "cli.hpp"
#include "device_choice.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/descriptor.hpp"
#include "eh/model/inspect.hpp"
#include "eh/model/model_file.hpp"
#include "model_ref.hpp"
#include "options.hpp"
#include "plugin_report.hpp"

namespace eh::cli {

int cmd_inspect(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("model,m", po::value<std::string>()->required(), kModelHelp)
        ("offline", kOfflineHelp)
        ("plugins", po::value<std::vector<std::string>>(), "plugin directory (repeatable): also say which plugin would serve the model")
        ("gpu", po::value<int>()->default_value(0), kGpuHelp)
        ("device", po::value<std::string>()->default_value("auto"), "which kind of plugin may serve it, as serve's --device: auto, gpu, cpu or any")
        ("tensors", "list every tensor")
        ("json", "print JSON instead of text");
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, desc, "Usage: engine-host inspect --model REF [--plugins DIR] [--json] [--tensors]", vm, code))
        return code;

    DevicePolicy policy;
    if (!parse_device_policy(vm["device"].as<std::string>(), policy)) {
        print_error("--device must be auto, gpu, cpu or any");
        return kUsage;
    }
    auto file = model::ModelFile::open(resolve_model_ref(vm["model"].as<std::string>(), vm.count("offline") > 0));
    model::ModelDescriptor d = model::describe(*file);
    model::InspectOptions opt;
    opt.list_tensors = vm.count("tensors") > 0;
    append_tokenizer_section(*file, opt.extra_sections);

    int exit = kOk;
    if (vm.count("plugins")) {
        loader::LoaderOptions lo;
        lo.device = vm["gpu"].as<int>();
        Registry reg = loader::discover_plugins(plugins_arg(vm), lo);
        Resolution res = reg.resolve(d.requirements(), policy);
        model::InspectSection s{"Plugin", {}, {}};
        const std::string gpu_problem =
            vm["gpu"].defaulted() ? "" : named_gpu_problem(reg, vm["gpu"].as<int>(), policy);
        if (!gpu_problem.empty()) {
            s.facts = {{"serves it", "none"}, {"why", gpu_problem}};
            s.raw_json = nlohmann::json{{"plugin", nullptr}, {"why", gpu_problem}}.dump();
            exit = kNoPlugin;
        } else if (res.plugin) {
            s.facts = {{"serves it", res.plugin->caps.name + " " + res.plugin->caps.version},
                       {"why", res.explanation}};
            s.raw_json = nlohmann::json{{"plugin", record_json(*res.plugin)}, {"why", res.explanation}}.dump();
        } else {
            const std::string why = no_plugin_message(reg, d.requirements(), res);
            s.facts = {{"serves it", "none"}, {"why", why}};
            s.raw_json = nlohmann::json{{"plugin", nullptr}, {"why", why}}.dump();
            exit = kNoPlugin;
        }
        opt.extra_sections.push_back(std::move(s));
    }
    std::cout << (vm.count("json") ? model::inspect_json(*file, opt) + "\n" : model::inspect_text(*file, opt));
    return exit;
}

}  // namespace eh::cli
