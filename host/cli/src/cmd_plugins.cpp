// `engine-host plugins`: every plugin in a directory, accepted or rejected,
// with every reason — the first thing to run when a model is not served.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "cli.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/loader/plugin_search.hpp"
#include "options.hpp"
#include "plugin_report.hpp"

namespace eh::cli {

int cmd_plugins(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("plugins", po::value<std::vector<std::string>>(), kPluginsHelp)
        ("gpu", po::value<int>()->default_value(0), "GPU ordinal the plugins are probed on")
        ("json", "print JSON instead of a table");
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, desc, "Usage: engine-host plugins [--plugins DIR]... [--json] [--gpu N]", vm, code))
        return code;

    loader::LoaderOptions opt;
    opt.device = vm["gpu"].as<int>();
    std::vector<std::string> dirs = loader::plugin_dirs(plugins_arg(vm));
    Registry reg = loader::discover_plugins(dirs, opt);
    if (vm.count("json")) {
        nlohmann::json out = {{"plugin_dir", dirs.front()}, {"plugin_dirs", dirs}, {"plugins", registry_json(reg)}};
        std::cout << out.dump(2) << "\n";
    } else {
        if (!vm.count("plugins")) std::cout << "searched: " << loader::join_dirs(dirs) << "\n";
        std::cout << registry_table(reg);
    }
    return reg.accepted().empty() ? kNoPlugin : kOk;
}

}  // namespace eh::cli
