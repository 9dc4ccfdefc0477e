#include "eh/hub/cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "eh/error.hpp"

namespace eh::hub {

bool is_commit_hash(const std::string& s) {
    return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
}

RepoCache::RepoCache(fs::path cache_root, const std::string& org, const std::string& repo) {
    std::string name = "models--" + org + "--" + repo;
    dir_ = cache_root / name;
    locks_ = cache_root / ".locks" / name;
}

std::optional<std::string> RepoCache::commit_for(const std::string& revision) const {
    if (is_commit_hash(revision)) return revision;
    std::ifstream in(dir_ / "refs" / revision);
    std::string commit;
    if (!in || !std::getline(in, commit)) return std::nullopt;
    while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
    if (!is_commit_hash(commit)) return std::nullopt;
    return commit;
}

void RepoCache::write_ref(const std::string& revision, const std::string& commit) const {
    if (revision == commit) return;
    fs::path ref = dir_ / "refs" / revision;
    fs::create_directories(ref.parent_path());
    fs::path tmp = ref;
    tmp += ".tmp" + std::to_string(::getpid());
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << commit;  // no newline, as huggingface_hub writes it
        if (!out) throw Error(Code::ModelLoadFailed, "cannot write " + tmp.string());
    }
    fs::rename(tmp, ref);
}

fs::path RepoCache::link(const std::string& commit, const std::string& file, const std::string& etag) const {
    fs::path at = snapshot(commit, file);
    fs::create_directories(at.parent_path());
    // snapshots/<commit>/<a>/<b>/FILE -> ../../../../blobs/<etag>
    fs::path target;
    for (size_t depth = 2 + size_t(std::count(file.begin(), file.end(), '/')); depth > 0; --depth) target /= "..";
    target = target / "blobs" / etag;
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(at, ec))) {
        if (fs::read_symlink(at, ec) == target) return at;
        fs::remove(at, ec);
    } else if (fs::exists(fs::symlink_status(at, ec))) {
        fs::remove(at, ec);  // a stale copy from another tool: the blob is the truth
    }
    fs::create_symlink(target, at, ec);
    if (ec && !fs::is_symlink(fs::symlink_status(at)))  // another process may have made it meanwhile
        throw Error(Code::ModelLoadFailed, "cannot link " + at.string() + ": " + ec.message());
    return at;
}

std::vector<std::string> RepoCache::snapshot_files(const std::string& commit) const {
    std::vector<std::string> out;
    fs::path root = dir_ / "snapshots" / commit;
    std::error_code ec;
    if (!fs::is_directory(root, ec)) return out;
    for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
        if (it->is_directory(ec)) continue;
        if (!fs::exists(it->path(), ec)) continue;  // a dangling link: the blob is gone
        out.push_back(it->path().lexically_relative(root).generic_string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

FileLock::FileLock(const fs::path& path) {
    fs::create_directories(path.parent_path());
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(Code::ModelLoadFailed, "cannot open lock " + path.string() + ": " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        int e = errno;
        ::close(fd_);
        throw Error(Code::ModelLoadFailed, "cannot lock " + path.string() + ": " + std::strerror(e));
    }
}

FileLock::~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace eh::hub
