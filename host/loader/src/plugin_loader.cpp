#include "eh/loader/plugin_loader.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/dll/shared_library.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "eh/error.hpp"
#include "eh/loader/manifest.hpp"
#include "eh/regular_file.hpp"
#include "eh/sha256.hpp"

namespace fs = std::filesystem;

namespace eh::loader {
namespace {

// A manifest is a few hundred bytes; 64 KiB leaves room and bounds memory.
constexpr size_t kMaxManifestBytes = 64 * 1024;

constexpr const char* kManifestSuffix = ".manifest.json";

std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
    return out;
}

std::vector<std::string> c_list(const char* const* list) {
    std::vector<std::string> out;
    for (size_t i = 0; list && list[i] && i < 4096; ++i) out.emplace_back(list[i]);
    return out;
}

// Compares a list from info() with the manifest's, order-insensitively.
void compare_list(const char* what, std::vector<std::string> manifest, std::vector<std::string> self,
                  std::vector<std::string>& problems) {
    std::sort(manifest.begin(), manifest.end());
    std::sort(self.begin(), self.end());
    if (manifest != self)
        problems.push_back(std::string(what) + " disagree: manifest says [" + join(manifest) +
                           "], plugin says [" + join(self) + "]");
}

void compare_str(const char* what, const std::string& manifest, const char* self,
                 std::vector<std::string>& problems) {
    std::string s = self ? self : "(null)";
    if (manifest != s)
        problems.push_back(std::string(what) + " disagree: manifest says \"" + manifest +
                           "\", plugin says \"" + s + "\"");
}

// Runs one call into plugin code; a C++ exception escaping it is reported as
// the plugin bug it is.
template <class F>
bool guarded(const char* call, std::vector<std::string>& problems, F&& f) {
    try {
        f();
        return true;
    } catch (const std::exception& e) {
        problems.push_back(std::string("plugin threw a C++ exception across the ABI in ") + call +
                           ": " + e.what());
    } catch (...) {
        problems.push_back(std::string("plugin threw a C++ exception across the ABI in ") + call);
    }
    return false;
}

struct Opened {
    std::shared_ptr<boost::dll::shared_library> library;
    const eh_plugin_api* api = nullptr;
    std::optional<eh_probe_result> probe;
};

// dlopen and the entry call; the plugin's table, or null with the problem.
const eh_plugin_api* open_library(const std::string& lib_path, Opened& out, std::vector<std::string>& problems,
                                  const std::function<void(const char*)>& stage) {
    stage("dlopen");
    try {
        out.library = std::make_shared<boost::dll::shared_library>(
            lib_path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
    } catch (const std::exception& e) {
        problems.push_back(std::string("cannot load library: ") + e.what());
        return nullptr;
    }
    if (!out.library->has(EH_PLUGIN_ENTRY_SYMBOL)) {
        problems.push_back(std::string("library does not export the entry symbol ") + EH_PLUGIN_ENTRY_SYMBOL);
        return nullptr;
    }
    auto entry = out.library->get<std::remove_pointer_t<eh_plugin_entry_fn>>(EH_PLUGIN_ENTRY_SYMBOL);

    stage("entry");
    const eh_plugin_api* api = nullptr;
    if (!guarded(EH_PLUGIN_ENTRY_SYMBOL, problems, [&] { api = entry(EH_ABI_MAJOR, EH_ABI_MINOR); }))
        return nullptr;
    if (!api)
        problems.push_back(std::string(EH_PLUGIN_ENTRY_SYMBOL) + " returned NULL (plugin offers no table for host ABI " +
                           std::to_string(EH_ABI_MAJOR) + "." + std::to_string(EH_ABI_MINOR) + ")");
    return api;
}

// The table's ABI version against the host's and the manifest's, and its
// size against its version's; false when the table cannot be read further.
bool check_version(const eh_plugin_api& api, const Manifest& m, const LoaderOptions& opt,
                   std::vector<std::string>& problems) {
    std::string host_v = std::to_string(EH_ABI_MAJOR) + "." + std::to_string(opt.required_abi_minor);
    std::string plug_v = std::to_string(api.abi_major) + "." + std::to_string(api.abi_minor);
    if (api.abi_major != EH_ABI_MAJOR) {
        problems.push_back("ABI major mismatch: plugin speaks " + plug_v + ", host needs " + host_v);
        return false;
    }
    if (api.abi_minor < opt.required_abi_minor) {
        problems.push_back("ABI too old: plugin speaks " + plug_v + ", host needs at least " + host_v);
        return false;
    }
    // A table is as large as the minor version it was built for defines:
    // older plugins end before the members later minors appended.
    const size_t needed = api_table_size(api.abi_minor);
    if (api.struct_size < needed) {
        problems.push_back("function table too small: plugin says " + std::to_string(api.struct_size) +
                           " bytes, ABI " + plug_v + " needs " + std::to_string(needed));
        return false;
    }
    if (api.abi_major != m.abi_major || api.abi_minor != m.abi_minor)
        problems.push_back("ABI version disagrees: manifest says " + std::to_string(m.abi_major) + "." +
                           std::to_string(m.abi_minor) + ", plugin table says " + plug_v);
    return true;
}

// The entries every plugin sets, and the session calls (session_logits is
// optional): required up to 1.3; from 1.4 a plugin with the batched group
// may leave all of them NULL. Returns whether it did (step only).
bool check_required_entries(const eh_plugin_api& api, std::vector<std::string>& problems) {
    const char* required[] = {"info", "plugin_last_error", "probe", "model_load", "model_get_info",
                              "model_check_residency", "model_last_error", "model_release"};
    const void* fns[] = {(void*)api.info, (void*)api.plugin_last_error, (void*)api.probe,
                         (void*)api.model_load, (void*)api.model_get_info,
                         (void*)api.model_check_residency, (void*)api.model_last_error,
                         (void*)api.model_release};
    for (size_t i = 0; i < std::size(fns); ++i)
        if (!fns[i]) problems.push_back(std::string("function table entry ") + required[i] + " is NULL");
    const char* session[] = {"session_create", "session_set_sampling", "session_prefill", "session_sample",
                             "session_decode", "session_reset", "session_n_past", "session_last_error",
                             "session_release"};
    const void* sfns[] = {(void*)api.session_create, (void*)api.session_set_sampling,
                          (void*)api.session_prefill, (void*)api.session_sample, (void*)api.session_decode,
                          (void*)api.session_reset, (void*)api.session_n_past,
                          (void*)api.session_last_error, (void*)api.session_release};
    size_t sessions_set = 0;
    for (const void* f : sfns) sessions_set += f != nullptr;
    const bool step_only = api.abi_minor >= 4 && sessions_set == 0 && api.session_logits == nullptr;
    if (!step_only)
        for (size_t i = 0; i < std::size(sfns); ++i)
            if (!sfns[i])
                problems.push_back(std::string("function table entry ") + session[i] + " is NULL" +
                                   (api.abi_minor >= 4 && sessions_set > 0
                                        ? " while other session entries are set: set all or none (1.4)"
                                        : ""));
    return step_only;
}

// A group of three calls a later minor added beside the batched ones (`n_set`
// of them set): all three or none, and only with the batched entries.
void check_group_of_three(size_t n_set, const char* names, const char* version, size_t batched_set,
                          std::vector<std::string>& problems) {
    const std::string group = std::string("function table entries ") + names + " (" + version + ") ";
    if (n_set != 0 && n_set != 3) problems.push_back(group + "come as a group: set all three or none");
    if (n_set != 0 && batched_set == 0) problems.push_back(group + "need the batched (1.2) entries");
}

// From 1.2: the batched entries and the groups that need them.
void check_batched_entries(const eh_plugin_api& api, bool step_only, std::vector<std::string>& problems) {
    if (api.abi_minor < 2) return;
    // The batched members come as a group (seq_logits stays optional).
    const char* batched[] = {"kv_init", "kv_get_info", "seq_create", "seq_fork", "seq_truncate",
                             "seq_set_sampling", "seq_length", "seq_release", "step"};
    const void* bfns[] = {(void*)api.kv_init, (void*)api.kv_get_info, (void*)api.seq_create,
                          (void*)api.seq_fork, (void*)api.seq_truncate, (void*)api.seq_set_sampling,
                          (void*)api.seq_length, (void*)api.seq_release, (void*)api.step};
    size_t set = 0;
    for (const void* f : bfns) set += f != nullptr;
    if (set != 0 && set != std::size(bfns))
        for (size_t i = 0; i < std::size(bfns); ++i)
            if (!bfns[i])
                problems.push_back(std::string("function table entry ") + batched[i] +
                                   " is NULL while other batched (1.2) entries are set: set all or none");
    if (api.abi_minor >= 3 && (api.step_begin != nullptr) != (api.step_end != nullptr))
        problems.push_back("function table entries step_begin and step_end (1.3) come as a pair: set both or neither");
    if (api.abi_minor >= 3 && api.step_begin && set == 0)
        problems.push_back("function table entries step_begin and step_end (1.3) need the batched (1.2) entries");
    if (api.abi_minor >= 5 && api.seq_hidden && set == 0)
        problems.push_back("function table entry seq_hidden (1.5) needs the batched (1.2) entries");
    if (api.abi_minor >= 6) {
        check_group_of_three((api.adapter_load != nullptr) + (api.adapter_release != nullptr) +
                                 (api.seq_set_adapter != nullptr),
                             "adapter_load, adapter_release and seq_set_adapter", "1.6", set, problems);
        check_group_of_three((api.image_encoder_load != nullptr) + (api.image_encode != nullptr) +
                                 (api.seq_embd_spans != nullptr),
                             "image_encoder_load, image_encode and seq_embd_spans", "1.6", set, problems);
    }
    if (api.abi_minor >= 7)  // the host-memory tier
        check_group_of_three((api.seq_park != nullptr) + (api.seq_unpark != nullptr) + (api.parked_release != nullptr),
                             "seq_park, seq_unpark and parked_release", "1.7", set, problems);
    if (step_only && set == 0)
        problems.push_back("function table has neither the session entries nor the batched (1.2) entries: "
                           "a plugin needs one of them to run a model");
}

// info() against the manifest; false when it cannot be called.
bool check_info(const eh_plugin_api& api, const Manifest& m, std::vector<std::string>& problems) {
    const eh_plugin_info* info = nullptr;
    if (!guarded("info()", problems, [&] { info = api.info(); })) return false;
    if (!info) {
        problems.push_back("info() returned NULL");
        return false;
    }
    compare_str("name", m.caps.name, info->name, problems);
    compare_str("version", m.caps.version, info->version, problems);
    compare_str("engine", m.caps.engine, info->engine, problems);
    compare_list("formats", m.caps.formats, c_list(info->formats), problems);
    compare_list("architectures", m.caps.architectures, c_list(info->architectures), problems);
    compare_list("quant_kinds", m.caps.quant_kinds, c_list(info->quant_kinds), problems);
    const char* kind = info->device_kind == EH_DEVICE_CPU    ? "cpu"
                       : info->device_kind == EH_DEVICE_CUDA ? "cuda"
                                                             : "unknown";
    compare_str("device kind", m.caps.device_kind, kind, problems);
    if (info->min_compute_capability != m.caps.min_compute_capability)
        problems.push_back("min_compute_capability disagrees: manifest says " +
                           std::to_string(m.caps.min_compute_capability) + ", plugin says " +
                           std::to_string(info->min_compute_capability));
    return true;
}

// probe() on the device; its result into out.probe; false when it cannot
// be called.
bool probe_device(const eh_plugin_api& api, const LoaderOptions& opt, Opened& out,
                  std::vector<std::string>& problems) {
    eh_probe_result pr{};
    pr.struct_size = sizeof(pr);
    eh_status st = EH_INTERNAL;
    if (!guarded("probe()", problems, [&] { st = api.probe(opt.device, &pr); })) return false;
    pr.reason[sizeof(pr.reason) - 1] = '\0';
    pr.device_name[sizeof(pr.device_name) - 1] = '\0';
    out.probe = pr;
    if (st != EH_OK) {
        std::string msg;
        guarded("plugin_last_error()", problems, [&] {
            const char* e = api.plugin_last_error();
            msg = e ? e : "";
        });
        problems.push_back(std::string("probe failed with ") + eh_status_name(st) + (msg.empty() ? "" : ": " + msg));
    } else if (!pr.supported) {
        problems.push_back(std::string("probe: cannot run here: ") + (pr.reason[0] ? pr.reason : "(no reason given)"));
    }
    return true;
}

// Steps shared by the pre-flight child and the real load. `stage` is told
// what is about to happen, so a crash can be attributed.
Opened open_and_check(const std::string& lib_path, const Manifest& m, const LoaderOptions& opt,
                      std::vector<std::string>& problems,
                      const std::function<void(const char*)>& stage) {
    Opened out;
    const eh_plugin_api* api = open_library(lib_path, out, problems, stage);
    if (!api || !check_version(*api, m, opt, problems)) return out;
    const bool step_only = check_required_entries(*api, problems);
    check_batched_entries(*api, step_only, problems);
    if (!problems.empty()) return out;
    stage("info");
    if (!check_info(*api, m, problems)) return out;
    stage("probe");
    if (!probe_device(*api, opt, out, problems)) return out;
    out.api = api;
    return out;
}

// Pre-flight in a child process. Returns the child's problems, or a crash /
// timeout description. The child never returns from here.
std::vector<std::string> preflight(const std::string& lib_path, const Manifest& m, const LoaderOptions& opt) {
    int fds[2];
    if (pipe(fds) != 0) return {std::string("cannot create pre-flight pipe: ") + std::strerror(errno)};
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return {std::string("cannot fork pre-flight process: ") + std::strerror(errno)};
    }
    if (pid == 0) {
        close(fds[0]);
        auto emit = [&](const std::string& line) {
            std::string l = line;
            std::replace(l.begin(), l.end(), '\n', ' ');
            l += '\n';
            ssize_t off = 0;
            while (off < (ssize_t)l.size()) {
                ssize_t n = write(fds[1], l.data() + off, l.size() - off);
                if (n <= 0) break;
                off += n;
            }
        };
        std::vector<std::string> problems;
        open_and_check(lib_path, m, opt, problems, [&](const char* s) { emit(std::string("stage ") + s); });
        for (const auto& p : problems) emit("problem " + p);
        emit("done");
        _exit(0);
    }
    close(fds[1]);
    std::string buf;
    auto deadline = std::chrono::steady_clock::now() + opt.preflight_timeout;
    bool timed_out = false;
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            timed_out = true;
            break;
        }
        pollfd p{fds[0], POLLIN, 0};
        int r = poll(&p, 1, static_cast<int>(left.count()));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            timed_out = r == 0;
            break;
        }
        char chunk[4096];
        ssize_t n = read(fds[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        buf.append(chunk, n);
    }
    close(fds[0]);
    if (timed_out) kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}

    std::vector<std::string> problems;
    std::string stage = "start", line;
    bool done = false;
    std::istringstream in(buf);
    while (std::getline(in, line)) {
        if (line.rfind("stage ", 0) == 0) stage = line.substr(6);
        else if (line.rfind("problem ", 0) == 0) problems.push_back(line.substr(8));
        else if (line == "done") done = true;
    }
    if (timed_out)
        return {"plugin did not finish " + stage + " within " +
                std::to_string(opt.preflight_timeout.count() / 1000) + " s (pre-flight process killed)"};
    if (WIFSIGNALED(status))
        return {"plugin crashed with signal " + std::to_string(WTERMSIG(status)) + " (" +
                strsignal(WTERMSIG(status)) + ") during " + stage};
    if (!done)
        return {"plugin ended the pre-flight process during " + stage + " (exit status " +
                std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")"};
    return problems;
}

struct Prepared {
    PluginRecord record;
    Manifest manifest;
    bool ready = false;
};

// Steps 1 and 2: everything up to and including the forked pre-flight.
// `ready` is set when the plugin may be opened in this process.
Prepared prepare(const std::string& manifest_path, const LoaderOptions& opt) {
    Prepared prep;
    PluginRecord& rec = prep.record;
    rec.manifest_path = manifest_path;
    std::vector<std::string>& problems = rec.reasons;

    std::string problem;
    std::optional<std::string> text = read_regular_file(manifest_path, kMaxManifestBytes, problem);
    if (!text) {
        problems.push_back("manifest " + problem);
        rec.caps.name = fs::path(manifest_path).filename().string();
        return prep;
    }
    Manifest& m = prep.manifest;
    m = parse_manifest(*text, problems);
    rec.caps = m.caps;
    if (rec.caps.name.empty()) rec.caps.name = fs::path(manifest_path).filename().string();

    if (!m.platform.empty() && m.platform != opt.platform)
        problems.push_back("platform mismatch: manifest says " + m.platform + ", host is " + opt.platform);
    std::string host_v = std::to_string(EH_ABI_MAJOR) + "." + std::to_string(opt.required_abi_minor);
    std::string man_v = std::to_string(m.abi_major) + "." + std::to_string(m.abi_minor);
    if (m.manifest_version) {
        if (m.abi_major != EH_ABI_MAJOR)
            problems.push_back("ABI major mismatch: manifest says " + man_v + ", host needs " + host_v);
        else if (m.abi_minor < opt.required_abi_minor)
            problems.push_back("ABI too old: manifest says " + man_v + ", host needs at least " + host_v);
    }
    if (!m.library.empty() && m.library.find('/') == std::string::npos) {
        fs::path lib = fs::path(manifest_path).parent_path() / m.library;
        rec.library_path = lib.string();
        std::error_code ec;
        if (!fs::exists(lib, ec)) {
            problems.push_back("library " + lib.string() + " does not exist");
        } else if (!fs::is_regular_file(lib, ec)) {
            problems.push_back("library " + lib.string() + " is not a regular file");
        } else if (!m.sha256.empty()) {
            std::string actual = sha256_file_hex(lib.string());
            if (actual != m.sha256)
                problems.push_back("sha256 mismatch: manifest says " + m.sha256 + ", library is " + actual);
        }
    }
    if (!problems.empty()) return prep;  // never open a library that failed validation

    if (opt.isolate_preflight) {
        auto child = preflight(rec.library_path, m, opt);
        if (!child.empty()) {
            problems = std::move(child);
            return prep;
        }
    }
    prep.ready = true;
    return prep;
}

// Step 3: open the plugin in this process and keep it.
PluginRecord finish(Prepared prep, const LoaderOptions& opt) {
    PluginRecord rec = std::move(prep.record);
    if (!prep.ready) return rec;
    if (!opt.open_in_process) {
        rec.accepted = true;
        return rec;
    }
    const Manifest& m = prep.manifest;
    std::vector<std::string>& problems = rec.reasons;
    Opened o = open_and_check(rec.library_path, m, opt, problems, [](const char*) {});
    rec.probe = o.probe;
    if (!problems.empty() || !o.api) {
        if (problems.empty()) problems.push_back("plugin could not be opened");
        return rec;  // `o.library` unloads here: nothing was created from it
    }
    // The table lives inside the library: holding it keeps the library loaded.
    rec.api = std::shared_ptr<const eh_plugin_api>(o.library, o.api);
    rec.accepted = true;
    return rec;
}

LoaderOptions with_defaults(const LoaderOptions& options) {
    LoaderOptions opt = options;
    if (opt.platform.empty()) opt.platform = host_platform();
    return opt;
}

}  // namespace

PluginRecord load_plugin(const std::string& manifest_path, const LoaderOptions& options) {
    LoaderOptions opt = with_defaults(options);
    return finish(prepare(manifest_path, opt), opt);
}

Registry discover_plugins(const std::string& dir, const LoaderOptions& options) {
    return discover_plugins(std::vector<std::string>{dir}, options);
}

Registry discover_plugins(const std::vector<std::string>& dirs, const LoaderOptions& options) {
    std::vector<fs::path> manifests, libraries;
    for (const auto& dir : dirs) {
        std::error_code ec;
        if (!fs::is_directory(dir, ec))
            throw Error(Code::NoPlugin, "plugin directory '" + dir + "' does not exist or is not a directory");
        std::vector<fs::path> m, l;
        for (const auto& e : fs::directory_iterator(dir, ec)) {
            std::string name = e.path().filename().string();
            if (name.size() > std::strlen(kManifestSuffix) &&
                name.compare(name.size() - std::strlen(kManifestSuffix), std::string::npos, kManifestSuffix) == 0)
                m.push_back(e.path());
            else if (e.path().extension() == ".so")
                l.push_back(e.path());
        }
        if (ec) throw Error(Code::NoPlugin, "cannot list plugin directory '" + dir + "': " + ec.message());
        std::sort(m.begin(), m.end());
        std::sort(l.begin(), l.end());
        manifests.insert(manifests.end(), m.begin(), m.end());
        libraries.insert(libraries.end(), l.begin(), l.end());
    }

    // Every pre-flight runs before any plugin is opened here: a forked child
    // cannot use CUDA once this process has initialised it, so a CUDA plugin
    // opened in-process would make the next one's pre-flight fail.
    LoaderOptions opt = with_defaults(options);
    std::vector<Prepared> prepared;
    for (const auto& mp : manifests) prepared.push_back(prepare(mp.string(), opt));

    Registry reg;
    std::set<fs::path> claimed;
    std::map<std::string, std::string> first_dir;  // plugin name -> the directory it was accepted from
    for (auto& prep : prepared) {
        const std::string name = prep.record.caps.name;
        const std::string dir = fs::path(prep.record.manifest_path).parent_path().string();
        if (!prep.record.library_path.empty()) claimed.insert(fs::path(prep.record.library_path));
        if (prep.ready && first_dir.count(name) && first_dir[name] != dir) {
            // The search order decides: an earlier directory's copy serves.
            prep.record.reasons.push_back("a plugin named " + name + " was already found in " + first_dir[name] +
                                          " (earlier in the search order); this copy was not loaded");
            reg.add(std::move(prep.record));
            continue;
        }
        PluginRecord rec = finish(std::move(prep), opt);
        if (rec.accepted) first_dir.emplace(name, dir);
        reg.add(std::move(rec));
    }
    for (const auto& lib : libraries) {
        if (claimed.count(lib)) continue;
        PluginRecord rec;
        rec.library_path = lib.string();
        rec.caps.name = lib.filename().string();
        rec.reasons.push_back("no manifest names this library (expected a *" + std::string(kManifestSuffix) +
                              " beside it); it was not loaded");
        reg.add(std::move(rec));
    }
    return reg;
}

}  // namespace eh::loader
