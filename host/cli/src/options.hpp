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
                          const char* usage, po::variables_map& vm, int& exit_code) {
    try {
        po::store(po::command_line_parser(args).options(desc).run(), vm);
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

}  // namespace eh::cli
