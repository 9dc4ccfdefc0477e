// Real-world JSON-schema coverage: compiles every schema in a set of folders
// the way a request's response_format does (json_schema_grammar on the JSON
// text, then the matcher's start state), and reports per folder (a "source")
// how many are accepted, the most common refusals (by keyword and message,
// with paths left out), and the compile times (issue 51's < 50 ms goal).
// The schemas are collected by whoever runs it; none ship with the project.
// With --samples N FILE, each accepted schema's matcher is also walked N
// times at random to a complete value (the way a sampler that picks any
// allowed byte would), and the values are written to FILE as JSON lines
// {"schema": path, "instance": text} for an independent validator
// (tests/constrain/validate_samples.py).
//   eh-schema-coverage /tmp/schemas            (each subfolder a source)
//   eh-schema-coverage --list /tmp/schemas     (also one line per schema)
//   eh-schema-coverage --list --raw /tmp/schemas  (… with the whole refusal message)
//   eh-schema-coverage --samples 20 /tmp/samples.jsonl /tmp/schemas
//   eh-schema-coverage --repeat 7 /tmp/schemas  (compile times: the fastest of
//                                                7, less disturbed by other load)
//   eh-schema-coverage --help                  (exit 0; bad arguments or a DIR
//                                               that is not a folder: exit 2)
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "eh/constrain/automaton.hpp"
#include "eh/constrain/grammar.hpp"
#include "eh/error.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// This thread's CPU time in ms: a compile's own cost, which other load on
// the machine does not stretch as it stretches the wall time.
double thread_cpu_ms() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

std::shared_ptr<const eh::constrain::TokenVocab> byte_vocab() {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
    bytes.emplace_back();
    return std::make_shared<const eh::constrain::TokenVocab>(std::move(bytes), std::vector<int32_t>{256});
}

// A refusal's message without what varies per schema: quoted paths and
// names become '…', numbers stay (they are mostly limits).
std::string reason_of(const std::string& keyword, const std::string& message) {
    std::string out = keyword.empty() ? "" : "[" + keyword + "] ";
    bool quoted = false;
    for (char c : message) {
        if (c == '\'') {
            quoted = !quoted;
            out += quoted ? "'…" : "'";
            continue;
        }
        if (!quoted) out += c;
    }
    // Keep the keyword visible: "the JSON-schema keyword '…'" says nothing.
    return out.substr(0, 140);
}

// A random complete value: allowed bytes picked at random, leaning to
// closing characters and to ending once the value may end. "" when the walk
// runs past `limit` bytes without ending.
std::string random_value(const std::shared_ptr<eh::constrain::Automaton>& a, std::mt19937& rng, size_t limit) {
    eh::constrain::Matcher m(a);
    std::string out;
    std::uniform_real_distribution<double> u(0, 1);
    while (out.size() < limit) {
        const auto mask = m.mask();
        auto allowed = [&](int id) { return ((*mask)[size_t(id) / 32] >> (id % 32)) & 1u; };
        if (allowed(256) && (m.complete() || u(rng) < 0.3 + double(out.size()) / double(limit))) return out;
        std::vector<int> bytes, closing;
        for (int b = 0; b < 256; ++b)
            if (allowed(b)) {
                bytes.push_back(b);
                if (b == '"' || b == '}' || b == ']') closing.push_back(b);
            }
        if (bytes.empty()) return "";
        const auto& from = !closing.empty() && u(rng) < 0.35 ? closing : bytes;
        const int b = from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
        out += char(b);
        if (!m.accept(b)) return "";
    }
    return "";
}

struct Result {
    std::string file;
    bool accepted = false;
    std::string reason;
    std::string message;  // the refusal as the client would read it (--list --raw)
    double ms = 0;      // wall time (the fastest of --repeat)
    double cpu_ms = 0;  // thread CPU time (the least of --repeat)
    size_t bytes = 0;
};

constexpr const char* kUsage =
    "usage: eh-schema-coverage [--list [--raw]] [--samples N FILE] [--repeat N] DIR...\n"
    "Compiles every *.json schema under each DIR as response_format does and prints, per source\n"
    "(a DIR's subfolder), how many are accepted, the refusals by reason and the slowest compiles.\n"
    "  --list          also one line per schema: ok/REFUSED, path, ms, reason\n"
    "  --raw           with --list: the whole refusal message\n"
    "  --samples N FILE  walk each accepted schema's matcher to N random complete values, written\n"
    "                  to FILE as JSON lines {\"schema\", \"instance\"} (tests/constrain/validate_samples.py)\n"
    "  --repeat N      compile each accepted schema N times; report the fastest (1 to 1000)\n"
    "  -h, --help      this text\n"
    "Exit status: 0 done, 2 bad arguments or a DIR that is not a readable folder.\n";

int usage_error(const std::string& what) {
    std::fprintf(stderr, "eh-schema-coverage: %s\n%s", what.c_str(), kUsage);
    return 2;
}

// A whole decimal number in [lo, hi], or nullopt.
std::optional<int> count_arg(const char* text, int lo, int hi) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) return std::nullopt;
    return int(v);
}

// The command line.
struct Options {
    bool list = false, raw = false;
    int samples = 0, repeat = 1;
    std::ofstream sample_out;
    std::vector<fs::path> roots;
};

// Reads the command line into o; an exit code when it is done (help, or a
// usage error), else nothing.
std::optional<int> parse(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--list") {
            o.list = true;
        } else if (a == "--raw") {
            o.raw = true;
        } else if (a == "--repeat") {
            const auto n = i + 1 < argc ? count_arg(argv[++i], 1, 1000) : std::nullopt;
            if (!n) return usage_error("--repeat takes a count from 1 to 1000");
            o.repeat = *n;
        } else if (a == "--samples") {
            const auto n = i + 2 < argc ? count_arg(argv[i + 1], 1, 100000) : std::nullopt;
            if (!n) return usage_error("--samples takes a count from 1 to 100000 and a file");
            o.samples = *n;
            o.sample_out.open(argv[i + 2]);
            if (!o.sample_out) return usage_error(std::string("cannot write '") + argv[i + 2] + "'");
            i += 2;
        } else if (a.size() > 1 && a[0] == '-') {
            return usage_error("unknown option '" + a + "'");
        } else {
            std::error_code ec;
            if (!fs::is_directory(a, ec)) return usage_error("'" + a + "' is not a folder");
            o.roots.emplace_back(a);
        }
    }
    if (o.roots.empty()) return usage_error("no DIR given");
    return std::nullopt;
}

// One schema compiled as response_format does (the fastest of `repeat`
// compiles); its automaton when accepted.
Result compile(const std::string& text, int repeat, const std::shared_ptr<const eh::constrain::TokenVocab>& vocab,
               std::shared_ptr<eh::constrain::Automaton>& automaton) {
    Result r;
    r.bytes = text.size();
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_ms();
    try {
        auto g = eh::constrain::json_schema_grammar(text);
        automaton = std::make_shared<eh::constrain::Automaton>(std::move(g), vocab);
        r.accepted = true;
    } catch (const eh::constrain::GrammarError& e) {
        r.reason = reason_of(e.keyword(), e.what());
        r.message = e.what();
    } catch (const std::exception& e) {
        r.reason = reason_of("", e.what());
        r.message = e.what();
    }
    r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    r.cpu_ms = thread_cpu_ms() - c0;
    for (int k = 1; r.accepted && k < repeat; ++k) {
        const auto t1 = Clock::now();
        const double c1 = thread_cpu_ms();
        // (measured before `again` is freed, as the first compile is)
        const auto again = std::make_shared<eh::constrain::Automaton>(eh::constrain::json_schema_grammar(text), vocab);
        r.cpu_ms = std::min(r.cpu_ms, thread_cpu_ms() - c1);
        r.ms = std::min(r.ms, std::chrono::duration<double, std::milli>(Clock::now() - t1).count());
    }
    return r;
}

// Every *.json under root, sorted; false (said on stderr) when the folder
// cannot be read.
bool schema_files(const fs::path& root, std::vector<fs::path>& files) {
    std::error_code ec;
    for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
        if (std::error_code ignored; it->is_regular_file(ignored) && it->path().extension() == ".json")
            files.push_back(it->path());  // (a dangling link is no schema)
    if (ec) {
        std::fprintf(stderr, "eh-schema-coverage: cannot read '%s': %s\n", root.c_str(), ec.message().c_str());
        return false;
    }
    std::sort(files.begin(), files.end());
    return true;
}

// The tables: per source, the refusals by reason, the slowest compiles, the
// random walks, and with --list every schema.
void print_report(const std::map<std::string, std::vector<Result>>& by_source, const Options& o, size_t walks,
                  size_t ended) {
    std::map<std::string, int> reasons;
    std::vector<const Result*> all;
    int total = 0, accepted = 0;
    std::printf("| source | schemas | accepted | %% |\n|---|---|---|---|\n");
    for (const auto& [source, results] : by_source) {
        int ok = 0;
        for (const auto& r : results) {
            ok += r.accepted;
            if (!r.accepted) ++reasons[r.reason];
            all.push_back(&r);
        }
        total += int(results.size());
        accepted += ok;
        std::printf("| %s | %zu | %d | %.0f %% |\n", source.c_str(), results.size(), ok,
                    100.0 * ok / double(results.size()));
    }
    std::printf("| all | %d | %d | %.0f %% |\n\n", total, accepted, total ? 100.0 * accepted / total : 0.0);
    std::vector<std::pair<int, std::string>> top;
    for (const auto& [r, n] : reasons) top.emplace_back(n, r);
    std::sort(top.rbegin(), top.rend());
    std::printf("refusals by reason:\n");
    for (const auto& [n, r] : top) std::printf("%4d  %s\n", n, r.c_str());
    std::sort(all.begin(), all.end(), [](const Result* a, const Result* b) { return a->ms > b->ms; });
    std::printf("\nslowest compiles (ms wall, ms thread CPU, bytes, accepted):\n");
    for (size_t i = 0; i < std::min<size_t>(10, all.size()); ++i)
        std::printf("%8.2f  %8.2f  %8zu  %s  %s\n", all[i]->ms, all[i]->cpu_ms, all[i]->bytes,
                    all[i]->accepted ? "yes" : "no ", all[i]->file.c_str());
    if (o.samples) std::printf("\nrandom walks: %zu, ended with a complete value: %zu\n", walks, ended);
    if (o.list)
        for (const auto& [source, results] : by_source)
            for (const auto& r : results)
                std::printf("%s\t%s\t%.2f\t%s\n", r.accepted ? "ok" : "REFUSED", r.file.c_str(), r.ms,
                            (o.raw ? r.message : r.reason).c_str());
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    if (const auto done = parse(argc, argv, o)) return *done;
    std::mt19937 rng(51);
    size_t walks = 0, ended = 0;
    const auto vocab = byte_vocab();
    std::map<std::string, std::vector<Result>> by_source;
    for (const auto& root : o.roots) {
        std::vector<fs::path> files;
        if (!schema_files(root, files)) return 2;
        for (const auto& f : files) {
            std::ifstream in(f, std::ios::binary);
            std::stringstream ss;
            ss << in.rdbuf();
            const fs::path rel = fs::relative(f, root);
            const std::string source = rel.has_parent_path() ? rel.begin()->string() : root.filename().string();
            std::shared_ptr<eh::constrain::Automaton> automaton;
            Result r = compile(ss.str(), o.repeat, vocab, automaton);
            r.file = rel.string();
            for (int k = 0; automaton && k < o.samples; ++k) {
                ++walks;
                std::string v;
                try {
                    v = random_value(automaton, rng, 3000);
                } catch (const std::exception&) {
                    continue;  // a matcher limit (docs/http-api.md); the value is not written
                }
                if (v.empty()) continue;
                ++ended;
                o.sample_out << nlohmann::json{{"schema", f.string()}, {"instance", v}}.dump() << "\n";
            }
            by_source[source].push_back(std::move(r));
        }
    }
    print_report(by_source, o, walks, ended);
    return 0;
}
