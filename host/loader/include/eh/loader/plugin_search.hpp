// Where engine-host looks for plugins when no --plugins is given, in order:
//   1. beside the executable: <exe_dir>/plugins, <exe_dir>/../plugins (a
//      build tree: build/bin/engine-host, build/plugins), and
//      <exe_dir>/../lib/engine-host/plugins (an installed tree, moved or not);
//   2. the install prefix's lib/engine-host/plugins (where `cmake --install`
//      puts them);
//   3. each directory of $ENGINE_HOST_PLUGINS (colon-separated).
// Only directories that exist are kept, each once (by canonical path). With
// --plugins DIR (repeatable) exactly those directories are searched instead.
#pragma once

#include <string>
#include <vector>

namespace eh::loader {

struct PluginSearchInputs {
    std::string executable;      // absolute path of the running program ("" = unknown)
    std::string install_prefix;  // CMAKE_INSTALL_PREFIX ("" = none)
    std::string env;             // $ENGINE_HOST_PLUGINS
};

std::vector<std::string> default_plugin_dirs(const PluginSearchInputs& in);

// The inputs of this process: /proc/self/exe, the configured install
// prefix, the environment.
PluginSearchInputs this_process_search_inputs();

// --plugins when given (those directories, as given), else the default
// search. Throws eh::Error(NoPlugin) naming every place looked at when the
// default search finds no directory.
std::vector<std::string> plugin_dirs(const std::vector<std::string>& explicit_dirs);

// "dir1, dir2" for messages and logs.
std::string join_dirs(const std::vector<std::string>& dirs);

}  // namespace eh::loader
