// One repository file into the cache: the hub's metadata (HEAD), then the
// blob (GET, resumed from a .incomplete file with a Range request), checked
// against the hub's hash before it is renamed into blobs/ and linked from
// snapshots/.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "eh/hub/cache.hpp"
#include "eh/hub/http_client.hpp"

namespace eh::hub {

// Consecutive attempts that fetch no new byte before a download gives up
// (each broken connection is resumed where it stopped).
inline constexpr int kMaxStalledAttempts = 5;

struct FileMeta {
    std::string commit;   // X-Repo-Commit
    std::string etag;     // X-Linked-Etag (LFS: the sha256), else ETag (git blob sha1); unquoted
    uint64_t size = 0;    // X-Linked-Size, else Content-Length
};

// HEAD {endpoint}/{org}/{repo}/resolve/{revision}/{file}. Throws NotFound for
// a missing repository, revision or file (the hub's X-Error-Code), Error for
// other refusals, NetworkError when the hub cannot be reached.
FileMeta fetch_meta(const HttpClient& http, const std::string& endpoint, const std::string& repo_id,
                    const std::string& revision, const std::string& file);

// The URL of a file at a revision.
Url resolve_url(const std::string& endpoint, const std::string& repo_id, const std::string& revision,
                const std::string& file);

// Throws the error a hub answer means ("repository not found", "gated", ...).
[[noreturn]] void throw_hub_error(const HttpResponse& r, const std::string& what);

using ByteProgress = std::function<void(uint64_t done, uint64_t total)>;

// Makes blobs/<etag> hold the file (downloading it unless already there)
// and snapshots/<commit>/<file> point at it; returns the snapshot path.
// Nothing past meta.size is written: a longer body, a disk that cannot hold
// the rest, a write error, a refusal or a hash mismatch throws
// ModelLoadFailed and removes the .incomplete file; a transfer cut short
// (NetworkError, a 5xx, a body that ended early) keeps it for the next run.
fs::path download_file(const HttpClient& http, const RepoCache& cache, const Url& url, const FileMeta& meta,
                       const std::string& file, const ByteProgress& progress);

// What the etag says the content hashes to: "sha256", "git-sha1" or "" (not checkable).
std::string etag_hash_kind(const std::string& etag);

}  // namespace eh::hub
