// The Hugging Face hub cache layout, shared with huggingface_hub and other
// tools:
//   <cache>/models--ORG--REPO/blobs/<etag>              file contents, named by the
//                                                       hub's ETag (sha256 for LFS files)
//   <cache>/models--ORG--REPO/blobs/<etag>.incomplete   a download in progress
//   <cache>/models--ORG--REPO/snapshots/<commit>/FILE   relative symlink to the blob
//   <cache>/models--ORG--REPO/refs/<revision>           the commit a branch pointed at
//   <cache>/.locks/models--ORG--REPO/<etag>.lock        held while a blob is written
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace eh::hub {

namespace fs = std::filesystem;

class RepoCache {
public:
    RepoCache(fs::path cache_root, const std::string& org, const std::string& repo);

    const fs::path& dir() const { return dir_; }
    fs::path blob(const std::string& etag) const { return dir_ / "blobs" / etag; }
    fs::path incomplete(const std::string& etag) const { return dir_ / "blobs" / (etag + ".incomplete"); }
    fs::path lock_file(const std::string& etag) const { return locks_ / (etag + ".lock"); }
    fs::path snapshot(const std::string& commit, const std::string& file) const {
        return dir_ / "snapshots" / commit / file;
    }

    // The commit `revision` names: itself when it is a commit hash, else
    // what refs/<revision> holds; nullopt when unknown.
    std::optional<std::string> commit_for(const std::string& revision) const;
    void write_ref(const std::string& revision, const std::string& commit) const;

    // Points snapshots/<commit>/<file> at blobs/<etag> (relative, so the cache
    // can move). Replaces a link that points elsewhere.
    fs::path link(const std::string& commit, const std::string& file, const std::string& etag) const;

    // Every file in snapshots/<commit>/ (paths relative to it, '/'-separated),
    // sorted; empty when the snapshot does not exist.
    std::vector<std::string> snapshot_files(const std::string& commit) const;

private:
    fs::path dir_;
    fs::path locks_;
};

bool is_commit_hash(const std::string& s);

// An exclusive advisory lock (flock, as huggingface_hub's filelock takes),
// released on destruction.
class FileLock {
public:
    explicit FileLock(const fs::path& path);
    ~FileLock();
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;

private:
    int fd_ = -1;
};

}  // namespace eh::hub
