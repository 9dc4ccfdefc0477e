#include "download_progress.hpp"

#include <cstdio>

#include <fmt/format.h>

namespace eh::cli {

DownloadProgress::DownloadProgress(bool terminal) : terminal_(terminal) {}

DownloadProgress::~DownloadProgress() { finish_line(); }

void DownloadProgress::finish_line() {
    if (open_line_) std::fputc('\n', stderr);
    open_line_ = false;
}

void DownloadProgress::update(const std::string& file, uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (file != file_ || done < start_bytes_) {  // a new file, or one restarted from 0
        finish_line();
        file_ = file;
        last_decile_ = -1;
        start_ = now;
        start_bytes_ = done;
        last_draw_ = {};
    }
    const double mib = 1024.0 * 1024.0;
    double frac = total ? double(done) / double(total) : 1.0;
    bool end = done >= total;
    if (terminal_) {
        if (!end && now - last_draw_ < std::chrono::milliseconds(100)) return;
        last_draw_ = now;
        double secs = std::chrono::duration<double>(now - start_).count();
        double rate = secs > 0.2 ? double(done - start_bytes_) / mib / secs : 0.0;
        int fill = int(frac * 30.0);
        std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% %.1f/%.1f MiB %.1f MiB/s ", file.c_str(), fill,
                     "##############################", 30 - fill, "", int(frac * 100.0), double(done) / mib,
                     double(total) / mib, rate);
        open_line_ = true;
        if (end) finish_line();
        std::fflush(stderr);
        return;
    }
    int decile = int(frac * 10.0);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(stderr, "pull: %s %d%% (%.1f of %.1f MiB)\n", file.c_str(), decile * 10, double(done) / mib,
                 double(total) / mib);
}

}  // namespace eh::cli
