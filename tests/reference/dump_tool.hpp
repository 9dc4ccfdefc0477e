// What the reference dump tools (logits_dump, lora_dump, vision_dump) share:
// opening a plugin's table by its entry symbol, the "refused" exit, and the
// TOKENS argument. Each tool checks for the calls it needs on the table.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace dump_tool {

// The plugin cannot do what the tool asks (its exit code says "refused").
struct Refused : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The plugin's table; the library stays loaded for the process's life.
inline const eh_plugin_api& open_plugin(const char* path) {
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    auto entry = reinterpret_cast<eh_plugin_entry_fn>(dlsym(lib, EH_PLUGIN_ENTRY_SYMBOL));
    if (!entry) throw std::runtime_error("no " EH_PLUGIN_ENTRY_SYMBOL " in " + std::string(path));
    const eh_plugin_api* api = entry(EH_ABI_MAJOR, EH_ABI_MINOR);
    if (!api) throw std::runtime_error("the plugin returned no table");
    return *api;
}

// "1,2,3" -> {1, 2, 3}; fewer than `at_least` ids is an error.
inline std::vector<int32_t> parse_tokens(const std::string& s, size_t at_least) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i < s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        out.push_back(static_cast<int32_t>(std::stol(s.substr(i, j - i))));
        i = j + 1;
    }
    if (out.size() < at_least)
        throw std::runtime_error("TOKENS needs at least " + std::to_string(at_least) + (at_least == 1 ? " id" : " ids"));
    return out;
}

}  // namespace dump_tool
