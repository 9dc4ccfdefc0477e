// `engine-host bench`: prefill/decode throughput, TTFT and inter-token
// latency of a model through each plugin that serves it, on the path the
// server serves (the batched step) unless --path session.
//
// SIGINT and SIGTERM stop it between steps (and inside a plugin's load,
// prefill or decode, through the plugin's cancel callback): it prints why on
// stderr, no results, and exits 128 + the signal (130, 143). The handlers are
// installed explicitly, so a SIGINT ignored by the parent (a background job
// of a script) stops it too.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>

#include "cli.hpp"
#include "eh/tools/bench.hpp"
#include "eh/loader/plugin_search.hpp"
#include "gpu_set.hpp"
#include "kv_cache_option.hpp"
#include "model_ref.hpp"
#include "options.hpp"

namespace eh::cli {
namespace {

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int sig) { g_stop_signal = sig; }

}  // namespace

int cmd_bench(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("plugins", po::value<std::vector<std::string>>(), kPluginsHelp)
        ("model,m", po::value<std::string>()->required(), kModelHelp)
        ("offline", kOfflineHelp)
        ("plugin", po::value<std::string>()->default_value(""), "only this plugin (default: every plugin that serves the model)")
        ("p,p", po::value<uint32_t>()->default_value(512), "prompt tokens (prefill); -p and -n are scaled down together when p+n exceeds the model context")
        ("n,n", po::value<uint32_t>()->default_value(128), "generated tokens (decode)")
        ("r,r", po::value<uint32_t>()->default_value(5), "repetitions (after one warm-up)")
        ("gpu", po::value<int>()->default_value(0), "GPU ordinal")
        ("tensor-parallel", po::value<uint32_t>()->default_value(1),
         "ranks the model is split over (1-8), on GPUs 0..N-1 unless --gpus names them; a plugin that serves one "
         "device fails its run naming why")
        ("gpus", po::value<std::string>(), "the ranks' GPUs, rank order, e.g. 0,1 (a GPU twice: the one-GPU shard mode)")
        ("threads", po::value<uint32_t>()->default_value(0), "CPU threads for CPU plugins (0 = plugin default)")
        ("path", po::value<std::string>()->default_value("step"),
         "step: the batched step the server serves (prefill in --batch-tokens chunks, decode steps chained where the "
         "plugin runs them in two halves); session: the plugin's one-sequence session calls. A plugin without the "
         "batched calls (ABI < 1.2) runs the session path either way, and the report says so")
        ("batch", po::value<uint32_t>()->default_value(1),
         "sequences prefilled and decoding together, each with its own prompt (step path, 1-4096); tokens/s add "
         "every sequence's tokens, tg/seq is one sequence's rate")
        ("batch-tokens", po::value<uint32_t>()->default_value(2048),
         "tokens per step, as serve's --batch-tokens: prompts are prefilled in chunks that share it (16-65536)")
        ("no-chained-steps", "step path: read every decode step's tokens before the next step starts, as serve "
                             "--no-chained-steps (by default the next begins first where the plugin can)")
        ("kv-cache-size-mb", po::value<uint64_t>()->default_value(0),
         "step path's KV-cache pool (default: the plugin's share of device memory); it must hold --batch sequences "
         "of p+n+1 tokens")
        ("kv-cache-type", po::value<std::string>(), kKvCacheTypeHelp)
        ("engine-options", po::value<std::string>()->default_value(""),
         "JSON object handed to the plugin's model load, as serve's --engine-options (each plugin's README lists its keys)")
        ("json", "print one JSON object instead of a table")
        ("verbose,v", "progress lines on stderr");
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, desc, "Usage: engine-host bench --model REF [--plugins DIR] [-p 512] [-n 128] [-r 5] [--batch 1]\n"
                       "                          [--batch-tokens 2048] [--path step|session] [--json]\n"
                       "Per repetition (one warm-up first): --batch sequences prefill p-token prompts and decode n\n"
                       "tokens together through the server's batched step; medians of -r repetitions.\n"
                       "SIGINT/SIGTERM stop it within a step: no results, exit 130/143.",
                       vm, code))
        return code;
    tools::BenchOptions o;
    o.plugin_dirs = loader::plugin_dirs(plugins_arg(vm));
    o.model = resolve_model_ref(vm["model"].as<std::string>(), vm.count("offline") > 0);
    o.plugin = vm["plugin"].as<std::string>();
    o.n_prompt = vm["p"].as<uint32_t>();
    o.n_gen = vm["n"].as<uint32_t>();
    o.reps = vm["r"].as<uint32_t>();
    o.device = vm["gpu"].as<int>();
    {
        uint32_t tp = 1;
        std::vector<int> gpus;
        std::string err;
        const std::string gpus_text = vm.count("gpus") ? vm["gpus"].as<std::string>() : std::string();
        if (!check_gpu_flags(vm["tensor-parallel"].as<uint32_t>(), !vm["tensor-parallel"].defaulted(),
                             vm.count("gpus") ? &gpus_text : nullptr, false, tp, gpus, err) ||
            (vm.count("gpus") && !vm["gpu"].defaulted() && !(err = "--gpus and --gpu both name GPUs: use one").empty())) {
            print_error(err);
            return kUsage;
        }
        if (gpus.empty() && tp > 1)
            for (uint32_t i = 0; i < tp; ++i) gpus.push_back(int(i));
        o.devices.assign(gpus.begin(), gpus.end());
    }
    o.threads = vm["threads"].as<uint32_t>();
    o.path = tools::parse_bench_path(vm["path"].as<std::string>());  // bad values: usage errors, as below
    o.batch = vm["batch"].as<uint32_t>();  // ranges are checked by run_bench (INVALID_REQUEST: exit 2)
    o.batch_tokens = vm["batch-tokens"].as<uint32_t>();
    o.kv_budget_bytes = vm["kv-cache-size-mb"].as<uint64_t>() * 1024 * 1024;
    o.kv_type = kv_cache_type_arg(vm);
    o.engine_options = vm["engine-options"].as<std::string>();
    o.chained_steps = vm.count("no-chained-steps") == 0;
    if (vm.count("verbose")) o.log = [](const std::string& s) { std::fprintf(stderr, "bench: %s\n", s.c_str()); };
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // the plugin pre-flight's reads and waits carry on
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    o.stop = [] { return g_stop_signal != 0; };
    tools::BenchReport r;
    try {
        r = tools::run_bench(o);
    } catch (const Error& e) {
        if (const int sig = g_stop_signal; sig != 0) {
            print_error(std::string("bench stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + "; no results");
            return 128 + sig;
        }
        throw;
    }
    if (vm.count("json")) std::cout << tools::to_json(r).dump(2) << "\n";
    else std::cout << tools::to_table(r);
    for (const auto& run : r.runs)
        if (!run.error.empty()) return kFailure;
    return kOk;
}

}  // namespace eh::cli
