// `engine-host bench`: llama-bench style numbers for one model through every
// plugin that serves it (or one named plugin). Times are taken with
// std::chrono around the plugin calls; plugins synchronize their device
// before returning a token id, so a returned call is finished work.
//
// Two paths. "step" (the default) runs the path the server serves: the
// plugin's batched step through eh::service::SeqEngine, as the scheduler
// forms it. Per repetition it creates `batch` sequences, each with its own
// p-token prompt, prefills them in steps of at most `batch_tokens` tokens
// (several sequences' chunks share a step; a sequence's last chunk samples
// its first token), then decodes n tokens for all of them together, one step
// a token, each step begun before the previous one is read where the plugin
// runs steps in two halves (ABI 1.3), and releases the sequences. Decodes are
// not mixed into prefill steps (the scheduler would mix them once a sequence
// has its first token) so that the two rates stay separate; loadgen through
// the server measures the mix. "session" runs the plugin's one-sequence
// session calls: reset, prefill, sample the first token, decode n tokens one
// call each; a plugin without the batched calls (ABI < 1.2) runs only this,
// and the step path falls back to it for such a plugin and says so.
//
// One warm-up repetition runs first and is not counted. Reported numbers are
// medians over r repetitions; time to first token pools every sequence of
// every repetition, inter-token latency every decode step of every one.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace eh::tools {

enum class BenchPath { Step, Session };
const char* path_name(BenchPath p);          // "step", "session"
// "step" or "session"; anything else throws Error(InvalidRequest).
BenchPath parse_bench_path(const std::string& s);

struct BenchOptions {
    std::string plugins_dir;
    std::vector<std::string> plugin_dirs;  // searched instead of plugins_dir when not empty
    std::string model;
    std::string plugin;          // only this plugin (by name); "" = every one that serves the model
    uint32_t n_prompt = 512;
    uint32_t n_gen = 128;
    uint32_t reps = 5;
    int32_t device = 0;
    // (ABI 1.6) the GPUs of a tensor-parallel load, rank order (a GPU twice:
    // the shard mode); empty: `device` alone. A plugin that spans fewer
    // devices fails its run, naming why.
    std::vector<int32_t> devices;
    uint32_t threads = 0;        // CPU plugins; 0 = plugin default
    BenchPath path = BenchPath::Step;
    uint32_t batch = 1;          // sequences prefilled and decoded together (step path; 1-4096)
    uint32_t batch_tokens = 2048;  // tokens a step may hold, as serve's --batch-tokens (16-65536)
    uint64_t kv_budget_bytes = 0;  // step path's KV pool; 0 = the plugin's default share of memory
    uint32_t kv_type = 0;          // step path's KV element type (ABI 1.4 kv_type); 0 = the plugin's default
    std::string engine_options;    // the load's plugin-specific JSON (eh_load_params.options_json), as serve's
    // Step path: begin each decode step before the previous one is read where
    // the plugin can (serve's default); false reads every step first, as
    // serve --no-chained-steps.
    bool chained_steps = true;
    std::function<void(const std::string&)> log;
    // May be empty. Polled before each repetition and decode step, and by the
    // plugin through its cancel callbacks while it loads, prefills or decodes;
    // once true, run_bench throws Error(CANCELLED) and reports nothing.
    std::function<bool()> stop;
};

struct BenchRun {
    std::string plugin, plugin_version, engine, device_kind, device_name;
    std::string path;            // what ran: "step" or "session"
    std::string path_note;       // why it is not the path asked for; empty when it is
    uint32_t batch = 1;          // sequences run together
    uint32_t step_tokens = 0;    // step path: tokens a step holds, as the plugin granted
    std::string kv_cache_type;   // step path: what the KV blocks hold ("f16", "q8_0", ...; "unknown")
    uint32_t kv_blocks = 0;      // step path: KV blocks granted
    bool chained = false;        // step path: decode steps begun before the previous one is read
    uint32_t prefill_steps = 0;  // step path: steps the prefill of one repetition took
    double load_ms = 0;
    // Medians. Prefill and decode count every sequence's tokens (aggregate);
    // decode_tok_s_per_seq is one sequence's rate (decode_tok_s / batch).
    double prefill_tok_s = 0, decode_tok_s = 0, decode_tok_s_per_seq = 0;
    double ttft_ms = 0;                          // median
    double itl_p50_ms = 0, itl_p95_ms = 0;
    uint64_t device_bytes = 0, host_bytes = 0;   // model info after the runs
    std::vector<double> prefill_ms, decode_ms;   // per repetition
    // Sequence 0's tokens in the last repetition: the first token, then the
    // n decoded. Sampling is greedy, so both paths must agree on them.
    std::vector<int32_t> tokens;
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

// Throws eh::Error for an unreadable plugin dir or model, INVALID_REQUEST for
// options out of range (-p/-n/-r/batch 0, batch_tokens outside 16-65536, a
// batch larger than batch_tokens or than 1 on the session path), and
// CANCELLED when options.stop says so; a plugin that fails mid-run is recorded in
// BenchRun::error and the others still run.
BenchReport run_bench(const BenchOptions& options);

nlohmann::json to_json(const BenchReport& r);
std::string to_table(const BenchReport& r);

// p + n capped to a model of `context_length` positions (0 = no limit):
// unchanged when p + n + 1 fit (the session holds one more slot than it
// uses), else both scaled down in proportion, each at least 1. A tiny GPT-2
// (128 positions) asked for pp512/tg128 runs pp101/tg26.
std::pair<uint32_t, uint32_t> fit_context(uint32_t n_prompt, uint32_t n_gen, uint32_t context_length);

// The deterministic prompt of sequence `seq`: n token ids spread over
// [0, n_vocab). Sequences get different prompts (a mixture-of-experts model
// given N copies of one prompt would route every sequence to the same
// experts); sequence 0's is the session path's.
std::vector<int32_t> bench_prompt(uint32_t n, uint32_t n_vocab, uint32_t seq = 0);
// p-th percentile (0..100) by linear interpolation; 0 for an empty input.
double percentile(std::vector<double> v, double p);

}  // namespace eh::tools
