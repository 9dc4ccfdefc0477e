#include "artifacts.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <regex>
#include <system_error>
#include <vector>

#include "eh/error.hpp"

namespace eh::http {

namespace fs = std::filesystem;

namespace {
// The names this store writes (others in DIR are left alone).
const std::regex kRecordName(R"(\d{13}-\d{6}-[A-Za-z0-9._-]{1,64}\.json)");
}  // namespace

std::string ArtifactStore::safe_id(const std::string& job_id) {
    std::string s;
    for (char c : job_id.substr(0, 64)) {
        const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                        c == '_' || c == '-';
        s += ok ? c : '_';
    }
    return s.empty() ? "_" : s;
}

ArtifactStore::ArtifactStore(fs::path dir, size_t max_files, size_t max_transcript_bytes)
    : dir_(std::move(dir)), max_files_(std::max<size_t>(max_files, 1)), max_transcript_bytes_(max_transcript_bytes) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (!fs::is_directory(dir_, ec))
        throw Error(Code::InvalidRequest, "--artifacts-dir " + dir_.string() + " is not a directory that can be created");
    const fs::path probe = dir_ / ".eh-write-probe";
    {
        std::ofstream f(probe);
        if (!f) throw Error(Code::InvalidRequest, "--artifacts-dir " + dir_.string() + " is not writable");
    }
    fs::remove(probe, ec);
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(dir_, ec))
        if (e.is_regular_file() && std::regex_match(e.path().filename().string(), kRecordName)) found.push_back(e.path());
    std::sort(found.begin(), found.end());
    kept_.assign(found.begin(), found.end());
}

fs::path ArtifactStore::write(const std::string& job_id, const nlohmann::json& record) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count();
    std::lock_guard lock(mu_);
    const fs::path path = dir_ / fmt::format("{:013d}-{:06d}-{}.json", ms, seq_++ % 1000000, safe_id(job_id));
    const fs::path tmp = fs::path(path.string() + ".tmp");
    try {
        {
            std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
            f << record.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
            if (!f.flush()) throw std::runtime_error("write failed");
        }
        fs::rename(tmp, path);
    } catch (const std::exception& e) {
        std::error_code ec;
        fs::remove(tmp, ec);
        spdlog::warn("artifact record for job {} not written to {}: {}", job_id, dir_.string(), e.what());
        return {};
    }
    kept_.push_back(path);
    while (kept_.size() > max_files_) {
        std::error_code ec;
        fs::remove(kept_.front(), ec);
        kept_.pop_front();
    }
    return path;
}

}  // namespace eh::http
