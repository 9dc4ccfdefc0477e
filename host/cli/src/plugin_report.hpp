// Human and JSON renderings of plugin records, shared by `plugins`,
// `inspect` and the server's /capabilities.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "eh/registry.hpp"

namespace eh::cli {

nlohmann::json record_json(const PluginRecord& r);
nlohmann::json registry_json(const Registry& reg);
std::string registry_table(const Registry& reg);

}  // namespace eh::cli
