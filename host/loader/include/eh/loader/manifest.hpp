// Plugin manifests: the JSON sidecar beside each plugin library, read and
// validated before the library is ever opened.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "eh/registry.hpp"

namespace eh::loader {

struct Manifest {
    int manifest_version = 0;
    PluginCapabilities caps;      // name, version, engine, lists, device, priority
    uint32_t abi_major = 0;
    uint32_t abi_minor = 0;
    std::string library;          // file name, relative to the manifest's folder
    std::string sha256;           // lower-case hex
    std::string platform;         // "linux-x86_64"
};

// Parses and validates the schema. Every problem found is appended to
// `problems` (one line each, naming the field); the returned manifest holds
// whatever could be read, so rejections can still show a name.
Manifest parse_manifest(std::string_view json, std::vector<std::string>& problems);

// "linux-x86_64": what manifests built for this host say.
std::string host_platform();

}  // namespace eh::loader
