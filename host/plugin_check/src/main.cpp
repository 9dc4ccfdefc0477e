// eh-plugin-check PLUGIN --model FILE [--reference PLUGIN]: drives an engine
// plugin through the ABI (checks.hpp) and reports by name what holds and
// what does not. Exit 0 when no check failed, 1 when one did, 2 for a bad
// command line, 3 when the plugin cannot be loaded at all.
#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>

#include "checks.hpp"
#include "eh/error.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "gpu_set.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace eh;

namespace {

constexpr const char* kUsage =
    "Usage: eh-plugin-check PLUGIN --model FILE [--reference PLUGIN] [--kv-type f16|q8_0|fp8] [--engine-options JSON] [--only NAME]... [--json]\n"
    "PLUGIN: the plugin's library (libeh-NAME.so) or its manifest (NAME.manifest.json).";

// The plugin directory of a library or manifest path, and which record there is it.
std::pair<std::string, std::string> locate(const std::string& arg) {
    const fs::path p(arg);
    if (!fs::is_regular_file(p)) throw Error(Code::PluginRejected, fmt::format("'{}' is not a file", arg));
    return {p.parent_path().empty() ? "." : p.parent_path().string(), fs::canonical(p).string()};
}

const PluginRecord& pick(const Registry& reg, const std::string& file) {
    for (const PluginRecord& r : reg.records()) {
        const bool match = (!r.library_path.empty() && fs::exists(r.library_path) &&
                            fs::canonical(r.library_path).string() == file) ||
                           (!r.manifest_path.empty() && fs::exists(r.manifest_path) &&
                            fs::canonical(r.manifest_path).string() == file);
        if (!match) continue;
        if (!r.accepted) {
            std::string why;
            for (const auto& x : r.reasons) why += "\n  " + x;
            throw Error(Code::PluginRejected, fmt::format("the host rejects the plugin:{}", why));
        }
        return r;
    }
    throw Error(Code::PluginRejected, fmt::format("no plugin manifest beside '{}' names it", file));
}

void add_options(po::options_description& desc) {
    desc.add_options()("help,h", "this text")("model,m", po::value<std::string>(), "a GGUF file the plugin serves")(
        "reference", po::value<std::string>(), "a second plugin (e.g. cpu-reference) whose greedy tokens to agree with")(
        "only", po::value<std::vector<std::string>>(), "run only this check (repeatable)")(
        "tokens,n", po::value<uint32_t>()->default_value(8), "tokens each generation samples (2..64)")(
        "engine-options", po::value<std::string>()->default_value(""),
        "a JSON object for every load of the plugin under test (eh_load_params.options_json), as serve's "
        "--engine-options; the reference loads with none")(
        "gpus", po::value<std::string>(),
        "load the plugin under test over these GPUs (ABI 1.6 device set, rank order), e.g. 0,1; a GPU twice is "
        "the one-GPU shard mode (0,0); the reference loads on one")(
        "kv-type", po::value<std::string>(),
        "run every check over this KV cache type (ABI 1.4 kv_type): f16, q8_0 or fp8; default: the plugin's own")(
        "list", "list the checks and exit")("json", "print the results as JSON");
}

// --tokens, --gpus and --kv-type into `o`; false (the error printed) for a
// usage error.
bool read_numbers(const po::variables_map& vm, plugin_check::CheckOptions& o) {
    o.n_tokens = vm["tokens"].as<uint32_t>();
    if (o.n_tokens < 2 || o.n_tokens > 64) {
        std::cerr << "error: --tokens must be between 2 and 64\n";
        return false;
    }
    if (vm.count("gpus")) {
        std::vector<int> gpus;
        std::string err;
        if (!eh::cli::parse_gpu_list(vm["gpus"].as<std::string>(), gpus, err)) {
            std::cerr << "error: " << err << "\n";
            return false;
        }
        o.devices.assign(gpus.begin(), gpus.end());
    }
    if (vm.count("kv-type")) {
        const std::string& t = vm["kv-type"].as<std::string>();
        o.kv_type = t == "f16" ? EH_TYPE_F16 : t == "q8_0" ? EH_TYPE_Q8_0 : t == "fp8" ? EH_TYPE_FP8_E4M3 : 0;
        if (!o.kv_type) {
            std::cerr << "error: --kv-type must be f16, q8_0 or fp8, not '" << t << "'\n";
            return false;
        }
    }
    return true;
}

// The checks' results, as text lines or one JSON document; the exit code.
int report(const std::vector<plugin_check::CheckResult>& results, const PluginRecord& rec, bool json) {
    int failed = 0, skipped = 0;
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : results) {
        using S = plugin_check::CheckResult::Status;
        const char* status = r.status == S::Pass ? "pass" : r.status == S::Fail ? "fail" : "skip";
        failed += r.status == S::Fail;
        skipped += r.status == S::Skip;
        j.push_back({{"name", r.name}, {"status", status}, {"what", r.what}, {"detail", r.detail}});
        if (!json)
            std::cout << fmt::format("{:<5} {:<24} {}\n", r.status == S::Pass ? "PASS" : r.status == S::Fail ? "FAIL" : "SKIP",
                                     r.name, r.detail.empty() ? r.what : r.detail);
    }
    if (json)
        std::cout << nlohmann::json{{"plugin", rec.caps.name}, {"version", rec.caps.version},
                                    {"abi", fmt::format("{}.{}", rec.api->abi_major, rec.api->abi_minor)},
                                    {"checks", j}}
                         .dump(2)
                  << "\n";
    else
        std::cout << fmt::format("{}: {} passed, {} failed, {} skipped\n", rec.caps.name,
                                 results.size() - failed - skipped, failed, skipped);
    return failed ? 1 : 0;
}

// Finds the plugin (and the reference) and runs the checks.
int run(const po::variables_map& vm, plugin_check::CheckOptions& o) {
    auto [dir, file] = locate(vm["plugin"].as<std::string>());
    std::vector<std::string> dirs{dir};
    std::string ref_file;
    if (vm.count("reference")) {
        auto [rdir, rfile] = locate(vm["reference"].as<std::string>());
        ref_file = rfile;
        if (rdir != dir) dirs.push_back(rdir);
    }
    // One discovery for both (a CUDA plugin opened in this process would
    // fail a later discovery's forked pre-flight).
    const Registry reg = loader::discover_plugins(dirs);
    const PluginRecord& rec = pick(reg, file);
    o.plugin = rec.api;
    if (!ref_file.empty()) o.reference = pick(reg, ref_file).api;
    o.model = model::ModelFile::open(vm["model"].as<std::string>());
    o.engine_options = vm["engine-options"].as<std::string>();
    if (vm.count("only")) o.only = vm["only"].as<std::vector<std::string>>();
    return report(plugin_check::run_checks(o), rec, vm.count("json") > 0);
}

}  // namespace

int main(int argc, char** argv) {
    po::options_description desc("Options");
    add_options(desc);
    po::options_description hidden;
    hidden.add_options()("plugin", po::value<std::string>());
    po::options_description all;
    all.add(desc).add(hidden);
    po::positional_options_description pos;
    pos.add("plugin", 1);
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(argc, argv)
                      .options(all)
                      .positional(pos)
                      .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                      .run(),
                  vm);
        po::notify(vm);
    } catch (const po::error& e) {
        std::cerr << "error: " << e.what() << " (try --help)\n";
        return 2;
    }
    if (vm.count("help")) {
        std::cout << kUsage << "\n\n" << desc << "\n";
        return 0;
    }
    if (vm.count("list")) {
        for (const auto& [name, what] : plugin_check::check_names()) std::cout << fmt::format("{:<24} {}\n", name, what);
        return 0;
    }
    if (!vm.count("plugin") || !vm.count("model")) {
        std::cerr << "error: a plugin and --model are required\n" << kUsage << "\n";
        return 2;
    }
    plugin_check::CheckOptions o;
    if (!read_numbers(vm, o)) return 2;
    try {
        return run(vm, o);
    } catch (const Error& e) {
        std::cerr << "error: " << e.what() << "\n";
        return e.code() == Code::InvalidRequest ? 2 : 3;
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << "\n";
        return 3;
    }
}
