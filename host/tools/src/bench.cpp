#include "eh/tools/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "eh/error.hpp"
#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/descriptor.hpp"
#include "eh/model/model_file.hpp"

namespace eh::tools {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) { return percentile(std::move(v), 50.0); }

// Ends the run when the caller asked to stop (a signal, for the CLI).
void check_stop(const BenchOptions& o) {
    if (o.stop && o.stop()) throw Error(Code::Cancelled, "bench stopped before it finished");
}

// `o` carries the numbers actually run (already fitted to the context).
BenchRun bench_one(const PluginRecord& rec, const std::shared_ptr<model::ModelFile>& mf, const BenchOptions& o) {
    BenchRun run;
    run.plugin = rec.caps.name;
    run.plugin_version = rec.caps.version;
    run.engine = rec.caps.engine;
    run.device_kind = rec.caps.device_kind;
    if (rec.probe) run.device_name = rec.probe->device_name;
    try {
        EngineLoadOptions lo;
        lo.device = o.device;
        lo.n_threads = o.threads;
        lo.cancel = o.stop;
        std::string last_stage;  // -v: each distinct load stage once (the CUDA plugins' kernel plan lines among them)
        if (o.log)
            lo.progress = [&](float, const char* stage) {
                if (stage && *stage && last_stage != stage) o.log(last_stage = stage);
            };
        auto t0 = Clock::now();
        auto model = EngineModel::load(rec.api, mf->path(), &mf->view(), mf, lo);
        run.load_ms = ms_since(t0);
        eh_model_info info = model->info();
        if (info.device_name[0]) run.device_name = info.device_name;
        const uint32_t n_vocab = info.vocab_size;
        if (n_vocab == 0) throw Error(Code::Internal, "plugin reports a vocabulary of 0 tokens");
        const auto prompt = bench_prompt(o.n_prompt, n_vocab);
        auto session = model->create_session(o.n_prompt + o.n_gen + 1, o.stop);
        eh_sampling_params sp{};
        sp.struct_size = sizeof(sp);
        sp.temperature = 0.0f;
        sp.top_p = 1.0f;
        sp.repetition_penalty = 1.0f;
        sp.repetition_window = -1;
        sp.seed = 1234;
        session->set_sampling(sp);

        std::vector<double> prefill_ms, decode_ms, ttft_ms, itl_ms;
        for (uint32_t rep = 0; rep <= o.reps; ++rep) {  // rep 0 is the warm-up
            check_stop(o);
            session->reset();
            auto t_start = Clock::now();
            session->prefill(prompt);
            const double t_prefill = ms_since(t_start);
            int32_t tok = session->sample();
            const double t_first = ms_since(t_start);
            std::vector<double> steps;
            steps.reserve(o.n_gen);
            auto t_dec = Clock::now();
            for (uint32_t i = 0; i < o.n_gen; ++i) {
                check_stop(o);
                auto ts = Clock::now();
                tok = session->decode(tok);
                steps.push_back(ms_since(ts));
            }
            const double t_decode = ms_since(t_dec);
            if (o.log) o.log(fmt::format("{} rep {}{}: prefill {:.1f} ms, decode {:.1f} ms", run.plugin, rep,
                                         rep == 0 ? " (warm-up)" : "", t_prefill, t_decode));
            if (rep == 0) continue;
            prefill_ms.push_back(t_prefill);
            decode_ms.push_back(t_decode);
            ttft_ms.push_back(t_first);
            itl_ms.insert(itl_ms.end(), steps.begin(), steps.end());
        }
        run.prefill_ms = prefill_ms;
        run.decode_ms = decode_ms;
        std::vector<double> pp, tg;
        for (double v : prefill_ms) pp.push_back(v > 0 ? o.n_prompt * 1000.0 / v : 0);
        for (double v : decode_ms) tg.push_back(v > 0 ? o.n_gen * 1000.0 / v : 0);
        run.prefill_tok_s = median(pp);
        run.decode_tok_s = median(tg);
        run.ttft_ms = median(ttft_ms);
        run.itl_p50_ms = percentile(itl_ms, 50);
        run.itl_p95_ms = percentile(itl_ms, 95);
        info = model->info();
        run.device_bytes = info.device_bytes_used;
        run.host_bytes = info.host_bytes_used;
    } catch (const std::exception& e) {
        check_stop(o);  // a plugin cancelled by the stop callback failed because it was asked to
        run.error = e.what();
    }
    return run;
}

std::string human_bytes(uint64_t b) {
    if (b >= (uint64_t(1) << 30)) return fmt::format("{:.2f} GiB", b / double(uint64_t(1) << 30));
    if (b >= (uint64_t(1) << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
    return fmt::format("{} B", b);
}

}  // namespace

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const double pos = std::clamp(p, 0.0, 100.0) / 100.0 * double(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

std::pair<uint32_t, uint32_t> fit_context(uint32_t n_prompt, uint32_t n_gen, uint32_t context_length) {
    if (context_length == 0) return {n_prompt, n_gen};
    const uint64_t budget = context_length > 2 ? context_length - 1 : 2;
    const uint64_t want = uint64_t(n_prompt) + n_gen;
    if (want <= budget) return {n_prompt, n_gen};
    const uint64_t p = std::clamp<uint64_t>(uint64_t(n_prompt) * budget / want, 1, budget - 1);
    const uint64_t n = std::clamp<uint64_t>(budget - p, 1, n_gen);
    return {static_cast<uint32_t>(p), static_cast<uint32_t>(n)};
}

std::vector<int32_t> bench_prompt(uint32_t n, uint32_t n_vocab) {
    std::vector<int32_t> out(n);
    // A stride coprime with any vocab size we meet walks the whole range
    // without landing on one id twice in a short prompt.
    uint64_t x = 1000 % n_vocab;
    for (uint32_t i = 0; i < n; ++i) {
        out[i] = static_cast<int32_t>(x);
        x = (x + 7919) % n_vocab;
    }
    return out;
}

BenchReport run_bench(const BenchOptions& o) {
    if (o.n_prompt == 0 || o.n_gen == 0 || o.reps == 0)
        throw Error(Code::InvalidRequest, "bench: -p, -n and -r must be at least 1");
    BenchReport rep;
    rep.options = o;
    std::shared_ptr<model::ModelFile> mf = model::ModelFile::open(o.model);
    rep.model = o.model;
    rep.architecture = std::string(mf->architecture());
    const model::ModelDescriptor desc = model::describe(*mf);
    rep.quant = desc.quant_kind;
    rep.model_bytes = mf->file_size();
    if (auto toks = mf->get_string_array("tokenizer.ggml.tokens"); !toks.empty()) rep.n_vocab = toks.size();
    uint64_t ctx = mf->get_uint(mf->arch_key("context_length")).value_or(0);
    // GPT-2 has no more positions than rows of its position embedding.
    if (const eh_tensor* pe = mf->find_tensor("position_embd.weight"); pe && pe->n_dims >= 2 && pe->dims[1] > 0)
        ctx = ctx ? std::min<uint64_t>(ctx, pe->dims[1]) : pe->dims[1];
    rep.context_length = static_cast<uint32_t>(std::min<uint64_t>(ctx, UINT32_MAX));
    std::tie(rep.n_prompt, rep.n_gen) = fit_context(o.n_prompt, o.n_gen, rep.context_length);
    if (o.log && (rep.n_prompt != o.n_prompt || rep.n_gen != o.n_gen))
        o.log(fmt::format("-p {} -n {} does not fit a context of {}: running -p {} -n {}", o.n_prompt, o.n_gen,
                          rep.context_length, rep.n_prompt, rep.n_gen));
    BenchOptions run_opts = o;
    run_opts.n_prompt = rep.n_prompt;
    run_opts.n_gen = rep.n_gen;

    loader::LoaderOptions lo;
    lo.device = o.device;
    const std::vector<std::string> dirs = o.plugin_dirs.empty() ? std::vector<std::string>{o.plugins_dir} : o.plugin_dirs;
    Registry reg = loader::discover_plugins(dirs, lo);
    const ModelRequirements need = desc.requirements();
    std::vector<const PluginRecord*> chosen;
    for (const PluginRecord& r : reg.records()) {
        if (!o.plugin.empty() && r.caps.name != o.plugin) continue;
        if (!r.accepted) {
            std::string why = "rejected";
            for (const auto& s : r.reasons) why += "; " + s;
            rep.skipped.emplace_back(r.caps.name.empty() ? r.manifest_path : r.caps.name, why);
            continue;
        }
        auto gaps = Registry::shortfalls(r.caps, need);
        if (!gaps.empty()) {
            std::string why;
            for (const auto& s : gaps) why += (why.empty() ? "" : "; ") + s;
            rep.skipped.emplace_back(r.caps.name, why);
            continue;
        }
        chosen.push_back(&r);
    }
    if (chosen.empty()) {
        std::string why;
        for (const auto& [n, w] : rep.skipped) why += fmt::format("\n  {}: {}", n, w);
        throw Error(Code::NoPlugin, fmt::format("no plugin in '{}' serves '{}' ({} {}){}", fmt::join(dirs, ", "), o.model,
                                                rep.architecture, rep.quant, why));
    }
    for (const PluginRecord* r : chosen) {
        check_stop(o);
        if (o.log) o.log(fmt::format("benchmarking {} on {}", r->caps.name, o.model));
        rep.runs.push_back(bench_one(*r, mf, run_opts));
    }
    return rep;
}

nlohmann::json to_json(const BenchReport& r) {
    nlohmann::json runs = nlohmann::json::array();
    for (const auto& x : r.runs) {
        nlohmann::json j = {
            {"plugin", x.plugin}, {"plugin_version", x.plugin_version}, {"engine", x.engine},
            {"device_kind", x.device_kind}, {"device_name", x.device_name}, {"ok", x.error.empty()},
        };
        if (!x.error.empty()) {
            j["error"] = x.error;
        } else {
            j["load_ms"] = x.load_ms;
            // The model file's bytes over the plugin's load call (page cache
            // unless the file was cold): the "load >= 5 GB/s" goal.
            j["load_gb_per_s"] = x.load_ms > 0 ? double(r.model_bytes) / (x.load_ms * 1e6) : 0.0;
            j["prefill_tokens_per_s"] = x.prefill_tok_s;
            j["decode_tokens_per_s"] = x.decode_tok_s;
            j["ttft_ms"] = x.ttft_ms;
            j["itl_p50_ms"] = x.itl_p50_ms;
            j["itl_p95_ms"] = x.itl_p95_ms;
            j["peak_device_bytes"] = x.device_bytes;
            j["host_bytes"] = x.host_bytes;
            j["prefill_ms"] = x.prefill_ms;
            j["decode_ms"] = x.decode_ms;
        }
        runs.push_back(std::move(j));
    }
    nlohmann::json skipped = nlohmann::json::array();
    for (const auto& [n, w] : r.skipped) skipped.push_back({{"plugin", n}, {"reason", w}});
    return {
        {"model", r.model}, {"architecture", r.architecture}, {"quant", r.quant},
        {"model_bytes", r.model_bytes}, {"n_vocab", r.n_vocab},
        {"n_prompt", r.n_prompt}, {"n_gen", r.n_gen}, {"reps", r.options.reps},
        {"n_prompt_requested", r.options.n_prompt}, {"n_gen_requested", r.options.n_gen},
        {"context_length", r.context_length},
        {"capped", r.n_prompt != r.options.n_prompt || r.n_gen != r.options.n_gen},
        {"results", runs}, {"skipped", skipped},
    };
}

std::string to_table(const BenchReport& r) {
    std::string out = fmt::format("model: {} ({}, {}, {})\n", r.model, r.architecture, r.quant, human_bytes(r.model_bytes));
    if (r.n_prompt != r.options.n_prompt || r.n_gen != r.options.n_gen)
        out += fmt::format("note: requested -p {} -n {} exceeds the model's context of {} positions; ran -p {} -n {}\n",
                           r.options.n_prompt, r.options.n_gen, r.context_length, r.n_prompt, r.n_gen);
    out += fmt::format("| {:<16} | {:<28} | {:>12} | {:>12} | {:>9} | {:>8} | {:>8} | {:>11} |\n", "plugin", "device",
                       fmt::format("pp{} t/s", r.n_prompt), fmt::format("tg{} t/s", r.n_gen),
                       "TTFT ms", "ITL p50", "ITL p95", "device mem");
    out += fmt::format("|{:-<18}|{:-<30}|{:->14}|{:->14}|{:->11}|{:->10}|{:->10}|{:->13}|\n", "", "", "", "", "", "", "", "");
    for (const auto& x : r.runs) {
        if (!x.error.empty()) {
            out += fmt::format("| {:<16} | {:<28} | failed: {}\n", x.plugin, x.device_name, x.error);
            continue;
        }
        out += fmt::format("| {:<16} | {:<28} | {:>12.1f} | {:>12.1f} | {:>9.1f} | {:>8.2f} | {:>8.2f} | {:>11} |\n",
                           x.plugin, x.device_name.substr(0, 28), x.prefill_tok_s, x.decode_tok_s, x.ttft_ms,
                           x.itl_p50_ms, x.itl_p95_ms, human_bytes(x.device_bytes));
    }
    for (const auto& [n, w] : r.skipped) out += fmt::format("skipped {}: {}\n", n, w);
    out += fmt::format("(medians of {} repetitions after one warm-up)\n", r.options.reps);
    return out;
}

}  // namespace eh::tools
