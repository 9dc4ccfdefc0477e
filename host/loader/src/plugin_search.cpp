#include "eh/loader/plugin_search.hpp"

#include <cstdlib>
#include <filesystem>
#include <set>

#include "eh/error.hpp"

namespace fs = std::filesystem;

namespace eh::loader {
namespace {

std::vector<std::string> candidates(const PluginSearchInputs& in) {
    std::vector<std::string> out;
    if (!in.executable.empty()) {
        fs::path bin = fs::path(in.executable).parent_path();
        out.push_back((bin / "plugins").string());
        out.push_back((bin / ".." / "plugins").string());
        out.push_back((bin / ".." / "lib" / "engine-host" / "plugins").string());
    }
    if (!in.install_prefix.empty()) out.push_back((fs::path(in.install_prefix) / "lib" / "engine-host" / "plugins").string());
    size_t start = 0;
    while (start <= in.env.size()) {
        size_t end = in.env.find(':', start);
        if (end == std::string::npos) end = in.env.size();
        if (end > start) out.push_back(in.env.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

}  // namespace

std::vector<std::string> default_plugin_dirs(const PluginSearchInputs& in) {
    std::vector<std::string> out;
    std::set<fs::path> seen;
    for (const auto& c : candidates(in)) {
        std::error_code ec;
        if (!fs::is_directory(c, ec)) continue;
        fs::path canon = fs::canonical(c, ec);
        if (ec || !seen.insert(canon).second) continue;
        out.push_back(canon.string());
    }
    return out;
}

PluginSearchInputs this_process_search_inputs() {
    PluginSearchInputs in;
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) in.executable = exe.string();
#ifdef EH_INSTALL_PREFIX
    in.install_prefix = EH_INSTALL_PREFIX;
#endif
    if (const char* e = std::getenv("ENGINE_HOST_PLUGINS")) in.env = e;
    return in;
}

std::vector<std::string> plugin_dirs(const std::vector<std::string>& explicit_dirs) {
    if (!explicit_dirs.empty()) return explicit_dirs;
    PluginSearchInputs in = this_process_search_inputs();
    std::vector<std::string> dirs = default_plugin_dirs(in);
    if (dirs.empty())
        throw Error(Code::NoPlugin, "no plugin directory found: looked in " + join_dirs(candidates(in)) +
                                        " (set ENGINE_HOST_PLUGINS or pass --plugins DIR)");
    return dirs;
}

std::string join_dirs(const std::vector<std::string>& dirs) {
    std::string out;
    for (size_t i = 0; i < dirs.size(); ++i) out += (i ? ", " : "") + dirs[i];
    return out.empty() ? "(nowhere)" : out;
}

}  // namespace eh::loader
