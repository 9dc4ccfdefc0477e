#include "cli.hpp"
namespace eh::cli {
int cmd_inspect(const std::vector<std::string>&) { print_error("inspect: model reader not merged yet"); return kFailure; }
int cmd_serve(const std::vector<std::string>&) { print_error("serve: model reader not merged yet"); return kFailure; }
}
