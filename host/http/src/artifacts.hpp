// Per-job artifact records (serve --artifacts-dir DIR, off by default): one
// JSON file per native /execute job, written when its stream ends, on
// failure too, so a job can be audited or replayed later. Layout and limits
// in docs/http-api.md ("Artifact records").
//
//   DIR/<ms since epoch, 13 digits>-<sequence, 6 digits>-<job id>.json
//
// The job id is kept to [A-Za-z0-9._-] (anything else becomes '_') and 64
// bytes. A file is written to a temporary name and renamed, so a reader never
// sees half of one. At most max_files records are kept: the oldest (by name)
// is removed when a write would pass that, counting the records found in DIR
// at startup. A record's SSE transcript keeps at most max_transcript_bytes
// (then "transcript_truncated": true).
#pragma once

#include <cstddef>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

namespace eh::http {

class ArtifactStore {
public:
    // Creates DIR if needed; throws eh::Error (INVALID_REQUEST) when it is
    // not a writable directory.
    ArtifactStore(std::filesystem::path dir, size_t max_files, size_t max_transcript_bytes);

    size_t max_transcript_bytes() const { return max_transcript_bytes_; }
    // Writes one record; returns its path. An I/O failure is logged and
    // returns an empty path: a record never fails the job it describes.
    std::filesystem::path write(const std::string& job_id, const nlohmann::json& record);

    // The file name part a job id becomes.
    static std::string safe_id(const std::string& job_id);

private:
    std::filesystem::path dir_;
    size_t max_files_, max_transcript_bytes_;
    std::mutex mu_;
    std::deque<std::filesystem::path> kept_;  // oldest first
    uint64_t seq_ = 0;
};

}  // namespace eh::http
