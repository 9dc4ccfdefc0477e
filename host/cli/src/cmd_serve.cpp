#include "cli.hpp"
namespace eh::cli {
// Replaced by the HTTP server work (host/service, host/http).
int cmd_serve(const std::vector<std::string>&) { print_error("serve: HTTP server not built yet"); return kFailure; }
}
