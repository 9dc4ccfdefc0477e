// `engine-host bench`: llama-bench style numbers for one model through every
// plugin that serves it (or one named plugin). Times are taken with
// std::chrono around the ABI calls; plugins synchronize their device before
// returning a token id, so a returned call is finished work.
//
// Per repetition: reset the session, prefill a p-token prompt, sample the
// first token (time to first token = prefill + sample), then decode n
// tokens one at a time. One warm-up repetition runs first and is not
// counted. Reported numbers are medians over r repetitions; inter-token
// latency percentiles pool every decode step of every repetition.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace eh::tools {

struct BenchOptions {
    std::string plugins_dir;
    std::vector<std::string> plugin_dirs;  // searched instead of plugins_dir when not empty
    std::string model;
    std::string plugin;          // only this plugin (by name); "" = every one that serves the model
    uint32_t n_prompt = 512;
    uint32_t n_gen = 128;
    uint32_t reps = 5;
    int32_t device = 0;
    uint32_t threads = 0;        // CPU plugins; 0 = plugin default
    std::function<void(const std::string&)> log;
    // May be empty. Polled before each repetition and decode step, and by the
    // plugin through its cancel callbacks while it loads, prefills or decodes;
    // once true, run_bench throws Error(CANCELLED) and reports nothing.
    std::function<bool()> stop;
};

struct BenchRun {
    std::string plugin, plugin_version, engine, device_kind, device_name;
    double load_ms = 0;
    double prefill_tok_s = 0, decode_tok_s = 0;  // medians
    double ttft_ms = 0;                          // median
    double itl_p50_ms = 0, itl_p95_ms = 0;
    uint64_t device_bytes = 0, host_bytes = 0;   // model info after the runs
    std::vector<double> prefill_ms, decode_ms;   // per repetition
    std::string error;                           // non-empty: this plugin failed
};

struct BenchReport {
    std::string model, architecture, quant;
    uint64_t model_bytes = 0;
    uint32_t n_vocab = 0;
    BenchOptions options;        // as requested
    // What was run: the request capped to the model's context (see fit_context).
    uint32_t context_length = 0; // {arch}.context_length; 0 = unknown (no cap)
    uint32_t n_prompt = 0, n_gen = 0;
    std::vector<BenchRun> runs;
    std::vector<std::pair<std::string, std::string>> skipped;  // plugin, why
};

// Throws eh::Error for an unreadable plugin dir or model, and CANCELLED
// when options.stop says so; a plugin that fails mid-run is recorded in
// BenchRun::error and the others still run.
BenchReport run_bench(const BenchOptions& options);

nlohmann::json to_json(const BenchReport& r);
std::string to_table(const BenchReport& r);

// p + n capped to a model of `context_length` positions (0 = no limit):
// unchanged when p + n + 1 fit (the session holds one more slot than it
// uses), else both scaled down in proportion, each at least 1. A tiny GPT-2
// (128 positions) asked for pp512/tg128 runs pp101/tg26.
std::pair<uint32_t, uint32_t> fit_context(uint32_t n_prompt, uint32_t n_gen, uint32_t context_length);

// The deterministic prompt: n token ids spread over [0, n_vocab).
std::vector<int32_t> bench_prompt(uint32_t n, uint32_t n_vocab);
// p-th percentile (0..100) by linear interpolation; 0 for an empty input.
double percentile(std::vector<double> v, double p);

}  // namespace eh::tools
