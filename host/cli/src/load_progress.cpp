#include "load_progress.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

namespace eh::cli {

bool progress_bar_fits(int bar_fd, int log_fd) {
    if (!::isatty(bar_fd)) return false;
    if (!::isatty(log_fd)) return true;
    struct stat a {}, b {};
    if (::fstat(bar_fd, &a) != 0 || ::fstat(log_fd, &b) != 0) return false;
    return a.st_rdev != b.st_rdev;  // another terminal
}

void LoadProgressBar::update(float f) {
    if (!on_) return;
    int pct = int(f * 100.0f + 0.5f);
    if (pct == last_) return;
    last_ = pct;
    int fill = pct / 4;
    std::fprintf(stderr, "\rloading model [%.*s%*s] %3d%%", fill, "#########################", 25 - fill, "", pct);
    if (pct >= 100) std::fputc('\n', stderr);
    std::fflush(stderr);
}

}  // namespace eh::cli
