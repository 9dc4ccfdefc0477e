#include "eh/hub/pull.hpp"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "eh/error.hpp"
#include "eh/hub/cache.hpp"
#include "eh/hub/download.hpp"
#include "eh/hub/gguf_choice.hpp"
#include "eh/hub/http_client.hpp"
#include "eh/hub/http_headers.hpp"

namespace eh::hub {
namespace {

// The token goes to the configured endpoint's origin only (http_client.hpp).
HttpClient client(const PullOptions& o) {
    HttpOptions h;
    h.token = o.settings.token;
    if (auto u = parse_url(o.settings.endpoint)) h.token_origin = u->origin();
    return HttpClient(h);
}

// The files of the reference: which file(s) of `listing` (a function, as
// listing is a network call for a hub and a directory walk for the cache),
// and for a repository reference the vision projector beside the model
// (last; *mmproj set). The listing is asked for once.
std::vector<std::string> files_of(const ModelRef& ref, const std::function<std::vector<std::string>()>& listing,
                                  bool* mmproj) {
    *mmproj = false;
    if (ref.kind == ModelRef::Kind::HubFile) return shard_set(ref.file);
    const std::vector<std::string> all = listing();
    std::vector<std::string> files = shard_set(choose_gguf(all, ref.quant, ref.repo_id()));
    if (auto m = choose_mmproj(all, files.front())) {
        files.push_back(*m);
        *mmproj = true;
    }
    return files;
}

PullResult from_cache(const ModelRef& ref, const PullOptions& o, const std::string& why) {
    RepoCache cache(o.settings.cache, ref.org, ref.repo);
    auto commit = cache.commit_for(ref.revision);
    if (!commit)
        throw Error(Code::NotFound, fmt::format("{} is not in the hub cache ({}){}; run `engine-host pull {}` "
                                                "while online",
                                                ref.display(), o.settings.cache.string(), why, ref.display()));
    PullResult r;
    r.repo_id = ref.repo_id();
    r.commit = *commit;
    r.offline = true;
    bool mmproj = false;
    r.files = files_of(ref, [&] { return cache.snapshot_files(*commit); }, &mmproj);
    for (const auto& f : r.files) {
        std::error_code ec;
        if (!std::filesystem::exists(cache.snapshot(*commit, f), ec))
            throw Error(Code::NotFound, fmt::format("{}: {} is not in the hub cache ({}){}", ref.display(), f,
                                                    cache.dir().string(), why));
    }
    r.path = cache.snapshot(*commit, r.files.front());
    if (mmproj) r.mmproj = cache.snapshot(*commit, r.files.back());
    return r;
}

}  // namespace

std::vector<std::string> list_repo_files(const PullOptions& o, const std::string& repo_id,
                                         const std::string& revision) {
    HttpClient http = client(o);
    std::string rev = encode_path(revision);
    for (size_t p = rev.find('/'); p != std::string::npos; p = rev.find('/', p)) rev.replace(p, 1, "%2F");
    auto url = parse_url(o.settings.endpoint + "/api/models/" + repo_id + "/tree/" + rev + "?recursive=true");
    if (!url) throw Error(Code::InvalidRequest, "HF_ENDPOINT '" + o.settings.endpoint + "' is not an http(s) URL");
    const std::string origin = url->origin();
    std::vector<std::string> files;
    for (int page = 0; url; ++page) {
        if (page == kMaxTreePages)
            throw Error(Code::ModelLoadFailed, fmt::format("{}: the file list has more than {} pages", repo_id,
                                                           kMaxTreePages));
        HttpResponse r = http.get_text(*url);
        if (r.status != 200) throw_hub_error(r, repo_id);
        auto j = nlohmann::json::parse(r.body, nullptr, false);
        if (!j.is_array()) throw Error(Code::ModelLoadFailed, repo_id + ": the hub's file list is not a JSON array");
        for (const auto& e : j) {
            if (!e.is_object() || e.value("type", "") != "file") continue;
            auto p = e.find("path");
            // A path that could leave snapshots/<commit>/ is never used.
            if (p != e.end() && p->is_string() && repo_file_problem(p->get<std::string>()).empty())
                files.push_back(p->get<std::string>());
        }
        std::string next = next_link(r.header("link"));
        if (next.empty()) break;
        url = resolve_location(r.url, next);
        if (!url)
            throw Error(Code::ModelLoadFailed, repo_id + ": the hub's file list has an unusable next-page link");
        // The listing is the endpoint's: a page on another origin is not
        // followed at all (with the token it would leak; without it the list
        // would no longer be the hub's).
        if (url->origin() != origin)
            throw Error(Code::ModelLoadFailed,
                        fmt::format("{}: the hub's file list points its next page at another host ({}); only {} "
                                    "(HF_ENDPOINT) is asked for it",
                                    repo_id, url->origin(), origin));
    }
    return files;
}

PullResult pull(const ModelRef& ref, const PullOptions& o) {
    if (!ref.is_hub()) throw Error(Code::InvalidRequest, "'" + ref.display() + "' is a local path, not a hub reference");
    if (o.settings.offline) return from_cache(ref, o, " and offline mode is on (HF_HUB_OFFLINE or --offline)");

    HttpClient http = client(o);
    RepoCache cache(o.settings.cache, ref.org, ref.repo);
    PullResult r;
    r.repo_id = ref.repo_id();
    try {
        bool mmproj = false;
        r.files = files_of(ref, [&] { return list_repo_files(o, ref.repo_id(), ref.revision); }, &mmproj);
        // The first HEAD pins the commit; the other shards are asked for at it.
        FileMeta first = fetch_meta(http, o.settings.endpoint, ref.repo_id(), ref.revision, r.files.front());
        r.commit = first.commit;
        cache.write_ref(ref.revision, r.commit);
        for (size_t i = 0; i < r.files.size(); ++i) {
            const std::string& f = r.files[i];
            FileMeta m = i == 0 ? first : fetch_meta(http, o.settings.endpoint, ref.repo_id(), r.commit, f);
            if (o.log && std::filesystem::exists(cache.blob(m.etag)))
                o.log(fmt::format("{}: already in the cache", f));
            auto progress = [&](uint64_t done, uint64_t total) {
                if (o.progress) o.progress(f, done, total);
            };
            fs::path at = download_file(http, cache, resolve_url(o.settings.endpoint, ref.repo_id(), r.commit, f), m,
                                        f, progress);
            if (i == 0) r.path = at;
            if (mmproj && i + 1 == r.files.size()) {
                r.mmproj = at;
                if (o.log) o.log(fmt::format("{}: the model's vision projector (serve --mmproj {})", f, at.string()));
            }
        }
        return r;
    } catch (const NetworkError& e) {
        PullResult cached;
        try {
            cached = from_cache(ref, o, "");
        } catch (const Error&) {
            throw e;
        }
        if (o.log) o.log(fmt::format("the hub cannot be reached ({}); using the cached copy", e.what()));
        return cached;
    }
}

std::string resolve_model(const std::string& ref_text, const PullOptions& o) {
    ModelRef ref = parse_ref(ref_text, [](const std::string& p) {
        std::error_code ec;
        return std::filesystem::exists(p, ec);
    });
    if (!ref.is_hub()) return ref.path;
    return pull(ref, o).path.string();
}

}  // namespace eh::hub
