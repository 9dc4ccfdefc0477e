// Download progress on stderr: a bar redrawn in place on a terminal, a log
// line every 10% (and at the end) otherwise, so logs and CI output stay
// readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace eh::cli {

class DownloadProgress {
public:
    explicit DownloadProgress(bool terminal);
    ~DownloadProgress();
    void update(const std::string& file, uint64_t done, uint64_t total);

private:
    void finish_line();
    bool terminal_;
    std::string file_;
    int last_decile_ = -1;
    bool open_line_ = false;
    uint64_t start_bytes_ = 0;
    std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace eh::cli
