#include "cli.hpp"
namespace eh::cli {
// Replaced when the model reader (host/model) lands.
int cmd_inspect(const std::vector<std::string>&) { print_error("inspect: model reader not built yet"); return kFailure; }
}
