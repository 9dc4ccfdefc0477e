#include "eh/hub/download.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "eh/hub/http_headers.hpp"
#include "eh/sha256.hpp"

namespace eh::hub {
namespace {

bool all_hex(const std::string& s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// A size header: decimal digits only, nothing else.
std::optional<uint64_t> to_u64(const std::string& s) {
    uint64_t v = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
    return v;
}

// Bytes an unprivileged writer may still use on the filesystem of `dir`;
// nullopt when the system cannot say.
std::optional<uint64_t> free_bytes(const fs::path& dir) {
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) != 0) return std::nullopt;
    return uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
}

// Removes the .incomplete file when the download fails, unless told to keep
// it for the next run to resume.
class RemoveOnFailure {
public:
    explicit RemoveOnFailure(fs::path p) : path_(std::move(p)) {}
    ~RemoveOnFailure() {
        std::error_code ec;
        if (!keep_) fs::remove(path_, ec);
    }
    RemoveOnFailure(const RemoveOnFailure&) = delete;
    RemoveOnFailure& operator=(const RemoveOnFailure&) = delete;
    void keep() { keep_ = true; }

private:
    fs::path path_;
    bool keep_ = false;
};

// Git's object id of a file: SHA-1 of "blob <size>\0" and the bytes.
std::string git_blob_sha1(const fs::path& path) {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) throw Error(Code::ModelLoadFailed, "cannot open '" + path.string() + "' to hash it");
    std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
    EVP_DigestInit_ex(ctx.get(), EVP_sha1(), nullptr);
    std::string head = "blob " + std::to_string(fs::file_size(path));
    EVP_DigestUpdate(ctx.get(), head.data(), head.size() + 1);  // with the NUL
    std::vector<unsigned char> buf(1 << 20);
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) EVP_DigestUpdate(ctx.get(), buf.data(), n);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    EVP_DigestFinal_ex(ctx.get(), md, &len);
    std::string out;
    for (unsigned i = 0; i < len; ++i) out += fmt::format("{:02x}", md[i]);
    return out;
}

// The .incomplete file, written at an offset the server chooses.
class PartFile {
public:
    explicit PartFile(const fs::path& p) : path_(p) {
        fd_ = ::open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) throw Error(Code::ModelLoadFailed, "cannot write " + p.string() + ": " + std::strerror(errno));
        off_t end = ::lseek(fd_, 0, SEEK_END);
        pos_ = end < 0 ? 0 : uint64_t(end);
    }
    ~PartFile() {
        if (fd_ >= 0) ::close(fd_);
    }
    uint64_t pos() const { return pos_; }
    void seek(uint64_t at) {
        if (::ftruncate(fd_, off_t(at)) != 0 || ::lseek(fd_, off_t(at), SEEK_SET) < 0)
            throw Error(Code::ModelLoadFailed, "cannot rewind " + path_.string() + ": " + std::strerror(errno));
        pos_ = at;
    }
    bool write(const char* p, size_t n) {
        while (n > 0) {
            ssize_t w = ::write(fd_, p, n);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                error_ = std::strerror(errno);
                return false;
            }
            p += w;
            n -= size_t(w);
            pos_ += uint64_t(w);
        }
        return true;
    }
    void close() {
        if (fd_ >= 0 && ::close(fd_) != 0) error_ = std::strerror(errno);
        fd_ = -1;
        if (!error_.empty()) throw Error(Code::ModelLoadFailed, "cannot write " + path_.string() + ": " + error_);
    }
    const std::string& error() const { return error_; }

private:
    fs::path path_;
    int fd_ = -1;
    uint64_t pos_ = 0;
    std::string error_;
};

}  // namespace

std::string etag_hash_kind(const std::string& etag) {
    if (etag.size() == 64 && all_hex(etag)) return "sha256";
    if (etag.size() == 40 && all_hex(etag)) return "git-sha1";
    return "";
}

Url resolve_url(const std::string& endpoint, const std::string& repo_id, const std::string& revision,
                const std::string& file) {
    std::string rev = encode_path(revision);
    for (size_t p = rev.find('/'); p != std::string::npos; p = rev.find('/', p)) rev.replace(p, 1, "%2F");
    auto u = parse_url(endpoint + "/" + repo_id + "/resolve/" + rev + "/" + encode_path(file));
    if (!u) throw Error(Code::InvalidRequest, "HF_ENDPOINT '" + endpoint + "' is not an http(s) URL");
    return *u;
}

void throw_hub_error(const HttpResponse& r, const std::string& what) {
    std::string code = r.header("x-error-code"), msg = r.header("x-error-message");
    std::string tail = msg.empty() ? "" : " (" + msg + ")";
    if (code == "GatedRepo")
        throw Error(Code::NotFound, what + ": the repository is gated: accept its terms on the hub's page, then set "
                                           "HF_TOKEN to a token of that account" + tail);
    if (code == "RepoNotFound" || (r.status == 401 && code.empty()))
        throw Error(Code::NotFound, what + ": repository not found (a private one needs HF_TOKEN)" + tail);
    if (code == "RevisionNotFound") throw Error(Code::NotFound, what + ": revision not found" + tail);
    if (code == "EntryNotFound" || r.status == 404) throw Error(Code::NotFound, what + ": file not found" + tail);
    throw Error(Code::ModelLoadFailed, fmt::format("{}: HTTP {} from {}{}", what, r.status, r.url.str(), tail));
}

FileMeta fetch_meta(const HttpClient& http, const std::string& endpoint, const std::string& repo_id,
                    const std::string& revision, const std::string& file) {
    std::string what = repo_id + "/" + file;
    HttpResponse r = http.head(resolve_url(endpoint, repo_id, revision, file));
    bool redirect = r.status >= 300 && r.status < 400;
    if (r.status != 200 && !redirect) throw_hub_error(r, what);
    FileMeta m;
    m.commit = r.header("x-repo-commit");
    std::string linked = r.header("x-linked-etag");
    m.etag = unquote_etag(linked.empty() ? r.header("etag") : linked);
    std::string size = r.header("x-linked-size");
    auto announced = to_u64(size.empty() ? r.header("content-length") : size);
    if (m.commit.empty() || !is_commit_hash(m.commit))
        throw Error(Code::ModelLoadFailed, what + ": the hub's answer has no commit (X-Repo-Commit); is HF_ENDPOINT (" +
                                               endpoint + ") a Hugging Face hub?");
    // The size bounds what the download may write: without one nothing is fetched.
    if (!announced)
        throw Error(Code::ModelLoadFailed, what + ": the hub's answer has no usable size (X-Linked-Size or "
                                                  "Content-Length)");
    m.size = *announced;
    // The etag names a file in blobs/: nothing but a plain name is accepted.
    bool plain = !m.etag.empty() && m.etag.size() <= 128 && std::all_of(m.etag.begin(), m.etag.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
    });
    if (!plain) throw Error(Code::ModelLoadFailed, what + ": the hub's answer has no usable ETag");
    return m;
}

fs::path download_file(const HttpClient& http, const RepoCache& cache, const Url& url, const FileMeta& meta,
                       const std::string& file, const ByteProgress& progress) {
    fs::create_directories(cache.blob(meta.etag).parent_path());
    FileLock lock(cache.lock_file(meta.etag));  // one writer per blob, across processes and tools
    std::error_code ec;
    if (fs::is_regular_file(cache.blob(meta.etag), ec)) return cache.link(meta.commit, file, meta.etag);

    const fs::path part_path = cache.incomplete(meta.etag);
    // Room for what is still to come (an earlier run's .incomplete counts as
    // fetched), checked before anything is fetched or created.
    uint64_t have = fs::file_size(part_path, ec);
    if (ec || have > meta.size) have = 0;
    ec.clear();
    if (auto avail = free_bytes(part_path.parent_path()); avail && meta.size - have > *avail)
        throw Error(Code::ModelLoadFailed,
                    fmt::format("{}: not enough disk space: the hub announces {} bytes ({} still to fetch), {} bytes "
                                "are free in {}",
                                file, meta.size, meta.size - have, *avail, part_path.parent_path().string()));

    PartFile part(part_path);
    // Kept for the next run to resume only when the transfer was cut short
    // (no connection, a broken one, a 5xx answer, a body that ended early);
    // any other failure leaves no .incomplete behind.
    RemoveOnFailure discard(part_path);
    if (part.pos() > meta.size) part.seek(0);  // not ours to resume
    if (progress) progress(part.pos(), meta.size);
    int stalled = 0;
    while (true) {
        if (meta.size > 0 && part.pos() == meta.size) break;
        uint64_t before = part.pos();
        // Nothing past the announced size is written: a longer body (or a
        // Content-Length / range total over it) ends the download.
        bool too_long = false;
        HttpClient::Stream s;
        try {
            s = http.get_stream(
                url, part.pos(),
                [&](uint64_t start, uint64_t total) {
                    if (total > meta.size) too_long = true;
                    else part.seek(start);
                },
                [&](const char* d, size_t n) {
                    if (too_long || n > meta.size - part.pos()) {
                        too_long = true;
                        return false;
                    }
                    if (!part.write(d, n)) return false;
                    if (progress) progress(part.pos(), meta.size);
                    return true;
                });
        } catch (const NetworkError&) {
            discard.keep();  // no connection: what is there is good for the next run
            throw;
        }
        if (too_long)
            throw Error(Code::ModelLoadFailed, fmt::format("{}: the server sends more than the {} bytes the hub "
                                                           "announced; the download was removed",
                                                           file, meta.size));
        if (!part.error().empty()) part.close();  // throws the write error
        if (s.status == 416 && part.pos() == meta.size) break;
        if (s.status != 200 && s.status != 206) {
            if (s.status >= 500) discard.keep();  // the server's trouble, not the bytes': resumable
            HttpResponse r{s.status, s.headers, {}, url};
            throw_hub_error(r, file);
        }
        if (s.transport_error.empty()) break;
        stalled = part.pos() > before ? 0 : stalled + 1;
        if (stalled >= kMaxStalledAttempts) {
            discard.keep();
            throw NetworkError(fmt::format("{}: the download stopped at {} of {} bytes ({}), {} times in a row; run "
                                           "the command again to resume",
                                           file, part.pos(), meta.size, s.transport_error, stalled));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100 * stalled));
    }
    part.close();
    uint64_t got = fs::file_size(part_path);
    if (got != meta.size) {
        discard.keep();  // a body that ended early: the rest can be resumed
        throw Error(Code::ModelLoadFailed, fmt::format("{}: the hub said {} bytes, the download has {}; run the "
                                                       "command again to resume",
                                                       file, meta.size, got));
    }
    std::string kind = etag_hash_kind(meta.etag);
    std::string actual = kind == "sha256" ? sha256_file_hex(part_path.string())
                       : kind == "git-sha1" ? git_blob_sha1(part_path) : meta.etag;
    if (actual != meta.etag)
        throw Error(Code::ModelLoadFailed, fmt::format("{}: {} mismatch: the hub says {}, the download is {}; the "
                                                       "download was removed",
                                                       file, kind, meta.etag, actual));
    fs::rename(part_path, cache.blob(meta.etag));
    discard.keep();
    return cache.link(meta.commit, file, meta.etag);
}

}  // namespace eh::hub
