#include "model_ref.hpp"

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "download_progress.hpp"

namespace eh::cli {

hub::PullOptions pull_options(bool offline) {
    hub::PullOptions o;
    o.settings = hub::settings_from_env();
    o.settings.offline = o.settings.offline || offline;
    auto bar = std::make_shared<DownloadProgress>(isatty(STDERR_FILENO) != 0);
    o.progress = [bar](const std::string& f, uint64_t done, uint64_t total) { bar->update(f, done, total); };
    o.log = [](const std::string& line) { std::fprintf(stderr, "pull: %s\n", line.c_str()); };
    return o;
}

std::string resolve_model_ref(const std::string& ref, bool offline) {
    return hub::resolve_model(ref, pull_options(offline));
}

}  // namespace eh::cli
