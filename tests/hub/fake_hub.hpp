// A loopback HTTP server that answers like the Hugging Face hub, for the
// pull tests: HEAD/GET /ORG/REPO/resolve/REV/FILE with X-Repo-Commit,
// X-Linked-Etag, X-Linked-Size and a redirect to a second server (the
// "CDN", another origin) for LFS files; the tree API with pagination; range
// requests; injected faults (a dropped connection, a wrong hash, a body
// longer than announced, a next-page link to another host).
#pragma once

#include <httplib.h>
#include <openssl/evp.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace eh::hub::test {

inline std::string digest_hex(const EVP_MD* md, const std::string& data) {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    EVP_Digest(data.data(), data.size(), out, &len, md, nullptr);
    std::string s;
    for (unsigned i = 0; i < len; ++i) s += fmt::format("{:02x}", out[i]);
    return s;
}
inline std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

inline std::string sha256_hex(const std::string& d) { return digest_hex(EVP_sha256(), d); }
inline std::string git_sha1_hex(const std::string& d) {
    return digest_hex(EVP_sha1(), "blob " + std::to_string(d.size()) + std::string(1, '\0') + d);
}

struct FakeFile {
    std::string content;
    bool lfs = true;
};

struct FakeRepo {
    std::string commit;
    std::map<std::string, FakeFile> files;
    std::string renamed_to;   // non-empty: every resolve answers 307 to this repo (relative Location)
    bool gated = false;
};

class FakeHub {
public:
    FakeHub() {
        cdn_.Get(R"(/cdn/([0-9a-f]{64}))", [this](const httplib::Request& req, httplib::Response& res) {
            serve_cdn(req, res);
        });
        // The tree API on the other origin too, for a hub whose next-page
        // link leads there (tree_next_on_cdn): what a client sends it is kept.
        cdn_.Get(R"(/api/models/([^/]+)/([^/]+)/tree/([^/]+))",
                 [this](const httplib::Request& req, httplib::Response& res) {
                     {
                         std::lock_guard l(mu_);
                         cdn_auth_.push_back(req.get_header_value("Authorization"));
                     }
                     serve_tree(req, res);
                 });
        hub_.Get(R"(/api/models/([^/]+)/([^/]+)/tree/([^/]+))",
                 [this](const httplib::Request& req, httplib::Response& res) { serve_tree(req, res); });
        hub_.Get(R"(/([^/]+)/([^/]+)/resolve/([^/]+)/(.+))",
                 [this](const httplib::Request& req, httplib::Response& res) { serve_resolve(req, res); });
        hub_.Post("/callback", [this](const httplib::Request& req, httplib::Response&) {
            std::lock_guard l(mu_);
            callbacks_.push_back(req.body);
        });
        hub_port_ = hub_.bind_to_any_port("127.0.0.1");
        cdn_port_ = cdn_.bind_to_any_port("127.0.0.1");
        hub_thread_ = std::thread([this] { hub_.listen_after_bind(); });
        cdn_thread_ = std::thread([this] { cdn_.listen_after_bind(); });
        while (!hub_.is_running() || !cdn_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ~FakeHub() {
        hub_.stop();
        cdn_.stop();
        hub_thread_.join();
        cdn_thread_.join();
    }

    std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", hub_port_); }
    std::string cdn_origin() const { return fmt::format("http://127.0.0.1:{}", cdn_port_); }

    void add(const std::string& repo_id, FakeRepo repo) {
        std::lock_guard l(mu_);
        repos_[repo_id] = std::move(repo);
    }

    // Faults and knobs.
    std::atomic<int64_t> drop_after{-1};     // the next CDN body stops after this many bytes of the file
    std::atomic<int> drops_left{0};          // how many bodies are cut
    std::atomic<bool> lie_about_sha{false};  // X-Linked-Etag names other content
    size_t tree_page_size = 1000;
    std::string etag_override;               // sent as X-Linked-Etag, quoted, when set
    std::atomic<bool> tree_next_on_cdn{false};   // the tree API's next-page links name the CDN's origin
    std::string linked_size;                     // sent as X-Linked-Size instead of the real size when set
    // >= 0: the CDN ignores Range and answers 200 with this many bytes (the
    // file, then filler), claiming cdn_content_length as Content-Length when
    // that is >= 0 (cutting the connection where the bytes end), else chunked.
    std::atomic<int64_t> cdn_body_bytes{-1};
    std::atomic<int64_t> cdn_content_length{-1};

    // What was seen.
    std::atomic<int> cdn_gets{0}, heads{0}, tree_gets{0};
    std::vector<std::string> ranges_seen() {
        std::lock_guard l(mu_);
        return ranges_;
    }
    std::vector<std::string> auth_at_hub() {
        std::lock_guard l(mu_);
        return hub_auth_;
    }
    std::vector<std::string> callbacks() {  // bodies POSTed to /callback (engine-host serve --callback-url)
        std::lock_guard l(mu_);
        return callbacks_;
    }
    std::vector<std::string> auth_at_cdn() {
        std::lock_guard l(mu_);
        return cdn_auth_;
    }

private:
    static std::string quoted(const std::string& s) { return "\"" + s + "\""; }

    void serve_resolve(const httplib::Request& req, httplib::Response& res) {
        std::lock_guard l(mu_);
        hub_auth_.push_back(req.get_header_value("Authorization"));
        if (req.method == "HEAD") ++heads;
        std::string repo_id = req.matches[1].str() + "/" + req.matches[2].str();
        std::string rev = req.matches[3], file = req.matches[4];
        auto it = repos_.find(repo_id);
        if (it == repos_.end()) {
            res.status = 401;
            res.set_header("X-Error-Code", "RepoNotFound");
            res.set_header("X-Error-Message", "Repository not found");
            return;
        }
        const FakeRepo& repo = it->second;
        if (!repo.renamed_to.empty()) {
            res.status = 307;
            res.set_header("Location", "/" + repo.renamed_to + "/resolve/" + rev + "/" + file);
            return;
        }
        if (repo.gated) {
            res.status = 403;
            res.set_header("X-Error-Code", "GatedRepo");
            return;
        }
        if (rev != "main" && rev != repo.commit) {
            res.status = 404;
            res.set_header("X-Error-Code", "RevisionNotFound");
            return;
        }
        auto f = repo.files.find(file);
        if (f == repo.files.end()) {
            res.status = 404;
            res.set_header("X-Error-Code", "EntryNotFound");
            res.set_header("X-Repo-Commit", repo.commit);
            return;
        }
        res.set_header("X-Repo-Commit", repo.commit);
        if (!f->second.lfs) {
            res.set_header("ETag", quoted(git_sha1_hex(f->second.content)));
            res.set_content(f->second.content, "application/octet-stream");
            return;
        }
        std::string sha = sha256_hex(f->second.content);
        blobs_[sha] = f->second.content;
        std::string told = lie_about_sha ? sha256_hex(f->second.content + "x") : sha;
        res.status = 302;
        res.set_header("X-Linked-Etag", quoted(etag_override.empty() ? told : etag_override));
        res.set_header("X-Linked-Size",
                       linked_size.empty() ? std::to_string(f->second.content.size()) : linked_size);
        res.set_header("ETag", quoted(git_sha1_hex("pointer " + sha)));
        res.set_header("Location", fmt::format("http://127.0.0.1:{}/cdn/{}", cdn_port_, sha));
    }

    void serve_cdn(const httplib::Request& req, httplib::Response& res) {
        std::string content;
        {
            std::lock_guard l(mu_);
            cdn_auth_.push_back(req.get_header_value("Authorization"));
            if (req.has_header("Range")) ranges_.push_back(req.get_header_value("Range"));
            auto it = blobs_.find(req.matches[1]);
            if (it == blobs_.end()) {
                res.status = 404;
                return;
            }
            content = it->second;
        }
        ++cdn_gets;
        if (cdn_body_bytes >= 0) return serve_overlong(std::move(content), res);
        int64_t cut = -1;
        if (drops_left > 0) {
            --drops_left;
            cut = drop_after;
        }
        auto data = std::make_shared<std::string>(std::move(content));
        res.set_content_provider(data->size(), "application/octet-stream",
                                 [data, cut](size_t offset, size_t length, httplib::DataSink& sink) {
                                     size_t n = std::min<size_t>(length, 4096);
                                     if (cut >= 0 && offset + n > size_t(cut)) {
                                         if (size_t(cut) > offset) sink.write(data->data() + offset, size_t(cut) - offset);
                                         return false;  // the connection drops mid-body
                                     }
                                     sink.write(data->data() + offset, n);
                                     return true;
                                 });
    }

    // More bytes than the hub announced: the file, then filler, up to
    // cdn_body_bytes (a bound so a client that never stops still ends).
    void serve_overlong(std::string content, httplib::Response& res) {
        res.status = 200;  // the whole body, whatever Range asked for
        auto data = std::make_shared<std::string>(std::move(content));
        size_t total = size_t(cdn_body_bytes.load());
        auto fill = [data, total](size_t offset, httplib::DataSink& sink) {
            if (offset >= total) return false;
            char buf[8192];
            size_t n = std::min(sizeof buf, total - offset);
            for (size_t i = 0; i < n; ++i) buf[i] = offset + i < data->size() ? (*data)[offset + i] : 'z';
            return sink.write(buf, n);
        };
        if (cdn_content_length >= 0) {
            res.set_content_provider(size_t(cdn_content_length.load()), "application/octet-stream",
                                     [fill](size_t offset, size_t, httplib::DataSink& sink) {
                                         return fill(offset, sink);  // false past the bytes: the connection drops
                                     });
            return;
        }
        auto sent = std::make_shared<size_t>(0);
        res.set_chunked_content_provider("application/octet-stream",
                                         [fill, sent, total](size_t, httplib::DataSink& sink) {
                                             if (*sent >= total) {
                                                 sink.done();
                                                 return true;
                                             }
                                             size_t before = *sent;
                                             *sent = std::min(total, before + 8192);
                                             return fill(before, sink);
                                         });
    }

    void serve_tree(const httplib::Request& req, httplib::Response& res) {
        std::lock_guard l(mu_);
        ++tree_gets;
        std::string repo_id = req.matches[1].str() + "/" + req.matches[2].str();
        auto it = repos_.find(repo_id);
        if (it == repos_.end()) {
            res.status = 404;
            res.set_header("X-Error-Code", "RepoNotFound");
            return;
        }
        std::string rev = req.matches[3];
        if (rev != "main" && rev != it->second.commit) {
            res.status = 404;
            res.set_header("X-Error-Code", "RevisionNotFound");
            return;
        }
        size_t cursor = req.has_param("cursor") ? std::stoul(req.get_param_value("cursor")) : 0;
        nlohmann::json arr = nlohmann::json::array();
        std::vector<std::string> dirs;
        size_t i = 0;
        for (const auto& [path, f] : it->second.files) {
            if (i >= cursor && i < cursor + tree_page_size) {
                nlohmann::json e = {{"type", "file"}, {"path", path}, {"size", f.content.size()},
                                    {"oid", git_sha1_hex(f.content)}};
                if (f.lfs) e["lfs"] = {{"oid", sha256_hex(f.content)}, {"size", f.content.size()}};
                arr.push_back(e);
            }
            ++i;
        }
        if (cursor == 0) arr.push_back({{"type", "directory"}, {"path", "subdir"}, {"oid", "0"}, {"size", 0}});
        if (cursor + tree_page_size < i)
            res.set_header("Link", fmt::format("<{}/api/models/{}/tree/{}?recursive=true&cursor={}>; rel=\"next\"",
                                               tree_next_on_cdn ? cdn_origin() : endpoint(), repo_id, req.matches[3].str(), cursor + tree_page_size));
        res.set_content(arr.dump(), "application/json");
    }

    httplib::Server hub_, cdn_;
    int hub_port_ = 0, cdn_port_ = 0;
    std::thread hub_thread_, cdn_thread_;
    std::mutex mu_;
    std::map<std::string, FakeRepo> repos_;
    std::map<std::string, std::string> blobs_;
    std::vector<std::string> ranges_, hub_auth_, cdn_auth_, callbacks_;
};

}  // namespace eh::hub::test
