// Boost.Program_options glue shared by the subcommands.
#pragma once

#include <boost/program_options.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"

namespace eh::cli {

namespace po = boost::program_options;

// Parses `args` against `desc`; prints help (and returns false with
// exit_code = 0) for --help, or an error (exit_code = 2) for bad input.
inline bool parse_options(const std::vector<std::string>& args, const po::options_description& desc,
                          const char* usage, po::variables_map& vm, int& exit_code,
                          const po::positional_options_description* positional = nullptr) {
    try {
        po::command_line_parser parser(args);
        // No prefix guessing: `serve --plugin X` must be an unknown option,
        // not a silent `--plugins X` (which then fails as a directory).
        parser.style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing);
        parser.options(desc);
        if (positional) parser.positional(*positional);
        po::store(parser.run(), vm);
        if (vm.count("help")) {
            std::cout << usage << "\n\n" << desc << "\n";
            exit_code = kOk;
            return false;
        }
        po::notify(vm);
        return true;
    } catch (const po::error& e) {
        print_error(std::string(e.what()) + " (try --help)");
        exit_code = kUsage;
        return false;
    }
}

// The same for the options `add` declares.
inline bool parse_options(const std::vector<std::string>& args, void (*add)(po::options_description&),
                          const char* usage, po::variables_map& vm, int& exit_code) {
    po::options_description desc("Options");
    add(desc);
    return parse_options(args, desc, usage, vm, exit_code);
}

// --plugins DIR, repeatable; none = the default search (plugin_search.hpp).
inline std::vector<std::string> plugins_arg(const po::variables_map& vm) {
    return vm.count("plugins") ? vm["plugins"].as<std::vector<std::string>>() : std::vector<std::string>{};
}
inline constexpr const char* kPluginsHelp =
    "plugin directory (repeatable); default: beside the executable, the install prefix's "
    "lib/engine-host/plugins, then $ENGINE_HOST_PLUGINS";
inline constexpr const char* kModelHelp =
    "model: a GGUF file, a Hugging Face model directory, hf://ORG/REPO/FILE or ORG/REPO[:QUANT] (pulled into the hub cache)";
inline constexpr const char* kOfflineHelp = "use the hub cache only (also HF_HUB_OFFLINE=1)";

}  // namespace eh::cli
