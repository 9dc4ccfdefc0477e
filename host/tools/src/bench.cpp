#include "eh/tools/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <engine_host/plugin_abi.hpp>

#include "eh/error.hpp"
#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/descriptor.hpp"
#include "eh/model/model_file.hpp"
#include "eh/service/kv_cache_type.hpp"
#include "eh/service/seq_engine.hpp"

namespace eh::tools {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) { return percentile(std::move(v), 50.0); }

// Ends the run when the caller asked to stop (a signal, for the CLI).
void check_stop(const BenchOptions& o) {
    if (o.stop && o.stop()) throw Error(Code::Cancelled, "bench stopped before it finished");
}

// Sampling both paths use: greedy, so their tokens can be compared.
eh_sampling_params greedy() {
    eh_sampling_params sp = ehp::greedy_sampling();
    sp.seed = 1234;
    return sp;
}

// What one counted repetition measured.
struct RepTimes {
    double prefill_ms = 0, decode_ms = 0;
    std::vector<double> ttft_ms, itl_ms;   // one per sequence; one per decode step
    std::vector<int32_t> tokens;           // sequence 0's
    uint32_t prefill_steps = 0;
};

// Medians and percentiles over the counted repetitions; `batch` sequences of
// p + n tokens each.
void summarize(BenchRun& run, const std::vector<RepTimes>& reps, uint32_t n_prompt, uint32_t n_gen, uint32_t batch) {
    std::vector<double> pp, tg, tg_seq, ttft, itl;
    run.prefill_ms.clear();
    run.decode_ms.clear();
    for (const RepTimes& r : reps) {
        run.prefill_ms.push_back(r.prefill_ms);
        run.decode_ms.push_back(r.decode_ms);
        pp.push_back(r.prefill_ms > 0 ? double(n_prompt) * batch * 1000.0 / r.prefill_ms : 0);
        tg.push_back(r.decode_ms > 0 ? double(n_gen) * batch * 1000.0 / r.decode_ms : 0);
        tg_seq.push_back(r.decode_ms > 0 ? double(n_gen) * 1000.0 / r.decode_ms : 0);
        ttft.insert(ttft.end(), r.ttft_ms.begin(), r.ttft_ms.end());
        itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    }
    run.prefill_tok_s = median(pp);
    run.decode_tok_s = median(tg);
    run.decode_tok_s_per_seq = median(tg_seq);
    run.ttft_ms = median(ttft);
    run.itl_p50_ms = percentile(itl, 50);
    run.itl_p95_ms = percentile(itl, 95);
    if (!reps.empty()) {
        run.tokens = reps.back().tokens;
        run.prefill_steps = reps.back().prefill_steps;
    }
}

void log_rep(const BenchOptions& o, const BenchRun& run, uint32_t rep, const RepTimes& t) {
    if (o.log)
        o.log(fmt::format("{} ({} path) rep {}{}: prefill {:.1f} ms, decode {:.1f} ms", run.plugin, run.path, rep,
                          rep == 0 ? " (warm-up)" : "", t.prefill_ms, t.decode_ms));
}

// The plugin's one-sequence session calls.
std::vector<RepTimes> run_session(EngineModel& model, const BenchOptions& o, BenchRun& run, uint32_t n_vocab) {
    const auto prompt = bench_prompt(o.n_prompt, n_vocab);
    auto session = model.create_session(o.n_prompt + o.n_gen + 1, o.stop);
    session->set_sampling(greedy());
    std::vector<RepTimes> out;
    for (uint32_t rep = 0; rep <= o.reps; ++rep) {  // rep 0 is the warm-up
        check_stop(o);
        RepTimes t;
        session->reset();
        auto t_start = Clock::now();
        session->prefill(prompt);
        t.prefill_ms = ms_since(t_start);
        int32_t tok = session->sample();
        t.ttft_ms.push_back(ms_since(t_start));
        t.tokens.push_back(tok);
        t.itl_ms.reserve(o.n_gen);
        auto t_dec = Clock::now();
        for (uint32_t i = 0; i < o.n_gen; ++i) {
            check_stop(o);
            auto ts = Clock::now();
            tok = session->decode(tok);
            t.itl_ms.push_back(ms_since(ts));
            t.tokens.push_back(tok);
        }
        t.decode_ms = ms_since(t_dec);
        log_rep(o, run, rep, t);
        if (rep > 0) out.push_back(std::move(t));
    }
    return out;
}

// The SeqEngine for --batch N sequences of p + n tokens; throws VRAM_OOM when
// what the plugin grants cannot hold the whole run (a step that found the KV
// cache full would end it halfway with no clear cause). Notes the grant in
// `run`.
std::unique_ptr<service::SeqEngine> step_engine(std::shared_ptr<EngineModel> model, const BenchOptions& o,
                                                BenchRun& run) {
    const uint32_t N = o.batch, P = o.n_prompt, seq_tokens = o.n_prompt + o.n_gen + 1;
    service::KvBudget kb;
    kb.max_seqs = N;
    kb.max_step_tokens = o.batch_tokens;
    kb.max_seq_tokens = seq_tokens;
    kb.budget_bytes = o.kv_budget_bytes;
    kb.kv_type = o.kv_type;
    auto engine = service::make_seq_engine(std::move(model), kb);
    const service::SeqLimits& L = engine->limits();
    if (L.max_seqs < N || L.max_step_entries < N || L.max_step_tokens < N)
        throw Error(Code::VramOom, fmt::format("the plugin grants {} sequences, {} per step and {} tokens a step; "
                                               "--batch {} needs {} of each",
                                               L.max_seqs, L.max_step_entries, L.max_step_tokens, N, N));
    if (L.max_seq_tokens < seq_tokens)
        throw Error(Code::VramOom, fmt::format("the plugin grants sequences of {} tokens; -p {} -n {} needs {}",
                                               L.max_seq_tokens, P, o.n_gen, seq_tokens));
    const uint64_t per_seq = (uint64_t(seq_tokens) + L.block_tokens - 1) / L.block_tokens;
    if (per_seq * N > engine->free_blocks())
        throw Error(Code::VramOom,
                    fmt::format("the KV cache holds {} blocks of {} tokens; {} sequences of {} tokens need {} "
                                "(a smaller --batch, or a larger --kv-cache-size-mb)",
                                engine->free_blocks(), L.block_tokens, N, seq_tokens, per_seq * N));
    run.step_tokens = L.max_step_tokens;
    run.kv_cache_type = service::kv_cache_type_name(L.kv_type);
    run.kv_blocks = L.total_blocks;
    run.chained = o.chained_steps && engine->can_chain();
    run.batch = N;
    return engine;
}

// One repetition on the step path: its sequences (released when it ends,
// also when it throws), prefill and decode steps formed as the scheduler
// forms them, and their times.
class StepRep {
public:
    StepRep(service::SeqEngine& engine, const BenchOptions& o, const std::vector<std::vector<int32_t>>& prompts)
        : e_(engine), L_(engine.limits()), o_(o), prompts_(prompts), N_(uint32_t(prompts.size())), last_(N_, -1) {}
    ~StepRep() {
        for (service::SeqId id : seqs_) e_.release(id);
    }
    StepRep(const StepRep&) = delete;
    StepRep& operator=(const StepRep&) = delete;

    void create(const eh_sampling_params& sp) {
        for (uint32_t i = 0; i < N_; ++i) {
            seqs_.push_back(e_.create());
            e_.set_sampling(seqs_.back(), sp);
        }
    }

    // The scheduler's build_step with no decode yet: sequences in order,
    // each the rest of its prompt or what the step has left.
    void prefill() {
        const uint32_t P = o_.n_prompt;
        std::vector<uint32_t> done(N_, 0);  // prompt tokens in each sequence
        std::vector<service::StepItem> items;
        std::vector<uint32_t> owner;  // items[k] is sequence owner[k]
        const auto t_start = Clock::now();
        for (;;) {
            check_stop(o_);
            items.clear();
            owner.clear();
            uint32_t budget = L_.max_step_tokens;
            for (uint32_t i = 0; i < N_ && budget > 0 && items.size() < L_.max_step_entries; ++i) {
                const uint32_t k = std::min(P - done[i], budget);
                if (k == 0) continue;
                service::StepItem it;
                it.seq = seqs_[i];
                it.tokens = std::span<const int32_t>(prompts_[i]).subspan(done[i], k);
                it.sample = done[i] + k == P;
                items.push_back(it);
                owner.push_back(i);
                budget -= k;
            }
            if (items.empty()) break;
            if (!e_.step(items)) throw Error(Code::VramOom, "the KV cache filled up during prefill");
            ++t.prefill_steps;
            const double now = ms_since(t_start);
            for (size_t k = 0; k < items.size(); ++k) {
                const uint32_t i = owner[k];
                done[i] += uint32_t(items[k].tokens.size());
                if (!items[k].sample) continue;
                last_[i] = items[k].token;
                t.ttft_ms.push_back(now);
                if (i == 0) t.tokens.push_back(last_[i]);
            }
        }
        t.prefill_ms = ms_since(t_start);
    }

    // Every sequence one token a step, in sequence order; chained as the
    // scheduler's run_chain.
    void decode(bool chained) {
        t.itl_ms.reserve(o_.n_gen);
        const auto t_dec = Clock::now();
        t_prev_ = t_dec;
        if (chained) decode_chained();
        else
            for (uint32_t s = 1; s <= o_.n_gen; ++s) {
                check_stop(o_);
                std::vector<service::StepItem> v = decode_items(false);
                if (!e_.step(v)) throw Error(Code::VramOom, "the KV cache filled up during decode");
                read(v);
            }
        t.decode_ms = ms_since(t_dec);
    }

    RepTimes t;

private:
    std::vector<service::StepItem> decode_items(bool chained) const {
        std::vector<service::StepItem> v(N_);
        for (uint32_t i = 0; i < N_; ++i) {
            v[i].seq = seqs_[i];
            v[i].sample = true;
            v[i].chained = chained;
            if (!chained) v[i].tokens = std::span<const int32_t>(&last_[i], 1);
        }
        return v;
    }

    void read(const std::vector<service::StepItem>& v) {
        const auto now = Clock::now();
        t.itl_ms.push_back(std::chrono::duration<double, std::milli>(now - t_prev_).count());
        t_prev_ = now;
        for (uint32_t i = 0; i < N_; ++i) last_[i] = v[i].token;
        t.tokens.push_back(v[0].token);
    }

    // Step s+1 begins (taking the token step s samples, on the device)
    // before step s is read, so the host's turn between tokens overlaps the
    // device's work.
    void decode_chained() {
        std::vector<service::StepItem> cur = decode_items(false), next;
        size_t flying = 0;
        try {
            if (!e_.begin_step(cur)) throw Error(Code::VramOom, "the KV cache filled up during decode");
            flying = 1;
            for (uint32_t s = 1; s <= o_.n_gen; ++s) {
                check_stop(o_);
                if (s < o_.n_gen) {
                    next = decode_items(true);
                    if (!e_.begin_step(next)) throw Error(Code::VramOom, "the KV cache filled up during decode");
                    ++flying;
                }
                e_.end_step(cur);
                --flying;
                read(cur);
                cur = std::move(next);
            }
        } catch (...) {
            // The sequences are released next, which the engine refuses
            // while a step is in flight: end what is, whatever it says.
            std::vector<service::StepItem> scratch(N_);
            for (; flying > 0; --flying) {
                try {
                    e_.end_step(scratch);
                } catch (const std::exception&) {
                }
            }
            throw;
        }
    }

    service::SeqEngine& e_;
    const service::SeqLimits& L_;
    const BenchOptions& o_;
    const std::vector<std::vector<int32_t>>& prompts_;
    const uint32_t N_;
    std::vector<service::SeqId> seqs_;
    std::vector<int32_t> last_;  // each sequence's latest token, fed to the next step
    Clock::time_point t_prev_;
};

// The batched step through the SeqEngine the server drives, steps formed as
// the scheduler forms them (see bench.hpp for where they differ).
std::vector<RepTimes> run_steps(std::shared_ptr<EngineModel> model, const BenchOptions& o, BenchRun& run,
                                uint32_t n_vocab) {
    auto engine = step_engine(std::move(model), o, run);
    std::vector<std::vector<int32_t>> prompts;
    for (uint32_t i = 0; i < o.batch; ++i) prompts.push_back(bench_prompt(o.n_prompt, n_vocab, i));
    const eh_sampling_params sp = greedy();

    std::vector<RepTimes> out;
    for (uint32_t rep = 0; rep <= o.reps; ++rep) {  // rep 0 is the warm-up
        check_stop(o);
        StepRep r(*engine, o, prompts);
        r.create(sp);
        r.prefill();
        r.decode(run.chained);
        log_rep(o, run, rep, r.t);
        if (rep > 0) out.push_back(std::move(r.t));
    }
    return out;
}

// `o` carries the numbers actually run (already fitted to the context).
BenchRun bench_one(const PluginRecord& rec, const std::shared_ptr<model::ModelFile>& mf, const BenchOptions& o) {
    BenchRun run;
    run.plugin = rec.caps.name;
    run.plugin_version = rec.caps.version;
    run.engine = rec.caps.engine;
    run.device_kind = rec.caps.device_kind;
    run.path = path_name(o.path);
    if (rec.probe) run.device_name = rec.probe->device_name;
    try {
        EngineLoadOptions lo;
        lo.device = o.devices.empty() ? o.device : o.devices[0];
        if (o.devices.size() > 1) lo.devices = o.devices;
        lo.n_threads = o.threads;
        lo.options_json = o.engine_options;
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
        BenchPath path = o.path;
        if (path == BenchPath::Step && !loader::api_has_step(model->api())) {
            if (o.kv_type)
                throw Error(Code::ModelLoadFailed, "the plugin has no batched step (ABI < 1.2): its session cache keeps "
                                                   "its own type, so --kv-cache-type cannot be asked of it");
            path = BenchPath::Session;
            run.path_note = o.batch > 1 ? "the plugin has no batched step (ABI < 1.2): ran its session path, one sequence"
                                        : "the plugin has no batched step (ABI < 1.2): ran its session path";
            if (o.log) o.log(fmt::format("{}: {}", run.plugin, run.path_note));
        }
        run.path = path_name(path);
        std::vector<RepTimes> reps;
        if (path == BenchPath::Step) {
            reps = run_steps(model, o, run, n_vocab);
        } else {
            run.batch = 1;
            reps = run_session(*model, o, run, n_vocab);
        }
        summarize(run, reps, o.n_prompt, o.n_gen, run.batch);
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

const char* path_name(BenchPath p) { return p == BenchPath::Session ? "session" : "step"; }

BenchPath parse_bench_path(const std::string& s) {
    if (s == "step") return BenchPath::Step;
    if (s == "session") return BenchPath::Session;
    throw Error(Code::InvalidRequest, fmt::format("bench: --path must be step or session, not '{}'", s));
}

std::vector<int32_t> bench_prompt(uint32_t n, uint32_t n_vocab, uint32_t seq) {
    std::vector<int32_t> out(n);
    // A stride coprime with any vocab size we meet walks the whole range
    // without landing on one id twice in a short prompt; each sequence
    // starts the walk elsewhere (104729, a prime, keeps the starts apart).
    uint64_t x = (1000 + uint64_t(seq) * 104729) % n_vocab;
    for (uint32_t i = 0; i < n; ++i) {
        out[i] = static_cast<int32_t>(x);
        x = (x + 7919) % n_vocab;
    }
    return out;
}

BenchReport run_bench(const BenchOptions& o) {
    if (o.n_prompt == 0 || o.n_gen == 0 || o.reps == 0)
        throw Error(Code::InvalidRequest, "bench: -p, -n and -r must be at least 1");
    if (o.batch < 1 || o.batch > 4096) throw Error(Code::InvalidRequest, "bench: --batch must be between 1 and 4096");
    // serve's range for its --batch-tokens
    if (o.batch_tokens < 16 || o.batch_tokens > 65536)
        throw Error(Code::InvalidRequest, "bench: --batch-tokens must be between 16 and 65536");
    // A decode step holds one token of every sequence.
    if (o.batch > o.batch_tokens)
        throw Error(Code::InvalidRequest, fmt::format("bench: --batch {} exceeds --batch-tokens {}: a decode step holds "
                                                      "a token of every sequence", o.batch, o.batch_tokens));
    if (o.path == BenchPath::Session && o.batch != 1)
        throw Error(Code::InvalidRequest, "bench: the session path runs one sequence: --batch must be 1");
    if (o.path == BenchPath::Session && o.kv_type)
        throw Error(Code::InvalidRequest, "bench: --kv-cache-type is the step path's (the session calls take no KV type)");
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
    lo.device = o.devices.empty() ? o.device : o.devices[0];
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
            {"path", x.path},
        };
        if (!x.path_note.empty()) j["path_note"] = x.path_note;
        if (!x.error.empty()) {
            j["error"] = x.error;
        } else {
            j["batch"] = x.batch;
            if (x.path == "step") {
                j["step_tokens"] = x.step_tokens;
                j["kv_cache_type"] = x.kv_cache_type;
                j["kv_blocks"] = x.kv_blocks;
                j["chained"] = x.chained;
                j["prefill_steps"] = x.prefill_steps;
            }
            // Tokens a repetition computes, every sequence's: what the rates count.
            j["prefill_tokens"] = uint64_t(r.n_prompt) * x.batch;
            j["decode_tokens"] = uint64_t(r.n_gen) * x.batch;
            j["load_ms"] = x.load_ms;
            // The model file's bytes over the plugin's load call (page cache
            // unless the file was cold): the "load >= 5 GB/s" goal.
            j["load_gb_per_s"] = x.load_ms > 0 ? double(r.model_bytes) / (x.load_ms * 1e6) : 0.0;
            j["prefill_tokens_per_s"] = x.prefill_tok_s;
            j["decode_tokens_per_s"] = x.decode_tok_s;
            j["decode_tokens_per_s_per_seq"] = x.decode_tok_s_per_seq;
            j["ttft_ms"] = x.ttft_ms;
            j["itl_p50_ms"] = x.itl_p50_ms;
            j["itl_p95_ms"] = x.itl_p95_ms;
            j["peak_device_bytes"] = x.device_bytes;
            j["host_bytes"] = x.host_bytes;
            j["prefill_ms"] = x.prefill_ms;
            j["decode_ms"] = x.decode_ms;
            j["tokens"] = x.tokens;
        }
        runs.push_back(std::move(j));
    }
    nlohmann::json skipped = nlohmann::json::array();
    for (const auto& [n, w] : r.skipped) skipped.push_back({{"plugin", n}, {"reason", w}});
    return {
        {"model", r.model}, {"architecture", r.architecture}, {"quant", r.quant},
        {"model_bytes", r.model_bytes}, {"n_vocab", r.n_vocab},
        {"path", path_name(r.options.path)}, {"batch", r.options.batch}, {"batch_tokens", r.options.batch_tokens},
        {"n_prompt", r.n_prompt}, {"n_gen", r.n_gen}, {"reps", r.options.reps},
        {"gpus", r.options.devices.empty() ? nlohmann::json::array({r.options.device}) : nlohmann::json(r.options.devices)},
        {"n_prompt_requested", r.options.n_prompt}, {"n_gen_requested", r.options.n_gen},
        {"context_length", r.context_length},
        {"capped", r.n_prompt != r.options.n_prompt || r.n_gen != r.options.n_gen},
        {"results", runs}, {"skipped", skipped},
    };
}

std::string to_table(const BenchReport& r) {
    std::string out = fmt::format("model: {} ({}, {}, {})\n", r.model, r.architecture, r.quant, human_bytes(r.model_bytes));
    if (r.options.path == BenchPath::Step)
        out += fmt::format("path: step (the server's batched step), batch {}, batch-tokens {}\n", r.options.batch,
                           r.options.batch_tokens);
    else
        out += "path: session (the plugin's one-sequence session calls)\n";
    if (r.n_prompt != r.options.n_prompt || r.n_gen != r.options.n_gen)
        out += fmt::format("note: requested -p {} -n {} exceeds the model's context of {} positions; ran -p {} -n {}\n",
                           r.options.n_prompt, r.options.n_gen, r.context_length, r.n_prompt, r.n_gen);
    // With several sequences the pp/tg columns add every sequence's tokens;
    // tg/seq is what one of them sees.
    const bool many = r.options.batch > 1;
    out += fmt::format("| {:<16} | {:<7} | {:<28} | {:>12} | {:>12} |{} {:>9} | {:>8} | {:>8} | {:>11} |\n", "plugin",
                       "path", "device", fmt::format("pp{} t/s", r.n_prompt), fmt::format("tg{} t/s", r.n_gen),
                       many ? fmt::format(" {:>10} |", "tg/seq t/s") : "", "TTFT ms", "ITL p50", "ITL p95",
                       "device mem");
    out += fmt::format("|{:-<18}|{:-<9}|{:-<30}|{:->14}|{:->14}|{}{:->11}|{:->10}|{:->10}|{:->13}|\n", "", "", "", "",
                       "", many ? fmt::format("{:->12}|", "") : "", "", "", "", "");
    for (const auto& x : r.runs) {
        if (!x.error.empty()) {
            out += fmt::format("| {:<16} | {:<7} | {:<28} | failed: {}\n", x.plugin, x.path, x.device_name, x.error);
            continue;
        }
        out += fmt::format("| {:<16} | {:<7} | {:<28} | {:>12.1f} | {:>12.1f} |{} {:>9.1f} | {:>8.2f} | {:>8.2f} | {:>11} |\n",
                           x.plugin, x.path, x.device_name.substr(0, 28), x.prefill_tok_s, x.decode_tok_s,
                           many ? fmt::format(" {:>10.1f} |", x.decode_tok_s_per_seq) : "", x.ttft_ms, x.itl_p50_ms,
                           x.itl_p95_ms, human_bytes(x.device_bytes));
    }
    for (const auto& x : r.runs)
        if (!x.path_note.empty()) out += fmt::format("note {}: {}\n", x.plugin, x.path_note);
    for (const auto& [n, w] : r.skipped) out += fmt::format("skipped {}: {}\n", n, w);
    out += fmt::format("(medians of {} repetitions after one warm-up)\n", r.options.reps);
    return out;
}

}  // namespace eh::tools
